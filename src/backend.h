// The backends behind the C API. Each takes validated Params; the CUDA functions exist in
// every build (cuda/unavailable.cpp answers when the library was built without CUDA).
#pragma once

#include <cstddef>

#include "evoattn/evoattn.h"
#include "params.h"

namespace evoattn {

// Backward workspace. Both backends start it with float32 [B, N, H, Lq] arrays of row
// statistics, so that P = exp(s - row_max - row_log_sum) and dS = P ((dP - top_dp) - Delta):
//   Delta        dO . O; or, with exact_delta, sum_j P (dP - top_dp) from the very P and dP the
//                gradient passes compute (bit for bit), summed over the keys in order;
//   row_max      LSE; or, where |LSE| >= kLseExactLimit, the row's max score recomputed: a
//                float32 LSE of -1e9 cannot carry the + log(l) of its row;
//   row_log_sum  0; or log sum_j exp(s_j - row_max) for recomputed rows;
//   top_dp       float32 only (shifted_delta): dP at the row's top-scoring key; else taken as 0.
// Where a row's P is one-hot (large logits) dP - Delta is far smaller than either term: Delta
// from the stored O cannot cancel dP's rounding, and even sum_j P dP leaves one rounding of dP
// (float32 dQ and dK were 60x and 400x the naive computation's error). Shifted by top_dp the
// top key's dS is -P Delta, each term of Delta small: float32 keeps its relative precision.
// With fewer than kExactDeltaHeadDim terms the stored O's rounding dominates for every dtype.
// The CPU keeps natural-log units, CUDA log2 units. CUDA may add bias-gradient partials after.
constexpr int kExactDeltaHeadDim = 8;
constexpr float kLseExactLimit = 64.0f;
EVOATTN_HOST_DEVICE inline int64_t num_rows(const FwdParams& p) { return p.B * p.N * p.H * p.Lq; }
EVOATTN_HOST_DEVICE inline bool shifted_delta(const FwdParams& p) { return p.dtype == DType::kF32; }
EVOATTN_HOST_DEVICE inline bool exact_delta(const FwdParams& p) {
  return shifted_delta(p) || p.D < kExactDeltaHeadDim;
}
inline size_t row_stats_bytes(const FwdParams& p) {
  return static_cast<size_t>((shifted_delta(p) ? 4 : 3) * num_rows(p)) * sizeof(float);
}
// Whether a row's statistics come from its scores rather than from its LSE.
EVOATTN_HOST_DEVICE inline bool recompute_row_stats(float lse, int D) {
  return D < kExactDeltaHeadDim || (lse - lse == 0.0f && (lse >= kLseExactLimit || lse <= -kLseExactLimit));
}
size_t cuda_backward_workspace_bytes(const BwdParams& p);

evoattn_status_t cpu_forward(const FwdParams& p);
evoattn_status_t cpu_backward(const BwdParams& p);

bool cuda_backend_available();
evoattn_status_t cuda_forward(const FwdParams& p, void* stream);
// Makes the launch plan once, checks p.workspace against the layout it gives
// (cuda_backward_workspace_bytes' number), then launches.
evoattn_status_t cuda_backward(const BwdParams& p, void* stream);

}  // namespace evoattn
