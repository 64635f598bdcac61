// The C API is thread-safe (docs/CONTRACT.md): independent problems run concurrently from several host
// threads give the bytes the same calls give one after another, and each thread keeps its own
// last-error message.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "attention_case.h"

namespace evoattn::test {
namespace {

constexpr int kThreads = 4;

class Threads : public ::testing::TestWithParam<Backend> {};

TEST_P(Threads, ConcurrentCallsMatchSequentialBytes) {
  if (backend_missing(GetParam())) GTEST_SKIP() << kNoCudaMessage;
  const evoattn_dtype_t dtypes[] = {EVOATTN_FLOAT32, EVOATTN_FLOAT16, EVOATTN_BFLOAT16};
  std::vector<Case> cases;
  std::vector<Inputs> inputs;
  for (int t = 0; t < kThreads; ++t) {
    Case c =
        shape(2, 2, 2, 33 + t, 47, 32, dtypes[t % 3]).biases("bn11k", "b1hqk").grads(true, true);
    c.backend = GetParam();
    c.seed = 700 + t;
    cases.push_back(c);
    inputs.push_back(make_inputs(c));
  }
  const evoattn_options_t options = case_options(cases[0]);
  std::vector<ForwardRun> seq_fwd, par_fwd(kThreads);
  std::vector<BackwardRun> seq_bwd, par_bwd(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    seq_fwd.push_back(run_forward(cases[t], inputs[t], &options));
    ASSERT_EQ(seq_fwd[t].status, EVOATTN_SUCCESS) << seq_fwd[t].error;
    seq_bwd.push_back(run_backward(cases[t], inputs[t], seq_fwd[t], &options));
    ASSERT_EQ(seq_bwd[t].status, EVOATTN_SUCCESS) << seq_bwd[t].error;
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&, t] {
      par_fwd[t] = run_forward(cases[t], inputs[t], &options);
      par_bwd[t] = run_backward(cases[t], inputs[t], seq_fwd[t], &options);
    });
  }
  for (std::thread& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t) {
    SCOPED_TRACE(cases[t].name());
    ASSERT_EQ(par_fwd[t].status, EVOATTN_SUCCESS) << par_fwd[t].error;
    ASSERT_EQ(par_bwd[t].status, EVOATTN_SUCCESS) << par_bwd[t].error;
    EXPECT_TRUE(same_bytes(par_fwd[t].o, seq_fwd[t].o));
    EXPECT_TRUE(same_bytes(par_fwd[t].lse, seq_fwd[t].lse));
    EXPECT_TRUE(same_bytes(par_bwd[t].dq, seq_bwd[t].dq));
    EXPECT_TRUE(same_bytes(par_bwd[t].dk, seq_bwd[t].dk));
    EXPECT_TRUE(same_bytes(par_bwd[t].dv, seq_bwd[t].dv));
    EXPECT_TRUE(same_bytes(par_bwd[t].d_mask_bias, seq_bwd[t].d_mask_bias));
    EXPECT_TRUE(same_bytes(par_bwd[t].d_pair_bias, seq_bwd[t].d_pair_bias));
  }
}

// A failure on one thread leaves another thread's last error alone.
TEST(ThreadsLastError, IsPerThread) {
  size_t bytes = 0;
  ASSERT_EQ(evoattn_backward_workspace_size(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                            nullptr, nullptr, nullptr, &bytes),
            EVOATTN_ERROR_INVALID_ARGUMENT);
  const std::string mine = evoattn_last_error();
  ASSERT_FALSE(mine.empty());
  std::string other;
  std::thread([&] { other = evoattn_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_EQ(mine, evoattn_last_error());
}

INSTANTIATE_TEST_SUITE_P(Backends, Threads, ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return std::string(info.param == Backend::kCpu ? "cpu" : "cuda");
                         });

}  // namespace
}  // namespace evoattn::test
