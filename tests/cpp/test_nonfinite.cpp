// NaN inputs propagate as IEEE arithmetic would and stay where they are (docs/CONTRACT.md): the forward
// gives NaN exactly where the float64 reference does and matches it everywhere else; the
// backward runs. A NaN in Q makes a row whose every score is NaN: O and LSE NaN there, not the
// masked row's 0 and -inf.
#include <gtest/gtest.h>

#include "attention_case.h"

namespace evoattn::test {
namespace {

std::vector<Case> nan_cases() {
  std::vector<Case> cases;
  auto with_nans = [&](Case c) {
    c.biases("bn11k", "b1hqk").grads(true, true);
    c.nan_inputs = true;
    cases.push_back(c);
  };
  for (evoattn_dtype_t dt : {EVOATTN_FLOAT32, EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) {
    with_nans(shape(2, 2, 3, 17, 21, 32, dt));
  }
  // Several query and key tiles, at each head-dim bucket of the 16-bit kernels.
  for (int64_t d : {16, 32, 64}) {
    for (evoattn_dtype_t dt : {EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) with_nans(shape(1, 2, 2, 130, 150, d, dt));
  }
  return cases;
}

class NonFinite : public ::testing::TestWithParam<Case> {};

TEST_P(NonFinite, NanStaysWhereIeeePutsIt) {
  const Case& c = GetParam();
  if (backend_missing(c.backend)) GTEST_SKIP() << kNoCudaMessage;
  const Inputs in = make_inputs(c);
  const evoattn_options_t options = case_options(c);
  const ForwardRun fwd = run_forward(c, in, &options);
  expect_forward_matches(c, in, fwd);
  const BackwardRun bwd = run_backward(c, in, fwd, &options);
  EXPECT_EQ(bwd.status, EVOATTN_SUCCESS) << bwd.error;
}

INSTANTIATE_TEST_SUITE_P(Inputs, NonFinite, ::testing::ValuesIn(on_backends(nan_cases(), 800)),
                         case_name);

}  // namespace
}  // namespace evoattn::test
