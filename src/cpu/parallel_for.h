// Runs fn(task) for task in [0, num_tasks) on up to `num_threads` threads (0 = hardware
// concurrency). Tasks must write disjoint outputs; results then never depend on which thread
// ran a task, so the CPU backend is bitwise deterministic for any thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace evoattn {

void parallel_for(int64_t num_tasks, int num_threads, const std::function<void(int64_t)>& fn);

}  // namespace evoattn
