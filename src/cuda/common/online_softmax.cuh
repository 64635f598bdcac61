// The online softmax a forward kernel keeps per query row (log2 domain, fp32), in the mma C
// layout: a thread holds rows g and g + 8 (r = 0, 1) of a warp's 16, O as acc_o[d][2r], [2r+1].
#pragma once

#include "cuda/common/element.cuh"
#include "cuda/common/ptx.cuh"

namespace evoattn::cuda {

// Row r takes a key tile whose max score (already reduced over the quad) is `tile_max`: the
// running max moves, the row sum and the row's O are rescaled. Returns the max to exponentiate
// the tile's scores against: 0 while every key so far is masked (-inf - -inf never occurs).
template <int kDTiles>
__device__ __forceinline__ float online_softmax_rescale(float tile_max, float& row_max,
                                                        float& row_sum,
                                                        float (&acc_o)[kDTiles][4], int r) {
  const float m_new = fmaxf(row_max, tile_max);
  const float m_use = m_new == neg_inf() ? 0.0f : m_new;
  const float alpha = exp2_approx(row_max - m_use);
  row_max = m_new;
  row_sum *= alpha;
  for (int d = 0; d < kDTiles; ++d) {
    acc_o[d][2 * r] *= alpha;
    acc_o[d][2 * r + 1] *= alpha;
  }
  return m_use;
}

// How far (log2 units) a tile's max may pass a row's reference max before the reference moves:
// P = 2^(S2 - m) stays below 2^kRescaleSlack, in range for 16-bit P and the float sums.
constexpr float kRescaleSlack = 8.0f;

// The lazy online softmax of the forward (FlashAttention-4's rescale skipping): rows r = 0, 1
// of each of a warp's kMT row tiles take a key tile whose max over this thread's columns is
// local_max[mt][r]. A row whose tile max (over the quad) passes its reference max by more than
// kRescaleSlack moves the reference there, rescaling its O and row sum; the warp skips the
// rescale when no row moves (most key tiles after the first). Whether any row moves needs no
// quad max: some lane of the quad holds it, and the vote covers every lane; so the quad's
// shuffles run only on the rare path, off the common path from the scores to their
// exponentials. One vote covers all row tiles (a row that stays is rescaled by exactly 1).
// m_use: the max to exponentiate the tile against, 0 while every key so far is masked.
// `first` (warp-uniform): the item's first scores, so O and the row sums are still zero and
// every row with a finite score moves: the reference is set without the rescale's products.
template <int kMT, int kDTiles>
__device__ __forceinline__ void online_softmax_lazy(const float (&local_max)[kMT][2],
                                                    float (&row_max)[kMT][2], float (&row_sum)[kMT][2],
                                                    float (&acc_o)[kMT][kDTiles][4],
                                                    float (&m_use)[kMT][2], bool first) {
  // The difference, not row_max + slack: near |row_max| = 2^27 that sum rounds (to +16, a tie)
  // and a tile 16 above would stay, with P = 2^16: inf in float16. Values this close subtract
  // exactly; -inf - -inf is NaN, which compares false (a masked row stays).
  float rise = neg_inf();
  for (int mt = 0; mt < kMT; ++mt)
    for (int r = 0; r < 2; ++r) rise = fmaxf(rise, local_max[mt][r] - row_max[mt][r]);
  if (first) {
    for (int mt = 0; mt < kMT; ++mt) {
      for (int r = 0; r < 2; ++r) {
        float tile_max = local_max[mt][r];
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        row_max[mt][r] = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));  // -inf: masked so far
      }
    }
  } else if (__any_sync(0xffffffffu, rise > kRescaleSlack)) {
    for (int mt = 0; mt < kMT; ++mt) {
      for (int r = 0; r < 2; ++r) {
        float tile_max = local_max[mt][r];
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const bool move = tile_max - row_max[mt][r] > kRescaleSlack;
        const float m_new = move ? tile_max : row_max[mt][r];
        const float m_ref = m_new == neg_inf() ? 0.0f : m_new;
        const float alpha = exp2_approx(row_max[mt][r] - m_ref);  // 1 if the row stays, 0 from -inf
        row_max[mt][r] = m_new;
        row_sum[mt][r] *= alpha;
        for (int d = 0; d < kDTiles; ++d) {
          acc_o[mt][d][2 * r] *= alpha;
          acc_o[mt][d][2 * r + 1] *= alpha;
        }
      }
    }
  }
  for (int mt = 0; mt < kMT; ++mt)
    for (int r = 0; r < 2; ++r) m_use[mt][r] = row_max[mt][r] == neg_inf() ? 0.0f : row_max[mt][r];
}

// A row's LSE in natural units from its running max and full row sum; -inf for a fully masked
// row (sum 0).
__device__ __forceinline__ float row_lse(float row_max, float sum) {
  const float m = row_max == neg_inf() ? 0.0f : row_max;
  return sum == 0.0f ? neg_inf() : (m + log2_approx(sum)) * kLn2;
}

}  // namespace evoattn::cuda
