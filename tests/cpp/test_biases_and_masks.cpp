// Every bias combination, forward and backward with the bias gradients: the Evoformer forms,
// the boolean mask (3-D and 5-D, alone and with biases), other broadcasts in either slot,
// float32 biases with 16-bit inputs, and fully masked rows (docs/CONTRACT.md "Fully masked rows").
#include <gtest/gtest.h>

#include "attention_case.h"

namespace evoattn::test {
namespace {

Case small(evoattn_dtype_t dtype) { return shape(2, 3, 2, 17, 19, 24, dtype); }

std::vector<Case> bias_cases() {
  std::vector<Case> cases;
  for (evoattn_dtype_t dt : {EVOATTN_FLOAT32, EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) {
    cases.push_back(small(dt));
    cases.push_back(small(dt).biases("bn11k", "").grads(true, false));
    cases.push_back(small(dt).biases("", "b1hqk").grads(false, true));
    cases.push_back(small(dt).biases("bn11k", "b1hqk").grads(true, true));
    cases.push_back(small(dt).with_mask("bnk"));
    cases.push_back(small(dt).biases("", "b1hqk").grads(false, true).with_mask("bnk"));
    cases.push_back(small(dt).biases("bn11k", "b1hqk").grads(true, true).with_mask("bnk"));
    cases.push_back(small(dt).biases("bn11k", "b1hqk").grads(true, true).with_mask("b1hqk"));
  }
  // Non-Evoformer broadcasts, in either slot, with gradients (summed over broadcast dims).
  const char* const patterns[][2] = {
      {"111qk", "bnhqk"}, {"b111k", "1nhq1"}, {"bnh11", "111qk"}, {"bnhqk", "b111k"},
      {"1nhq1", "bnh11"}, {"bn00k", "b0hqk"},  // '0': expanded views with stride 0
      {"11111", "1n1q1"},
  };
  for (const auto& p : patterns) {
    for (evoattn_dtype_t dt : {EVOATTN_FLOAT32, EVOATTN_BFLOAT16}) {
      cases.push_back(small(dt).biases(p[0], p[1]).grads(true, true));
    }
  }
  // 3-D masks broadcast over B or N; 5-D masks of other shapes.
  cases.push_back(
      small(EVOATTN_FLOAT32).biases("bn11k", "b1hqk").grads(true, true).with_mask("1nk"));
  cases.push_back(small(EVOATTN_FLOAT16).biases("", "b1hqk").grads(false, true).with_mask("b1k"));
  cases.push_back(small(EVOATTN_FLOAT32).with_mask("bnhqk"));
  cases.push_back(
      small(EVOATTN_BFLOAT16).biases("bn11k", "").grads(true, false).with_mask("11hq1"));
  // float32 biases (and float32 bias gradients) with 16-bit inputs.
  for (evoattn_dtype_t dt : {EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) {
    Case c = small(dt).biases("bn11k", "b1hqk").grads(true, true).with_mask("bnk");
    c.bias_f32 = true;
    cases.push_back(c);
  }
  return cases;
}

// Rows with every key masked: by a false mask and by a -inf mask_bias (O = 0, LSE = -inf,
// no gradient contribution), and by a -1e9 mask_bias (uniform rows, float32 score reference).
std::vector<Case> masked_row_cases() {
  std::vector<Case> cases;
  for (evoattn_dtype_t dt : {EVOATTN_FLOAT32, EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) {
    Case inf = small(dt).biases("bn11k", "b1hqk").grads(true, true).with_mask("bnk");
    inf.masked_rows = MaskedRows::kMinusInf;
    cases.push_back(inf);
    Case big = small(dt).biases("bn11k", "b1hqk").grads(true, true);
    big.masked_rows = MaskedRows::kMinus1e9;
    big.bias_f32 = dt == EVOATTN_FLOAT16;  // -1e9 is -inf in float16
    cases.push_back(big);
    // The same with Lk % 8 == 0 and D = 32: bfloat16 takes the CUDA kernels' fast path.
    Case fast = shape(2, 3, 2, 17, 24, 32, dt).biases("bn11k", "b1hqk").grads(true, true);
    fast.masked_rows = MaskedRows::kMinus1e9;
    fast.bias_f32 = dt == EVOATTN_FLOAT16;
    cases.push_back(fast);
    // Infinite and -1e9 pair biases (the fast forward adds the pair bias in units of 1/scale).
    for (MaskedRows rows : {MaskedRows::kPairMinusInf, MaskedRows::kPairMinus1e9}) {
      Case pair = shape(2, 3, 2, 17, 24, 32, dt).biases("bn11k", "b1hqk").grads(true, true);
      pair.masked_rows = rows;
      pair.bias_f32 = dt == EVOATTN_FLOAT16 && rows == MaskedRows::kPairMinus1e9;
      cases.push_back(pair);
    }
  }
  // Rows whose first key tile is masked and later ones not, at head dim 64 with a shared pair
  // bias (the CUDA wide-warp forward: a reference max of -inf or -1e9 log2 e after the first
  // tile, which the next scores pass by far), with and without a boolean mask.
  for (evoattn_dtype_t dt : {EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) {
    for (bool with_mask : {false, true}) {
      Case first = shape(1, 32, 8, 70, 136, 64, dt).biases("bn11k", "b1hqk").grads(true, true);
      if (with_mask) first.with_mask("bnk");
      first.masked_rows = MaskedRows::kFirstKeyTile;
      first.bias_f32 = dt == EVOATTN_FLOAT16;  // -1e9 is -inf in float16
      cases.push_back(first);
    }
  }
  // -1e9 rows where the key-pair dK/dV computes Delta (the CUDA LaunchPlan::delta_in_dkdv: B N H
  // >= 256, two query tiles, an even key-tile count, biases of the input dtype): the row
  // statistics then read only the LSE, four rows a thread, and recompute these rows'.
  Case pairs = shape(1, 64, 4, 65, 128, 64, EVOATTN_BFLOAT16).biases("bn11k", "b1hqk").grads(true, true);
  pairs.masked_rows = MaskedRows::kMinus1e9;
  cases.push_back(pairs);
  Case tiny = shape(2, 1, 3, 1, 2, 8, EVOATTN_FLOAT32).biases("bn11k", "").grads(true, false);
  tiny.mask = "bnk";
  tiny.masked_rows = MaskedRows::kMinusInf;
  cases.push_back(tiny);
  // Finite whole-row biases far below -1e9 (-3e9 and -1e10: their log2-unit scores pass
  // 2^31, so a reference max rounded apart from the exponents leaves the row's largest P far
  // from 1): still a uniform row in float32 arithmetic. 16-bit cases in float32 biases where
  // the dtype cannot hold them (float16).
  auto huge_rows = [&](Case c, MaskedRows rows, double big) {
    c.biases("bn11k", "b1hqk").grads(true, true);
    c.masked_rows = rows;
    c.big_bias = big;
    c.bias_f32 = c.dtype == EVOATTN_FLOAT16;
    cases.push_back(c);
  };
  for (evoattn_dtype_t dt : {EVOATTN_FLOAT32, EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) {
    for (double big : {-3e9, -1e10}) {
      for (MaskedRows rows : {MaskedRows::kMinus1e9, MaskedRows::kPairMinus1e9}) {
        huge_rows(shape(2, 3, 2, 17, 24, 32, dt), rows, big);
      }
    }
  }
  // The same rows over several key tiles, where the Hopper forward tests for them on a later
  // tile's path: two consumers (Lq 17), four (Lq 256) and three at head dim 64 (Lq 192).
  for (evoattn_dtype_t dt : {EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) {
    for (const Case& s : {shape(1, 2, 2, 17, 200, 32, dt), shape(1, 2, 2, 256, 200, 32, dt),
                          shape(1, 2, 2, 192, 136, 64, dt)}) {
      for (MaskedRows rows : {MaskedRows::kMinus1e9, MaskedRows::kPairMinus1e9}) huge_rows(s, rows, -3e9);
    }
  }
  return cases;
}

class BiasesAndMasks : public ::testing::TestWithParam<Case> {};

TEST_P(BiasesAndMasks, ForwardAndBackwardMatchReference) {
  const Case& c = GetParam();
  if (backend_missing(c.backend)) GTEST_SKIP() << kNoCudaMessage;
  expect_forward_and_backward_match(c);
}

INSTANTIATE_TEST_SUITE_P(Biases, BiasesAndMasks,
                         ::testing::ValuesIn(on_backends(bias_cases(), 300)), case_name);
INSTANTIATE_TEST_SUITE_P(MaskedRows, BiasesAndMasks,
                         ::testing::ValuesIn(on_backends(masked_row_cases(), 400)), case_name);

}  // namespace
}  // namespace evoattn::test
