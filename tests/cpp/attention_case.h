// One attention problem for the numeric tests: its description (Case), its inputs, a run of
// the library on a backend, and the check against the float64 reference with the contract's rule.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "evoattn/evoattn.h"
#include "reference/reference.h"
#include "tensor_util.h"

namespace evoattn::test {

enum class Backend { kCpu, kCuda };

inline constexpr const char* kNoCudaMessage =
    "no CUDA device / CUDA backend not built: GPU tests skipped";

// True when `backend` cannot run here; the test then calls GTEST_SKIP() << kNoCudaMessage.
bool backend_missing(Backend backend);

// How a view is laid out in memory. For [B, N, L, H, D] tensors:
enum class Layout {
  kContiguous,  // row-major in the logical order
  kHeadMajor,   // dims 2 and 3 swapped in memory: [B, N, H, L, D] (lse: [B, N, Lq, H])
  kPadded,      // row-major, each stride 3 elements more than needed, base 1 element past 16 B
  kStridedD,    // row-major with an innermost stride of 2
  kReversed,    // row-major, dim 2 walked backwards (negative stride); inputs only
};

// Rows whose every key is masked out (docs/CONTRACT.md "Fully masked rows").
enum class MaskedRows {
  kNone,
  kMinusInf,  // mask all false at (b, n) = (0, 0); mask_bias -inf on every key at (B-1, N-1)
  kMinus1e9,  // mask_bias -1e9 on every key at (0, 0) and (B-1, N-1); reference scores in float32
  // pair_bias at (b, h) = (0, 0): -inf on every key of query row 0, and on keys 0, 3 and Lk - 1
  // of row 1 (the other keys of row 1 stay: IEEE, not a whole-row rule)
  kPairMinusInf,
  kPairMinus1e9,  // pair_bias -1e9 on every key of query row 0 at (b, h) = (0, 0); float32 scores
  // Keys 0..63 (a CUDA key tile) masked, the rest not: by a -1e9 mask_bias at (b, n) = (0, 0),
  // at (B-1, N-1) by the boolean mask if there is one, else a -inf mask_bias. The forward's
  // first key tile of those rows holds no key.
  kFirstKeyTile,
};

struct Case {
  Backend backend = Backend::kCpu;
  int64_t B = 1, N = 1, H = 1, Lq = 1, Lk = 1, D = 8;
  evoattn_dtype_t dtype = EVOATTN_FLOAT32;
  // Bias shapes over [B, N, H, Lq, Lk], one character per dimension: its letter (b n h q k)
  // = full size, '1' = size 1, '0' = full size with stride 0 (an expanded view); "" = absent.
  // The Evoformer forms are "bn11k" (mask_bias) and "b1hqk" (pair_bias).
  std::string mask_bias, pair_bias;
  bool bias_f32 = false;  // biases in float32 rather than the input dtype
  bool grad_mask_bias = false, grad_pair_bias = false;
  std::string mask;  // boolean mask: "" = none, 3-D "bnk" ("1nk", "b1k": broadcast), or 5-D
  MaskedRows masked_rows = MaskedRows::kNone;
  // The finite bias of kMinus1e9 and kPairMinus1e9 rows (-1e9 unless a case asks for a lower
  // one: the scores in log2 units pass 2^31 from about -1.5e9).
  double big_bias = -1e9;
  Layout layout = Layout::kContiguous;      // q, k, v, d_o and the biases
  Layout out_layout = Layout::kContiguous;  // o, lse and every gradient
  double scale = 0.0;                       // 0 = the default 1/sqrt(D)
  bool nan_inputs = false;                  // a NaN in q, k, v and the pair bias (see plant_nans)
  // mask_bias[.., j] += key_ramp * j (the pair bias's, without a mask bias): scores rise along
  // the keys, so later key tiles pass a row's running max (the CUDA forward moves its lazy
  // reference max, or keeps it within slack).
  double key_ramp = 0.0;
  bool tf32 = false;                        // options.allow_tf32 (float32 inputs)
  // Nonzero: q ~ U(-s, s) and k ~ U(-1, 1), so scores spread over about s / 3 and each row's
  // softmax nears one-hot as s grows (the float32 large-logit cases).
  double logit_scale = 0.0;
  // The pair bias 0 at one random key of each of its rows and U(-60, -20) at the others: every
  // row's P is one-hot to within e^-20, below float32's resolution of 1, so dS = P (dP - Delta)
  // is a difference of nearly equal numbers in every row (needs a pair bias).
  bool one_hot_rows = false;
  bool cap_only = false;  // every output held to the contract's cap, whatever the naive error
  uint64_t seed = 0;

  Case& biases(std::string mb, std::string pb);
  Case& grads(bool mb, bool pb);
  Case& with_mask(std::string pattern);
  Case& layouts(Layout in, Layout out);

  std::string name() const;  // unique within a suite (it holds the seed), a valid gtest name
};

Case shape(int64_t B, int64_t N, int64_t H, int64_t Lq, int64_t Lk, int64_t D,
           evoattn_dtype_t dtype);

// Every case once per backend, with seeds seed_base, seed_base + 1, ...
std::vector<Case> on_backends(const std::vector<Case>& cases, uint64_t seed_base);

// gtest parameter names and printing.
std::string case_name(const ::testing::TestParamInfo<Case>& info);
void PrintTo(const Case& c, std::ostream* os);

evoattn_options_t case_options(const Case& c);

// Host inputs, filled from the case's seed; absent tensors have view.data == nullptr.
struct Inputs {
  util::Tensor q, k, v, d_o, mask_bias, pair_bias, mask;
  double scale;
  ref::Inputs ref() const;
};
Inputs make_inputs(const Case& c);

// Library results copied back to the host (whole buffers, so padding can be inspected).
struct ForwardRun {
  evoattn_status_t status;
  std::string error;
  util::Tensor o, lse;
};
struct BackwardRun {
  evoattn_status_t status;
  std::string error;
  util::Tensor dq, dk, dv, d_mask_bias, d_pair_bias;
};
ForwardRun run_forward(const Case& c, const Inputs& in, const evoattn_options_t* options);
BackwardRun run_backward(const Case& c, const Inputs& in, const ForwardRun& fwd,
                         const evoattn_options_t* options);

// the contract's numerics rule for every output, plus: every element written (outputs were poisoned
// with NaN), NaN exactly where the reference has NaN, nothing written outside the view, and
// fully masked rows exactly O = 0, LSE = -inf.
void expect_forward_matches(const Case& c, const Inputs& in, const ForwardRun& run);
void expect_backward_matches(const Case& c, const Inputs& in, const BackwardRun& run);

// The whole check of one case: forward against the reference, then (when it succeeded) the
// backward against the reference.
void expect_forward_and_backward_match(const Case& c);

// Byte equality of two host tensors' whole buffers.
bool same_bytes(const util::Tensor& a, const util::Tensor& b);

}  // namespace evoattn::test
