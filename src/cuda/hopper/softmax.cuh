// The Hopper forward's online softmax (log2 domain, float32) for one consumer thread's two rows
// of a 64 x 64 score tile in the wgmma C layout: rows g and g + 8 of its warp's 16 (r = 0, 1),
// 16 keys each (y[4j + 2r], y[4j + 2r + 1], j = 0..7). It takes the scores before their scale,
// y = x / (scale log2 e) with scale > 0 (fwd_kernel.cuh), so a score's exponent is one FFMA,
// y c - m with c = scale log2 e; the maxima are taken on y and scaled once a row. The same lazy
// rescale as the portable kernels (online_softmax_lazy, FlashAttention-4's rescale skipping),
// split in two so the rescale of O can wait for the P V product still running on it: update()
// moves the reference maxima and rescales the row sums; rescale() applies the same factors to O
// afterwards. The forward at four consumers (or two blocks of two an SM), after a row's first
// tile, takes try_exponentiate()
// instead: no maxima where the P it computes against the reference as it stands stay small (the
// common case).
#pragma once

#include "cuda/common/element.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/ptx.cuh"

namespace evoattn::cuda::hopper {

// The most a thread's 16 P of one row in a tile may sum to on try_exponentiate's fast path.
constexpr float kTileSumLimit = 1024.0f;
// From this magnitude of a row's reference max m (log2 units) on, exponentiate() takes each
// exponent as RN(y c) - m, not fma(y, c, -m): m = RN(y_max c) is rounded and the fma's product
// is not, so the row's largest P would be 2^r, |r| up to half of m's last place (2^7 at 2^31).
// Below it |r| <= 1.
constexpr float kExactExponentsFrom = 16777216.0f;  // 2^24

struct RowSoftmax {
  float row_max[2] = {neg_inf(), neg_inf()};  // reference maxima (quad-reduced); -inf: masked so far
  float row_sum[2] = {0.0f, 0.0f};            // this thread's partial sums
  float alpha[2] = {1.0f, 1.0f};              // the factors of the last update that moved
  float m_use[2] = {0.0f, 0.0f};              // the max to exponentiate against (0 while masked)

  // What update() decided for a tile: whether any row of the warp moved its reference, so O
  // needs rescale() (warp-uniform); the factor to exponentiate y with (c, or 1 for the exact form).
  struct Update {
    bool moved;
    float c;
  };

  // Takes a tile's scores y and c. `first`: the item's first tile (O and the sums are still
  // zero). A row's reference moves where the tile's max passes it by more than `slack`. Where a
  // row of the warp then has |m| >= kExactExponentsFrom, y is rounded to the log2 domain in place
  // for exponentiate()'s exact form (each exponent RN(y c) - m, so the row's max gives 2^0). Such
  // a warp takes the moving path every tile, so that vote runs only there and on the first tile.
  __device__ __forceinline__ Update update(float (&y)[32], float c, bool first, float slack = kRescaleSlack) {
    float local[2] = {fmaxf(y[0], y[1]), fmaxf(y[2], y[3])};
    for (int j = 1; j < 8; ++j) {
      local[0] = fmaxf(local[0], fmaxf(y[4 * j], y[4 * j + 1]));
      local[1] = fmaxf(local[1], fmaxf(y[4 * j + 2], y[4 * j + 3]));
    }
    for (int r = 0; r < 2; ++r) local[r] = __fmul_rn(local[r], c);  // c > 0: the max of x; -inf stays -inf
    Update u{false, c};
    if (first) {
      for (int r = 0; r < 2; ++r) row_max[r] = quad_max(local[r]);
      set_reference(y, u);
    } else {
      // The difference, not row_max + slack (online_softmax_lazy says why); NaN compares false.
      const float rise = fmaxf(local[0] - row_max[0], local[1] - row_max[1]);
      const bool huge = fmaxf(fabsf(m_use[0]), fabsf(m_use[1])) >= kExactExponentsFrom;
      if (__any_sync(0xffffffffu, rise > slack || huge)) {
        u.moved = true;
        for (int r = 0; r < 2; ++r) {
          const float tile_max = quad_max(local[r]);
          const float m_new = tile_max - row_max[r] > slack ? tile_max : row_max[r];
          const float m_ref = m_new == neg_inf() ? 0.0f : m_new;
          alpha[r] = exp2_approx(row_max[r] - m_ref);  // 1 if the row stays, 0 from -inf
          row_max[r] = m_new;
          row_sum[r] *= alpha[r];
        }
        set_reference(y, u);
      }
    }
    return u;
  }

  // P = 2^(y c - m) as the A operand of P V (m16n8k16 A fragments, 16 keys each), each row's
  // summed into sums[r].
  template <typename Element>
  __device__ __forceinline__ void exponentiate_into(const float (&y)[32], float c, uint32_t (&pa)[4][4],
                                                    float (&sums)[2]) const {
    for (int kp = 0; kp < 4; ++kp) {
      float e[8];
      for (int i = 0; i < 8; ++i) {
        const int r = (i >> 1) & 1;
        e[i] = exp2_approx(fmaf(y[8 * kp + i], c, -m_use[r]));
        sums[r] += e[i];
      }
      for (int i = 0; i < 4; ++i) pa[kp][i] = pack2<Element>(e[2 * i], e[2 * i + 1]);
    }
  }

  // P = 2^(y c - m) as the A operand of P V (m16n8k16 A fragments, 16 keys each), summed into the
  // rows; y and c as update() left them.
  template <typename Element>
  __device__ __forceinline__ void exponentiate(const float (&y)[32], float c, uint32_t (&pa)[4][4]) {
    exponentiate_into<Element>(y, c, pa, row_sum);
  }

  // The fast path of a tile after the item's first: P = 2^(y c - m) against the reference maxima
  // as they stand, with no maxima taken. Kept (and summed into the rows) where every row of the
  // warp has a reference below kExactExponentsFrom in magnitude (so finite: not masked so far)
  // and no thread's 16 P of a row sum past kTileSumLimit, so every P stays below 2^10 (in range
  // for 16-bit P and the float sums, as update()'s slack keeps it below 2^8). Else returns
  // false, pa holds garbage, and the caller takes update() with no slack (a reference the tile
  // passes moves to its max, so the next tiles fit again) and exponentiate(): after a rise of
  // about 6 or more, in a row masked so far or of huge scores, at a NaN.
  template <typename Element>
  __device__ __forceinline__ bool try_exponentiate(const float (&y)[32], float c, uint32_t (&pa)[4][4]) {
    float tile_sum[2] = {0.0f, 0.0f};
    exponentiate_into<Element>(y, c, pa, tile_sum);
    // NaN compares false: such a tile takes the slow path, which propagates it as before. So do
    // rows masked so far (-inf) and rows of huge scores (exponentiate()'s exact form), by one test.
    const bool fits = tile_sum[0] <= kTileSumLimit && tile_sum[1] <= kTileSumLimit &&
                      fabsf(row_max[0]) < kExactExponentsFrom && fabsf(row_max[1]) < kExactExponentsFrom;
    if (!__all_sync(0xffffffffu, fits)) return false;
    for (int r = 0; r < 2; ++r) row_sum[r] += tile_sum[r];
    return true;
  }

  // O (the C layout, kCols / 8 column tiles) times the last update's factors.
  template <int kHalf>
  __device__ __forceinline__ void rescale(float (&o)[kHalf]) const {
    for (int i = 0; i < kHalf; ++i) o[i] *= alpha[(i >> 1) & 1];
  }

  // The row's full sum (over the quad) into row_sum; returns 1 / sum (0 for a fully masked row).
  __device__ __forceinline__ float finish(int r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    row_sum[r] = sum;
    return sum == 0.0f ? 0.0f : 1.0f / sum;
  }

 private:
  // m_use from the reference maxima just set; the exact form where a row of the warp needs it.
  __device__ __forceinline__ void set_reference(float (&y)[32], Update& u) {
    for (int r = 0; r < 2; ++r) m_use[r] = row_max[r] == neg_inf() ? 0.0f : row_max[r];
    if (__any_sync(0xffffffffu, fmaxf(fabsf(m_use[0]), fabsf(m_use[1])) >= kExactExponentsFrom)) {
      for (int i = 0; i < 32; ++i) y[i] = __fmul_rn(y[i], u.c);
      u.c = 1.0f;
    }
  }

  __device__ __forceinline__ static float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
  }
};

}  // namespace evoattn::cuda::hopper
