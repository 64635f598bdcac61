#include "cpu/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace evoattn {

void parallel_for(int64_t num_tasks, int num_threads, const std::function<void(int64_t)>& fn) {
  if (num_tasks <= 0) return;
  int threads = num_threads > 0 ? num_threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = static_cast<int>(std::min<int64_t>(std::max(threads, 1), num_tasks));
  if (threads == 1) {
    for (int64_t t = 0; t < num_tasks; ++t) fn(t);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    try {
      for (int64_t t = next++; t < num_tasks; t = next++) fn(t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = num_tasks;  // stop handing out work
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int i = 0; i < threads - 1; ++i) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace evoattn
