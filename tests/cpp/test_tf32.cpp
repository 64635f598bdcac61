// float32 with options.allow_tf32 (docs/CONTRACT.md: TF32 tensor cores only when the caller opts in, bound
// 2e-3): the CUDA forward runs on TF32 mma.sync, the backward stays IEEE float32 on the LSE that
// forward saved. The CPU backend ignores the option and must pass the same bound.
#include <gtest/gtest.h>

#include "attention_case.h"

namespace evoattn::test {
namespace {

Case tf32(Case c) {
  c.tf32 = true;
  return c;
}

std::vector<Case> forward_cases() {
  const evoattn_dtype_t f32 = EVOATTN_FLOAT32;
  std::vector<Case> cases;
  cases.push_back(tf32(shape(2, 3, 2, 17, 97, 32, f32).biases("bn11k", "b1hqk")));
  cases.push_back(tf32(shape(2, 1, 2, 97, 70, 8, f32)));
  cases.push_back(tf32(shape(1, 2, 3, 65, 200, 64, f32).biases("bn11k", "")));
  cases.push_back(tf32(shape(2, 2, 1, 33, 130, 128, f32).biases("", "b1hqk")));
  cases.push_back(tf32(shape(1, 2, 2, 80, 136, 48, f32).biases("bn11k", "b1hqk").layouts(Layout::kHeadMajor, Layout::kPadded)));
  cases.push_back(tf32(shape(2, 2, 2, 40, 70, 24, f32).biases("", "b1hqk").with_mask("bnk")));
  Case rows = tf32(shape(2, 2, 2, 33, 97, 16, f32).biases("bn11k", "b1hqk"));
  rows.masked_rows = MaskedRows::kMinus1e9;
  cases.push_back(rows);
  Case inf_rows = tf32(shape(2, 2, 2, 33, 65, 32, f32).biases("bn11k", "b1hqk").with_mask("bnk"));
  inf_rows.masked_rows = MaskedRows::kMinusInf;
  cases.push_back(inf_rows);
  return cases;
}

std::vector<Case> backward_cases() {
  const evoattn_dtype_t f32 = EVOATTN_FLOAT32;
  return {tf32(shape(2, 3, 2, 40, 70, 32, f32).biases("bn11k", "b1hqk").grads(true, true)),
          tf32(shape(1, 2, 3, 65, 130, 64, f32).biases("bn11k", "b1hqk").grads(false, true))};
}

class Tf32Forward : public ::testing::TestWithParam<Case> {};

TEST_P(Tf32Forward, MatchesReference) {
  const Case& c = GetParam();
  if (backend_missing(c.backend)) GTEST_SKIP() << kNoCudaMessage;
  const Inputs in = make_inputs(c);
  const evoattn_options_t options = case_options(c);
  expect_forward_matches(c, in, run_forward(c, in, &options));
}

class Tf32Backward : public ::testing::TestWithParam<Case> {};

TEST_P(Tf32Backward, MatchesReference) {
  const Case& c = GetParam();
  if (backend_missing(c.backend)) GTEST_SKIP() << kNoCudaMessage;
  expect_forward_and_backward_match(c);
}

INSTANTIATE_TEST_SUITE_P(Grid, Tf32Forward, ::testing::ValuesIn(on_backends(forward_cases(), 500)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Grid, Tf32Backward, ::testing::ValuesIn(on_backends(backward_cases(), 520)),
                         case_name);

}  // namespace
}  // namespace evoattn::test
