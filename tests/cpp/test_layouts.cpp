// Strided views: head-major [B, N, H, L, D] memory passed through strides, padded rows, a
// non-unit D stride, negative strides, and outputs and gradients in non-contiguous layouts.
// Input padding holds NaN, so a read outside a view shows up in the results.
#include <gtest/gtest.h>

#include "attention_case.h"

namespace evoattn::test {
namespace {

std::vector<Case> layout_cases() {
  const Layout in_layouts[] = {Layout::kHeadMajor, Layout::kPadded, Layout::kStridedD,
                               Layout::kReversed};
  const Layout out_layouts[] = {Layout::kHeadMajor, Layout::kPadded, Layout::kStridedD};
  std::vector<Case> cases;
  for (evoattn_dtype_t dt : {EVOATTN_FLOAT32, EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) {
    const Case base =
        shape(2, 2, 3, 17, 13, 40, dt).biases("bn11k", "b1hqk").grads(true, true).with_mask("bnk");
    for (Layout in : in_layouts) cases.push_back(Case(base).layouts(in, Layout::kContiguous));
    for (Layout out : out_layouts) cases.push_back(Case(base).layouts(Layout::kContiguous, out));
  }
  // Reversed rows on the fast kernels (16-byte rows, Lk % 8 = 0, a pair bias they prefetch):
  // their int32 offsets from each tensor's base step by a negative row stride.
  cases.push_back(shape(2, 3, 2, 70, 72, 32, EVOATTN_BFLOAT16)
                      .biases("bn11k", "b1hqk")
                      .grads(true, true)
                      .layouts(Layout::kReversed, Layout::kContiguous));
  cases.push_back(shape(2, 3, 2, 33, 33, 32, EVOATTN_FLOAT16)
                      .biases("bn11k", "b1hqk")
                      .grads(true, true)
                      .layouts(Layout::kHeadMajor, Layout::kHeadMajor));
  cases.push_back(shape(2, 1, 2, 1, 65, 8, EVOATTN_BFLOAT16)
                      .biases("", "b1hqk")
                      .grads(false, true)
                      .layouts(Layout::kPadded, Layout::kPadded));
  // N = 1 (AlphaFold 3's pair-biased attention) with few (b, n, h): the dQ pass writes the
  // pair-bias gradient, summed over nothing, as it goes: element pairs where the gradient is
  // contiguous, else one element at a time (padded rows at an odd offset, a key stride of 2, a
  // float32 gradient of 16-bit inputs).
  for (Layout out : {Layout::kContiguous, Layout::kPadded, Layout::kStridedD}) {
    cases.push_back(shape(2, 1, 2, 70, 72, 32, EVOATTN_BFLOAT16)
                        .biases("bn11k", "b1hqk")
                        .grads(true, true)
                        .layouts(Layout::kContiguous, out));
  }
  Case f32_grad = shape(2, 1, 2, 70, 72, 32, EVOATTN_FLOAT16).biases("bn11k", "b1hqk").grads(true, true);
  f32_grad.bias_f32 = true;
  cases.push_back(f32_grad);
  cases.push_back(shape(2, 2, 2, 9, 40, 128, EVOATTN_FLOAT32)
                      .biases("bn11k", "")
                      .grads(true, false)
                      .with_mask("bnk")
                      .layouts(Layout::kStridedD, Layout::kHeadMajor));
  return cases;
}

class Layouts : public ::testing::TestWithParam<Case> {};

TEST_P(Layouts, ForwardAndBackwardMatchReference) {
  const Case& c = GetParam();
  if (backend_missing(c.backend)) GTEST_SKIP() << kNoCudaMessage;
  expect_forward_and_backward_match(c);
}

INSTANTIATE_TEST_SUITE_P(Views, Layouts, ::testing::ValuesIn(on_backends(layout_cases(), 500)),
                         case_name);

}  // namespace
}  // namespace evoattn::test
