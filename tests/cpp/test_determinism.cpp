// Bitwise determinism (docs/CONTRACT.md "Backward"): the same inputs give the same bytes in every output
// and gradient, run after run, on the CPU whatever the number of threads, and on the GPU with
// or without programmatic dependent launch, and with or without TMA copies. Whole buffers are
// compared, padding included.
#include <gtest/gtest.h>

#include "attention_case.h"
#include "scoped_env.h"

#ifdef EVOATTN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace evoattn::test {
namespace {

std::vector<Case> determinism_cases() {
  std::vector<Case> cases;
  for (evoattn_dtype_t dt : {EVOATTN_FLOAT32, EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) {
    cases.push_back(
        shape(2, 3, 2, 97, 70, 32, dt).biases("bn11k", "b1hqk").grads(true, true).with_mask("bnk"));
  }
  // N = 1, B N H < 256: dQ read back from the dS the dK/dV kernel stored into the pair-bias
  // gradient (LaunchPlan::dkdv_ds_slots).
  cases.push_back(shape(2, 1, 2, 100, 136, 24, EVOATTN_BFLOAT16).biases("bn11k", "b1hqk").grads(true, true));
  // B N H >= 256: dQ from the dK/dV kernel, summed over key tiles in the workspace.
  cases.push_back(shape(1, 64, 4, 97, 136, 32, EVOATTN_BFLOAT16).biases("bn11k", "b1hqk").grads(true, true));
  // Four key tiles: the dK/dV kernel with warps of 32 keys (launch_plan.h, dkdv_wide_keys).
  cases.push_back(shape(1, 64, 4, 97, 200, 32, EVOATTN_BFLOAT16).biases("bn11k", "b1hqk").grads(true, true));
  // Head dim 64, four key tiles: the pair-bias gradient (chunked) in blocks of two key tiles;
  // at Lq = 40 (on an H100) the 16-key dK/dV kernel, its running dQ in shared memory, and at
  // Lq = 130 the dK/dV kernel in blocks of two key tiles computing Delta
  // (LaunchPlan::delta_in_dkdv).
  cases.push_back(shape(1, 32, 8, 40, 256, 64, EVOATTN_BFLOAT16).biases("bn11k", "b1hqk").grads(true, true));
  cases.push_back(shape(1, 32, 8, 130, 256, 64, EVOATTN_BFLOAT16).biases("bn11k", "b1hqk").grads(true, true));
  // The wide-warp head-dim-64 forward (TMA copies on sm_90) with partial query and key tiles, at
  // D = 64 and 48 (boxes past the tensor's edges: zero-filled loads, clipped stores).
  cases.push_back(shape(1, 5, 2, 70, 136, 64, EVOATTN_FLOAT16).biases("bn11k", "b1hqk").grads(true, true));
  cases.push_back(shape(1, 6, 2, 100, 72, 48, EVOATTN_BFLOAT16).biases("bn11k", "b1hqk").grads(true, true));
  // The same without a pair bias: the dK/dV kernel compiled without tile-bias code.
  cases.push_back(shape(1, 64, 4, 97, 136, 32, EVOATTN_BFLOAT16).biases("bn11k", "").grads(true, false));
  cases.push_back(shape(3, 2, 2, 40, 130, 24, EVOATTN_FLOAT32)
                      .biases("1nhq1", "bnhqk")
                      .grads(true, true)
                      .layouts(Layout::kHeadMajor, Layout::kPadded));
  return cases;
}

struct Outputs {
  ForwardRun fwd;
  BackwardRun bwd;
};

Outputs run_both(const Case& c, const Inputs& in, const evoattn_options_t* options) {
  Outputs out{run_forward(c, in, options), {}};
  EXPECT_EQ(out.fwd.status, EVOATTN_SUCCESS) << out.fwd.error;
  out.bwd = run_backward(c, in, out.fwd, options);
  EXPECT_EQ(out.bwd.status, EVOATTN_SUCCESS) << out.bwd.error;
  return out;
}

void expect_same_bytes(const Outputs& a, const Outputs& b, const std::string& what) {
  EXPECT_TRUE(same_bytes(a.fwd.o, b.fwd.o)) << "o differs: " << what;
  EXPECT_TRUE(same_bytes(a.fwd.lse, b.fwd.lse)) << "lse differs: " << what;
  EXPECT_TRUE(same_bytes(a.bwd.dq, b.bwd.dq)) << "dq differs: " << what;
  EXPECT_TRUE(same_bytes(a.bwd.dk, b.bwd.dk)) << "dk differs: " << what;
  EXPECT_TRUE(same_bytes(a.bwd.dv, b.bwd.dv)) << "dv differs: " << what;
  EXPECT_TRUE(same_bytes(a.bwd.d_mask_bias, b.bwd.d_mask_bias)) << "d_mask_bias differs: " << what;
  EXPECT_TRUE(same_bytes(a.bwd.d_pair_bias, b.bwd.d_pair_bias)) << "d_pair_bias differs: " << what;
}

// Whether this GPU has programmatic dependent launch and TMA (sm_90 and later).
bool gpu_has_dependent_launch() {
#ifdef EVOATTN_WITH_CUDA
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
#else
  return false;
#endif
}

class Determinism : public ::testing::TestWithParam<Case> {};

TEST_P(Determinism, RepeatedRunsGiveIdenticalBytes) {
  const Case& c = GetParam();
  if (backend_missing(c.backend)) GTEST_SKIP() << kNoCudaMessage;
  const Inputs in = make_inputs(c);
  const evoattn_options_t options = case_options(c);
  const Outputs first = run_both(c, in, &options);
  expect_same_bytes(first, run_both(c, in, &options), "second run");
}

TEST_P(Determinism, ThreadCountDoesNotChangeBytes) {
  const Case& c = GetParam();
  if (backend_missing(c.backend)) GTEST_SKIP() << kNoCudaMessage;
  const Inputs in = make_inputs(c);
  evoattn_options_t options = case_options(c);
  const Outputs all_threads = run_both(c, in, &options);
  for (int threads : {1, 2, 3}) {
    options.num_threads = threads;
    expect_same_bytes(all_threads, run_both(c, in, &options),
                      "num_threads " + std::to_string(threads) + " vs 0");
  }
}

// The kernels overlap their neighbours on the stream under programmatic dependent launch
// (src/cuda/kernel_launch.h; sm_90 and later): the bytes are those of launches one after
// another.
TEST_P(Determinism, DependentLaunchDoesNotChangeBytes) {
  const Case& c = GetParam();
  if (backend_missing(c.backend)) GTEST_SKIP() << kNoCudaMessage;
  if (c.backend != Backend::kCuda) GTEST_SKIP() << "kernel launches: CUDA only";
  if (!gpu_has_dependent_launch()) GTEST_SKIP() << "no programmatic dependent launch before sm_90";
  const Inputs in = make_inputs(c);
  const evoattn_options_t options = case_options(c);
  const Outputs overlapped = run_both(c, in, &options);
  const ScopedEnv serial("EVOATTN_DISABLE_PDL", "1");
  expect_same_bytes(overlapped, run_both(c, in, &options), "EVOATTN_DISABLE_PDL=1");
}

// The head-dim-64 wide-warp forward copies by TMA on sm_90 and later (src/cuda/tma_maps.h);
// the cp.async kernel it replaces computes the same bytes.
TEST_P(Determinism, TmaCopiesDoNotChangeBytes) {
  const Case& c = GetParam();
  if (backend_missing(c.backend)) GTEST_SKIP() << kNoCudaMessage;
  if (c.backend != Backend::kCuda) GTEST_SKIP() << "kernel copies: CUDA only";
  if (!gpu_has_dependent_launch()) GTEST_SKIP() << "no TMA before sm_90";
  const Inputs in = make_inputs(c);
  const evoattn_options_t options = case_options(c);
  const Outputs tma = run_both(c, in, &options);
  const ScopedEnv cp_async("EVOATTN_DISABLE_TMA", "1");
  expect_same_bytes(tma, run_both(c, in, &options), "EVOATTN_DISABLE_TMA=1");
}

TEST_P(Determinism, NullOptionsAreTheDefaults) {
  const Case& c = GetParam();
  if (backend_missing(c.backend)) GTEST_SKIP() << kNoCudaMessage;
  const Inputs in = make_inputs(c);
  const evoattn_options_t defaults = case_options(c);
  expect_same_bytes(run_both(c, in, &defaults), run_both(c, in, nullptr), "options NULL");
}

INSTANTIATE_TEST_SUITE_P(Runs, Determinism,
                         ::testing::ValuesIn(on_backends(determinism_cases(), 600)), case_name);

}  // namespace
}  // namespace evoattn::test
