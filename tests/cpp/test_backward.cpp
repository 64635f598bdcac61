// Backward against the float64 reference gradients over the size grid (every L and D value
// for each dtype), with both bias gradients, one, or none requested. With Lk = 1, dS is
// identically 0: dq, dk and the bias gradients are then checked to vanish (attention_case.cpp).
#include <string>

#include <gtest/gtest.h>

#include "attention_case.h"
#include "scoped_env.h"

namespace evoattn::test {
namespace {

std::vector<Case> grid() {
  std::vector<Case> cases;
  for (evoattn_dtype_t dt : {EVOATTN_FLOAT32, EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) {
    cases.push_back(shape(2, 3, 2, 1, 17, 32, dt));
    cases.push_back(shape(2, 3, 2, 17, 1, 32, dt).biases("bn11k", "b1hqk").grads(true, true));
    cases.push_back(shape(2, 2, 3, 2, 2, 1, dt).biases("bn11k", "").grads(true, false));
    cases.push_back(shape(3, 2, 2, 17, 17, 8, dt).biases("", "b1hqk").grads(false, true));
    cases.push_back(shape(2, 1, 2, 97, 97, 16, dt).biases("bn11k", "b1hqk").grads(true, true));
    cases.push_back(shape(2, 1, 1, 257, 257, 24, dt).biases("bn11k", "b1hqk").grads(true, true));
    cases.push_back(shape(2, 2, 1, 17, 97, 40, dt).biases("bn11k", "b1hqk").grads(true, true));
    cases.push_back(shape(2, 1, 3, 97, 17, 64, dt).biases("bn11k", "b1hqk").grads(false, true));
    cases.push_back(shape(2, 1, 1, 2, 257, 96, dt).biases("bn11k", "b1hqk").grads(true, false));
    cases.push_back(shape(2, 2, 2, 17, 17, 128, dt).biases("bn11k", "b1hqk").grads(true, true));
    cases.push_back(shape(2, 1, 1, 257, 2, 128, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(2, 1, 1, 257, 257, 128, dt).biases("bn11k", "b1hqk").grads(true, true));
    // Lk % 8 == 0 with biases in the input dtype: the CUDA kernels' fast path.
    cases.push_back(shape(2, 3, 2, 80, 136, 32, dt).biases("bn11k", "b1hqk").grads(true, true));
    cases.push_back(shape(1, 8, 2, 64, 64, 64, dt).biases("bn11k", "b1hqk").grads(true, true));
    // N = 1 on the fast path: the pair-bias gradient's walk over n is one chunk, and its kernel
    // writes the gradient itself (no partials, no reduce).
    cases.push_back(shape(2, 1, 2, 136, 72, 32, dt).biases("bn11k", "b1hqk").grads(true, true));
    // N = 1, the fast path, B N H < 256: the dK/dV kernel stores dS into the pair-bias gradient
    // (summed over nothing) and dQ is read back from it (LaunchPlan::dkdv_ds_slots), at every
    // head-dim bucket it takes (16: D = 8 and 16; 32: D = 24; 64: D = 48 and 64); partial query
    // tiles (last warps empty), a last key tile of 8 keys, one key tile.
    cases.push_back(shape(1, 1, 3, 70, 64, 8, dt).biases("", "b1hqk").grads(false, true));
    cases.push_back(shape(2, 1, 2, 40, 200, 16, dt).biases("bn11k", "b1hqk").grads(true, true));
    cases.push_back(shape(2, 1, 2, 100, 136, 24, dt).biases("bn11k", "b1hqk").grads(true, true));
    cases.push_back(shape(1, 1, 2, 130, 72, 48, dt).biases("", "b1hqk").grads(false, true));
    cases.push_back(shape(1, 1, 2, 65, 128, 64, dt).biases("bn11k", "b1hqk").grads(true, true));
    // B N H >= 256: the CUDA dK/dV kernel computes dQ too, summing over key tiles in shared
    // memory where all of Lq fits, else in the workspace (on an H100: D = 64, and the kernel
    // with warps of 32 keys, which takes D = 24 and 32 with a fast pair-bias tile and 4, 6 or
    // 7+ key tiles; SmallGpuVariants runs these on smaller GPUs' budgets;
    // one key tile: straight to dq; one query tile: the sum re-read at once).
    cases.push_back(shape(1, 64, 4, 130, 136, 32, dt).biases("bn11k", "b1hqk").grads(true, true));
    cases.push_back(shape(1, 32, 8, 70, 50, 24, dt).biases("bn11k", "b1hqk").grads(true, false));
    cases.push_back(shape(1, 32, 8, 66, 129, 64, dt).biases("bn11k", "b1hqk").grads(false, true));
    cases.push_back(shape(1, 64, 4, 65, 72, 128, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(1, 128, 2, 40, 200, 16, dt).biases("bn11k", "b1hqk").grads(true, true));
    // Head dim 8 where its rows, Lk and the pair bias take TMA (16-bit inputs: the Hopper
    // backward's bucket 16, rows narrower than its boxes; two query tiles, two key blocks).
    cases.push_back(shape(1, 64, 2, 100, 136, 8, dt).biases("bn11k", "b1hqk").grads(true, true));
    // The 32-key-warp kernel (fused; 4, 6 or 7+ key tiles): one query tile over four 128-key
    // blocks, the last with 8 keys in one tile and none in the other; head dim 24 (four key
    // tiles). Lk = 136 above (three key tiles) runs the 16-key kernel, as does the unfused
    // D = 24 case (B N H < 256).
    cases.push_back(shape(1, 64, 4, 40, 392, 32, dt).biases("bn11k", "b1hqk").grads(true, true));
    cases.push_back(shape(1, 128, 2, 70, 200, 24, dt).biases("bn11k", "b1hqk").grads(true, true));
    cases.push_back(shape(2, 2, 2, 70, 200, 24, dt).biases("bn11k", "b1hqk").grads(false, true));
    // The pair-bias gradient in blocks of two key tiles (D = 24 to 64, an even key-tile count;
    // the two Lk = 200 cases above too, writing the gradient directly): a last tile of 48 keys,
    // two query tiles, the second partial; chunked into partials (N = 16 at D = 32 and 64,
    // N = 32 at D = 24) or written directly (N = 4; at D = 48 the rows' last two chunks empty).
    cases.push_back(shape(1, 16, 2, 100, 240, 32, dt).biases("bn11k", "b1hqk").grads(false, true));
    cases.push_back(shape(1, 4, 2, 100, 240, 32, dt).biases("bn11k", "b1hqk").grads(false, true));
    cases.push_back(shape(1, 32, 2, 100, 240, 24, dt).biases("bn11k", "b1hqk").grads(false, true));
    cases.push_back(shape(1, 16, 2, 100, 240, 64, dt).biases("bn11k", "b1hqk").grads(false, true));
    cases.push_back(shape(1, 4, 2, 100, 240, 48, dt).biases("bn11k", "b1hqk").grads(true, true));
    // The fused dK/dV in blocks of two key tiles (head-dim bucket 64, an even key-tile count,
    // where the 16-key kernel's resident dQ does not fit two blocks per SM; on an H100 from two
    // query tiles on, so not at Lq = 40: there the 16-key kernel, its dQ in shared memory): two
    // key blocks, the last with 8 keys; at D = 48 the dQ half of warps 4..7 is 16 columns wide.
    // The D = 48 case (and the Lq = 66 one below) has B N H = 256, more items than the GPU holds
    // blocks of the key-pair kernel (an H100: 132): each block walks items, loading the next
    // one's K, V and first query tile during its last step.
    cases.push_back(shape(1, 32, 8, 40, 200, 64, dt).biases("bn11k", "b1hqk").grads(true, true));
    cases.push_back(shape(1, 64, 4, 70, 200, 48, dt).biases("bn11k", "b1hqk").grads(true, true));
    // The key-pair kernel computing Delta in its first key block (LaunchPlan::delta_in_dkdv, as
    // in the D = 48 case above): three key blocks, the later two and both bias gradients reading
    // it from the workspace; two query tiles, the second of 2 rows.
    cases.push_back(shape(1, 64, 4, 66, 384, 64, dt).biases("bn11k", "b1hqk").grads(true, true));
    // B N H = 512, more than the running-dQ slots a GPU holds (an H100: 396 at D = 16): blocks
    // reuse the slots of finished ones where the sum is in the workspace (SmallGpuVariants).
    cases.push_back(shape(1, 256, 2, 70, 72, 16, dt).biases("bn11k", "b1hqk").grads(false, true));
    // No bias along Lq at head dim 17..32: the dK/dV kernel compiled without tile-bias code
    // (three blocks per SM: 396 slots on an H100, fewer than these 512 blocks).
    cases.push_back(shape(1, 64, 4, 130, 136, 32, dt).biases("bn11k", "").grads(true, false));
    cases.push_back(shape(1, 256, 2, 70, 72, 24, dt));
    // The same kernels' generic variants (no 16-byte bias rows: Lk = 130; no 16-byte Q rows:
    // D = 20), also with the running dQ in shared memory.
    cases.push_back(shape(1, 64, 4, 130, 130, 32, dt).biases("bn11k", "b1hqk").grads(true, true));
    cases.push_back(shape(1, 256, 2, 70, 72, 20, dt));
  }
  Case scaled =
      shape(2, 2, 2, 17, 33, 32, EVOATTN_FLOAT32).biases("bn11k", "b1hqk").grads(true, true);
  scaled.scale = 0.37;
  cases.push_back(scaled);
  return cases;
}

class Backward : public ::testing::TestWithParam<Case> {};

TEST_P(Backward, MatchesReference) {
  const Case& c = GetParam();
  if (backend_missing(c.backend)) GTEST_SKIP() << kNoCudaMessage;
  const Inputs in = make_inputs(c);
  const evoattn_options_t options = case_options(c);
  const ForwardRun fwd = run_forward(c, in, &options);
  ASSERT_EQ(fwd.status, EVOATTN_SUCCESS) << fwd.error;
  expect_backward_matches(c, in, run_backward(c, in, fwd, &options));
}

INSTANTIATE_TEST_SUITE_P(Grid, Backward, ::testing::ValuesIn(on_backends(grid(), 200)), case_name);

// The N = 1 backward with a pair-bias gradient (LaunchPlan::dkdv_ds_slots: the dK/dV kernel
// stores dS, a pass reads dQ back from it) in each form of its two kernels: the dK/dV kernel in
// one block a key tile or in clusters of two query halves (LaunchPlan::dkdv_query_halves, head-dim
// bucket 32, sm_90), the read-back with one group walking every key or two halves of the keys
// (LaunchPlan::dq_from_ds_halves). The plan takes both halves where their blocks fit one wave, as
// these small cases' do; EVOATTN_EXP_DKDV_QUERY_HALVES and EVOATTN_EXP_DQ_FROM_DS_HALVES force
// each form. CUDA, 16-bit only.
std::vector<Case> dq_from_ds_cases() {
  std::vector<Case> cases;
  for (evoattn_dtype_t dt : {EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) {
    // Three key blocks of 64 (the read-back's halves: 2 and 1) with a partial one; two query
    // tiles, the second partial (the dK/dV halves: one each).
    cases.push_back(shape(2, 1, 2, 100, 136, 24, dt).biases("bn11k", "b1hqk").grads(true, true));
    // Three query tiles (the dK/dV halves: 2 and 1), a partial key tile.
    cases.push_back(shape(1, 1, 2, 150, 96, 32, dt).biases("", "b1hqk").grads(false, true));
    // Five query tiles (3 and 2: half 1 walks more than one) and four (2 and 2).
    cases.push_back(shape(1, 1, 2, 300, 136, 32, dt).biases("", "b1hqk").grads(false, true));
    cases.push_back(shape(1, 1, 1, 256, 72, 24, dt).biases("bn11k", "b1hqk").grads(true, true));
    // One key block: the read-back's second half walks none. Bucket 16: no dK/dV halves.
    cases.push_back(shape(1, 1, 3, 70, 64, 8, dt).biases("", "b1hqk").grads(false, true));
    // Nine key blocks (an odd count) at head-dim bucket 64, four query tiles.
    cases.push_back(shape(1, 1, 2, 200, 520, 64, dt).biases("", "b1hqk").grads(false, true));
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    cases[i].backend = Backend::kCuda;
    cases[i].seed = 300 + i;
  }
  return cases;
}

class BackwardDqFromDs : public ::testing::TestWithParam<Case> {};

TEST_P(BackwardDqFromDs, MatchesReferenceWithEitherKernel) {
  const Case& c = GetParam();
  if (backend_missing(c.backend)) GTEST_SKIP() << kNoCudaMessage;
  const Inputs in = make_inputs(c);
  const evoattn_options_t options = case_options(c);
  for (const char* dkdv_halves : {"0", "1"}) {
    for (const char* dq_halves : {"0", "1"}) {
      SCOPED_TRACE(std::string("EVOATTN_EXP_DKDV_QUERY_HALVES=") + dkdv_halves +
                   " EVOATTN_EXP_DQ_FROM_DS_HALVES=" + dq_halves);
      const ScopedEnv dkdv_env("EVOATTN_EXP_DKDV_QUERY_HALVES", dkdv_halves);
      const ScopedEnv dq_env("EVOATTN_EXP_DQ_FROM_DS_HALVES", dq_halves);
      const ForwardRun fwd = run_forward(c, in, &options);
      ASSERT_EQ(fwd.status, EVOATTN_SUCCESS) << fwd.error;
      expect_backward_matches(c, in, run_backward(c, in, fwd, &options));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ReadBack, BackwardDqFromDs, ::testing::ValuesIn(dq_from_ds_cases()), case_name);

}  // namespace
}  // namespace evoattn::test
