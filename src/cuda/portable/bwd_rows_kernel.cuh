// Backward, query side, for float16 / bfloat16 on mma.sync. One kernel, two jobs:
//
//   dQ    : block = (b, n, h, 64 queries), iterating over key tiles:       dQ += dS K
//           (and dS itself into a bias gradient that sums over no index: RowsTask::direct_slots)
//   dbias : block = the indices the bias keeps, iterating over the ones it broadcasts on
//           (the pair bias: block (b, h, q-tile, k-tile), iterating over n): acc += dS,
//           then rows / columns of acc summed where the bias is 1 wide. Over n alone (the
//           pair bias, RowsJob::kBiasOverN) the copies step pointers by the n stride, the bias
//           tile is converted once, and Q / dO fragments are read per k-step (registers).
//           (At D = 24 / 32 on the fast path with one fast tile and an even key-tile count,
//           that job runs in blocks of two key tiles: bwd_pair_bias_kernel.cuh,
//           pair_bias_key_pairs.)
//   per (q-tile, k-tile): S = Q K^T, dP = dO V^T (per warp 16 queries x 64 keys)
//                         P = 2^(S scale log2 e + bias log2 e - row_max - row_log_sum),
//                         dS = P (dP - Delta)                  (row statistics: row_stats_kernel)
// Every output element is written by one block after a fixed-order loop: deterministic.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "backend.h"
#include "cuda/common/element.cuh"
#include "cuda/kernel_launch.h"
#include "cuda/launch_plan.h"
#include "cuda/common/ptx.cuh"
#include "cuda/smem_budget.h"
#include "cuda/portable/tile_io.cuh"
#include "params.h"

namespace evoattn::cuda {

template <typename Element, int kHeadDim>
struct BwdRowTraits {
  static constexpr int kBlockM = 64, kBlockN = 64, kThreads = 128;
  static constexpr int kRowStride = kHeadDim + 8;
  static constexpr int kTileStride = kBlockN + 8;  // row-major reads as in the forward
  static constexpr int kSeqElems = kBlockM * kRowStride;
  // Row statistics of a query tile, two stages: [stage][delta | row_max | row_log_sum][kBlockM].
  static constexpr int kStatsFloats = 2 * 3 * kBlockM;
  static constexpr size_t kSmemBytes =
      8 * kSeqElems * sizeof(Element) +
      (kBlockM * kTileStride + kBlockN + 4 * kBlockN + kStatsFloats) * sizeof(float);
  // Three blocks per SM for head dim <= 32 (registers capped at 168).
  static constexpr int kMinBlocksPerSm = rows_blocks_per_sm(kHeadDim);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
  static_assert(kBlockM == kTile && kBlockN == kTile, "the launch plan and partial tiles count kTile");
};

struct TileCoord {
  int64_t b, n, h, qt, kt;
};

// Coordinates of iteration `it` of grid block `block` (divisions: once per block).
__device__ __forceinline__ TileCoord rows_coord(const RowsTask& task, const BwdParams& p,
                                                const LaunchPlan& plan, int64_t block, int64_t it) {
  auto take = [&](bool looped, int64_t extent) {
    int64_t& x = looped ? it : block;
    const int64_t v = x % extent;
    x /= extent;
    return v;
  };
  TileCoord c;
  c.kt = take(task.loop_k, plan.k_tiles);
  c.qt = take(task.loop_q, plan.q_tiles);
  c.h = take(task.loop_h, p.H);
  c.n = take(task.loop_n, p.N);
  c.b = take(task.loop_b, p.B);
  return c;
}

// The next iteration's coordinates: an odometer over the looped dimensions, k-tile fastest.
__device__ __forceinline__ TileCoord rows_next(const RowsTask& task, const BwdParams& p,
                                               const LaunchPlan& plan, TileCoord c) {
  if (task.loop_k && ++c.kt < plan.k_tiles) return c;
  if (task.loop_k) c.kt = 0;
  if (task.loop_q && ++c.qt < plan.q_tiles) return c;
  if (task.loop_q) c.qt = 0;
  if (task.loop_h && ++c.h < p.H) return c;
  if (task.loop_h) c.h = 0;
  if (task.loop_n && ++c.n < p.N) return c;
  if (task.loop_n) c.n = 0;
  if (task.loop_b) ++c.b;
  return c;
}

// A warp's dS (rows row0 and row0 + 8, columns col0 + 8 nt + 2t and + 1) into each bias
// gradient that sums over no index (RowsTask::direct_slots): the gradient's tile itself,
// rounded once to its dtype as the bias job's store does.
template <typename Element, int kNTiles>
__device__ __forceinline__ void store_unsummed_grads(const float (&ds)[kNTiles][4], const BwdParams& p,
                                                     const RowsTask& task, const TileCoord& c, int64_t row0,
                                                     int64_t col0, int t) {
  for (int slot = 0; slot < kNumGradSlots; ++slot) {
    if (!((task.direct_slots >> slot) & 1u)) continue;
    const BiasGradParams& gp = p.dbias[slot];
    const bool pairs = (task.direct_pairs >> slot) & 1u;
    const int64_t base = c.b * gp.stride.b + c.n * gp.stride.n + c.h * gp.stride.h;
    for (int r = 0; r < 2; ++r) {
      const int64_t row = row0 + 8 * r;
      if (row >= p.Lq) continue;
      const int64_t at = base + row * gp.stride.q;
      for (int nt = 0; nt < kNTiles; ++nt) {
        const int64_t col = col0 + nt * 8 + 2 * t;
        const float v0 = ds[nt][2 * r], v1 = ds[nt][2 * r + 1];
        if (pairs && col + 1 < p.Lk) {
          *reinterpret_cast<uint32_t*>(static_cast<Element*>(gp.ptr) + at + col) = pack2<Element>(v0, v1);
        } else {
          if (col < p.Lk) store_any(gp.ptr, gp.dtype, at + col * gp.stride.k, v0);
          if (col + 1 < p.Lk) store_any(gp.ptr, gp.dtype, at + (col + 1) * gp.stride.k, v1);
        }
      }
    }
  }
}

// What one launch of bwd_rows_kernel computes.
enum class RowsJob {
  kDq,          // task.grad_slot < 0
  kBias,        // a bias gradient, any loop
  kBiasOverN,   // a bias gradient looping over n only (the pair bias), kFast: the Q, dO, K and V
                // copies step a pointer by the n stride instead of recomputing their addresses
};

// kFast: the plan satisfies bwd_fast_path(), and the generic paths are compiled out.
template <typename Element, int kHeadDim, RowsJob kJob, bool kFast>
__global__ void __launch_bounds__(128, BwdRowTraits<Element, kHeadDim>::kMinBlocksPerSm)
    bwd_rows_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ LaunchPlan plan,
                    const __grid_constant__ RowsTask task) {
  using T = BwdRowTraits<Element, kHeadDim>;
  constexpr bool kDq = kJob == RowsJob::kDq, kOverN = kJob == RowsJob::kBiasOverN;
  // Over n at head dims 32 and up, one barrier per n; head dim 16 keeps two (one was slower).
  constexpr bool kOneBarrier = kOverN && kHeadDim >= 32;
  static_assert(!kOverN || kFast, "the n walk copies 16-byte chunks");
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kRowStride = T::kRowStride;
  constexpr int kTileStride = T::kTileStride;
  constexpr int kNTiles = kBlockN / 8, kDTiles = kHeadDim / 8, kKSteps = kHeadDim / 16;

  // Touches nothing the kernels still running (the dK/dV pass, an earlier gradient) write, and
  // writes nothing they read (its outputs, its own partials): runs beside their last blocks.
  // Except where the dK/dV pass writes Delta (LaunchPlan::delta_in_dkdv): then it waits first.
  launch_dependents();
  const WaitForPreviousGridAtExit wait_at_exit;
  if (plan.delta_in_dkdv) wait_for_previous_grid();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Element* sQ = reinterpret_cast<Element*>(smem_raw);  // [2 stages] each
  Element* sdO = sQ + 2 * T::kSeqElems;
  Element* sK = sdO + 2 * T::kSeqElems;
  Element* sV = sK + 2 * T::kSeqElems;
  float* sTile = reinterpret_cast<float*>(sV + 2 * T::kSeqElems);
  float* sKey = sTile + kBlockM * kTileStride;
  float* sReduce = sKey + kBlockN;  // [4 warps][kBlockN] column sums
  float* sStats = sReduce + 4 * kBlockN;  // [2 stages][3][kBlockM]

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4, warp_row = warp * 16;
  const bool has_tile = plan.tile_slots != 0, fast_tile = plan.tile_fast_slot >= 0;
  const BiasFill fill = bias_fill_slice<T::kThreads>(false, tid, tid);
  // Grid: (tile block, chunk), chunk fastest; this block walks iterations [it_begin, it_end).
  const int64_t block = blockIdx.x / task.chunks, chunk = blockIdx.x % task.chunks;
  const int64_t it_begin = chunk * task.chunk_iters;
  const int64_t it_end = it_begin + task.chunk_iters < task.iters ? it_begin + task.chunk_iters : task.iters;

  using Copy = SeqTileCopy<Element, kBlockM, kHeadDim, 128>;
  using Walk = SeqTileNWalk<Element, kBlockM, kHeadDim, 128>;
  static_assert(kBlockM == kBlockN, "one copy shape for Q, dO, K and V tiles");
  TileCoord cur = rows_coord(task, p, plan, block, it_begin);
  // kOverN: every iteration is the next n of the same (b, h, q-tile, k-tile), and these walk
  // it (unused, and compiled out, otherwise).
  // 32-bit (bwd_fast_path: LaunchPlan::offsets32).
  const int i_first = static_cast<int>(cur.qt) * kBlockM, j_first = static_cast<int>(cur.kt) * kBlockN;
  const int lq = static_cast<int>(p.Lq), lk = static_cast<int>(p.Lk);
  auto walk = [&](const SeqStrides& st, int row0, int num_rows) {
    return Walk(st, static_cast<int>(cur.b), static_cast<int>(cur.n), static_cast<int>(cur.h), row0,
                num_rows, p.D, tid);
  };
  Walk q_walk = walk(p.q_stride, i_first, lq), do_walk = walk(p.do_stride, i_first, lq);
  Walk k_walk = walk(p.k_stride, j_first, lk), v_walk = walk(p.v_stride, j_first, lk);
  // Q and dO of a query tile into stage s, with its rows' statistics (threads 0..63 one row
  // each; zero past Lq, where the reader takes row_max = +inf, so P = 0).
  auto load_q = [&](const TileCoord& c, int s) {
    if (tid < kBlockM) {
      const int64_t i = c.qt * kBlockM + tid;
      const bool valid = i < p.Lq;
      const float* delta = static_cast<const float*>(p.workspace);
      const float* src = delta + (valid ? ((c.b * p.N + c.n) * p.H + c.h) * p.Lq + i : 0);
      float* dst = sStats + s * 3 * kBlockM + tid;
      const int64_t rows = num_rows(p);
      cp_async_4(dst, src, valid);
      cp_async_4(dst + kBlockM, src + (valid ? rows : 0), valid);
      cp_async_4(dst + 2 * kBlockM, src + (valid ? 2 * rows : 0), valid);
    }
    if constexpr (kOverN) {
      q_walk.copy_next(sQ + s * T::kSeqElems, lq - i_first, p.D, static_cast<int>(p.q_stride.l),
                       static_cast<int>(p.q_stride.n), static_cast<const Element*>(p.q), tid);
      do_walk.copy_next(sdO + s * T::kSeqElems, lq - i_first, p.D, static_cast<int>(p.do_stride.l),
                        static_cast<int>(p.do_stride.n), static_cast<const Element*>(p.d_o), tid);
      return;
    }
    Copy{row_ptr<Element>(p.q, p.q_stride, c.b, c.n, c.h)}.copy(
        sQ + s * T::kSeqElems, c.qt * kBlockM, p.Lq, p.D, (kFast || plan.vec_q), tid);
    Copy{row_ptr<Element>(p.d_o, p.do_stride, c.b, c.n, c.h)}.copy(
        sdO + s * T::kSeqElems, c.qt * kBlockM, p.Lq, p.D, (kFast || plan.vec_do), tid);
  };
  auto load_kv = [&](const TileCoord& c, int s) {
    if constexpr (kOverN) {
      k_walk.copy_next(sK + s * T::kSeqElems, lk - j_first, p.D, static_cast<int>(p.k_stride.l),
                       static_cast<int>(p.k_stride.n), static_cast<const Element*>(p.k), tid);
      v_walk.copy_next(sV + s * T::kSeqElems, lk - j_first, p.D, static_cast<int>(p.v_stride.l),
                       static_cast<int>(p.v_stride.n), static_cast<const Element*>(p.v), tid);
      return;
    }
    Copy{row_ptr<Element>(p.k, p.k_stride, c.b, c.n, c.h)}.copy(
        sK + s * T::kSeqElems, c.kt * kBlockN, p.Lk, p.D, (kFast || plan.vec_k), tid);
    Copy{row_ptr<Element>(p.v, p.v_stride, c.b, c.n, c.h)}.copy(
        sV + s * T::kSeqElems, c.kt * kBlockN, p.Lk, p.D, (kFast || plan.vec_v), tid);
  };

  // The output tile: looped coordinates at 0, where the gradient has stride 0 anyway.
  const TileCoord out = rows_coord(task, p, plan, block, 0);
  load_q(cur, 0);
  load_kv(cur, 0);
  cp_async_commit();
  BiasTilePrefetch<Element> prefetch;
  if (fast_tile) prefetch.load(p, plan, fill, cur.b, cur.n, cur.h, cur.qt * kBlockM, cur.kt * kBlockN);
  KeyBiasPrefetch key_bias;
  const bool key_filler = tid < kBlockN;
  if (key_filler) {
    key_bias.start(p, plan, cur.b, cur.n, cur.h);
    key_bias.load<kFast>(p, plan, cur.b, cur.n, cur.h, cur.kt * kBlockN + tid);
  }
  int q_stage = 0, kv_stage = 0;
  bool fresh_q = true, fresh_tile = true;
  if constexpr (kOverN) {
    // The bias tile is the same for every n (rows_task_over_n): converted once, here (the
    // loop's first barrier publishes it), so its raw registers are free during the loop.
    if (fast_tile) prefetch.store(sTile, kTileStride, fill);
    fresh_tile = false;
  }
  // Whether the bias tile of `next` differs from `cur`'s (the pair bias over an n loop: never).
  auto tile_changes = [&](const TileCoord& a, const TileCoord& c) {
    return a.qt != c.qt || (plan.tile_varies_b && a.b != c.b) ||
           (!plan.tile_shared_over_n && a.n != c.n) || (plan.tile_varies_h && a.h != c.h) ||
           (plan.tile_varies_k && a.kt != c.kt);
  };
  uint32_t q_frag[kKSteps][4], do_frag[kKSteps][4];
  // k-step kk of the Q and dO fragments of the query tile in stage q_stage. The dQ job reads
  // them all when the tile arrives (it keeps them over its key loop); the bias jobs read each
  // where used, so only one k-step's are live beside S, dP and the bias accumulators
  // (registers: the D <= 32 loop spilled; over n they are new each iteration anyway).
  auto read_q_frags = [&](int kk) {
    const int off = q_stage * T::kSeqElems + (warp_row + lane % 16) * kRowStride + kk * 16 +
                    (lane / 16) * 8;
    ldmatrix_x4(q_frag[kk], sQ + off);
    ldmatrix_x4(do_frag[kk], sdO + off);
  };
  float row_max[2], row_log_sum[2], dlt[2];
  bool exact_rows = true;
  float acc_dq[kDTiles][4], acc[kNTiles][4];
  for (int d = 0; d < kDTiles; ++d)
    for (int e = 0; e < 4; ++e) acc_dq[d][e] = 0.0f;
  for (int nt = 0; nt < kNTiles; ++nt)
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;

  for (int64_t it = it_begin; it < it_end; ++it) {
    const int64_t i0 = cur.qt * kBlockM, j0 = cur.kt * kBlockN;
    if (fresh_tile) {
      if (fast_tile) {
        prefetch.store(sTile, kTileStride, fill);
      } else if (!kFast && has_tile) {
        fill_bias_tile_generic(sTile, kTileStride, fill, p, plan, cur.b, cur.n, cur.h, i0, j0);
      }
    }
    // kOneBarrier, one barrier per n: it publishes this n's stages and tells that every warp has
    // left the previous n, whose stages the next n's copies, issued after it, overwrite. The
    // key biases alternate between sKey and the first row of sReduce (unused over n).
    const int key_buf = kOneBarrier ? static_cast<int>(it - it_begin) % 2 * kBlockN : 0;
    if (key_filler) sKey[key_buf + tid] = key_bias.value_log2<kFast>(p, plan);
    if constexpr (kOneBarrier) {
      cp_async_wait<0>();
      __syncthreads();
    }
    TileCoord next = cur;
    bool next_q = false, next_kv = false, next_tile = false;
    if (it + 1 < it_end) {
      if constexpr (kOverN) {
        ++next.n;
        next_q = next_kv = true;
        next_tile = false;
      } else {
        next = rows_next(task, p, plan, cur);
        const bool same_bnh = next.b == cur.b && next.n == cur.n && next.h == cur.h;
        next_q = !(same_bnh && next.qt == cur.qt);
        next_kv = !(same_bnh && next.kt == cur.kt);
        next_tile = tile_changes(next, cur);
      }
      if (next_q) load_q(next, q_stage ^ 1);
      if (next_kv) load_kv(next, kv_stage ^ 1);
      cp_async_commit();
      if (fast_tile && next_tile) {
        prefetch.load(p, plan, fill, next.b, next.n, next.h, next.qt * kBlockM, next.kt * kBlockN);
      }
      if (key_filler) {
        key_bias.start(p, plan, next.b, next.n, next.h);
        key_bias.load<kFast>(p, plan, next.b, next.n, next.h, next.kt * kBlockN + tid);
      }
      if constexpr (!kOneBarrier) cp_async_wait<1>();
    } else if constexpr (!kOneBarrier) {
      cp_async_wait<0>();
    }
    if constexpr (!kOneBarrier) __syncthreads();

    if (fresh_q) {
      if constexpr (kDq) {
        for (int kk = 0; kk < kKSteps; ++kk) read_q_frags(kk);
      }
      // This thread's rows g, g + 8 of the tile (cur's: fresh_q means cur.qt's were loaded).
      const float* stats = sStats + q_stage * 3 * kBlockM;
      for (int r = 0; r < 2; ++r) {
        const int row = warp_row + g + 8 * r;
        const bool inside = cur.qt * kBlockM + row < p.Lq;
        dlt[r] = stats[row];
        row_max[r] = inside ? stats[kBlockM + row] : -neg_inf();
        row_log_sum[r] = stats[2 * kBlockM + row];
      }
      // A recomputed row (row_log_sum != 0, backend.h) needs the two-step exponent below.
      exact_rows = __any_sync(0xffffffffu, row_log_sum[0] != 0.0f || row_log_sum[1] != 0.0f);
    }

    // S = Q K^T and dP = dO V^T.
    const Element* Ks = sK + kv_stage * T::kSeqElems;
    const Element* Vs = sV + kv_stage * T::kSeqElems;
    // Over n, dP's accumulators start at -Delta of their rows, so they end as dP - Delta, and
    // dS goes into the bias accumulator by one FFMA (the other jobs' loops spilled that way).
    float s[kNTiles][4], dp[kNTiles][4];
    for (int nt = 0; nt < kNTiles; ++nt) {
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = 0.0f;
        dp[nt][e] = kOverN ? -dlt[e / 2] : 0.0f;
      }
    }
    for (int kk = 0; kk < kKSteps; ++kk) {
      if constexpr (!kDq) read_q_frags(kk);
      for (int np = 0; np < kNTiles / 2; ++np) {
        const int key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
        s_dp_key_pair<Element>(s[2 * np], s[2 * np + 1], dp[2 * np], dp[2 * np + 1], q_frag[kk], do_frag[kk], Ks, Vs,
                               key * kRowStride + kk * 16 + ((lane >> 3) & 1) * 8);
      }
    }
    // Key biases are stored times log2(e); the tile in natural units. float2 reads: a row
    // stride of 72 words keeps a half-warp's rows g = 0..3 in disjoint banks.
    // Without recomputed rows in the warp, row_log_sum is 0: x - row_max alone is exact (one
    // instruction per score less).
    auto gradients = [&](auto exact) {
      for (int nt = 0; nt < kNTiles; ++nt) {
        const int c = nt * 8 + 2 * t;
        const float2 kb = *reinterpret_cast<const float2*>(sKey + key_buf + c);
        for (int r = 0; r < 2; ++r) {
          const float2 tb = has_tile ? *reinterpret_cast<const float2*>(
                                           sTile + (warp_row + g + 8 * r) * kTileStride + c)
                                     : make_float2(0.0f, 0.0f);
          const float x0 = score_log2(s[nt][2 * r], p.scale_log2, kb.x, tb.x);
          const float x1 = score_log2(s[nt][2 * r + 1], p.scale_log2, kb.y, tb.y);
          const float p0 = exp2_approx(decltype(exact)::value ? (x0 - row_max[r]) - row_log_sum[r] : x0 - row_max[r]);
          const float p1 = exp2_approx(decltype(exact)::value ? (x1 - row_max[r]) - row_log_sum[r] : x1 - row_max[r]);
          // dS = P (dP - Delta): for dQ's mma, or summed into the bias accumulator.
          if constexpr (kOverN) {
            acc[nt][2 * r] = fmaf(p0, dp[nt][2 * r], acc[nt][2 * r]);
            acc[nt][2 * r + 1] = fmaf(p1, dp[nt][2 * r + 1], acc[nt][2 * r + 1]);
          } else {
            dp[nt][2 * r] = p0 * (dp[nt][2 * r] - dlt[r]);
            dp[nt][2 * r + 1] = p1 * (dp[nt][2 * r + 1] - dlt[r]);
          }
        }
      }
    };
    if (kFast && !exact_rows) {  // the generic variant keeps one copy of the loop (registers)
      gradients(std::false_type{});
    } else {
      gradients(std::true_type{});
    }

    if (kDq) {
      // dQ += dS K: dS from the accumulators as the A operand, K read transposed.
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[4];
        accumulators_to_a<Element>(dp[2 * kk], dp[2 * kk + 1], a);
        for (int dq = 0; dq < kDTiles / 2; ++dq) {
          uint32_t kb[4];
          const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
          ldmatrix_x4_trans(kb, Ks + key * kRowStride + dq * 16 + (lane >> 4) * 8);
          mma_16816<Element>(acc_dq[2 * dq], a, {kb[0], kb[1]});
          mma_16816<Element>(acc_dq[2 * dq + 1], a, {kb[2], kb[3]});
        }
      }
      if (task.direct_slots != 0) store_unsummed_grads<Element>(dp, p, task, cur, i0 + warp_row + g, j0, t);
    } else if constexpr (!kOverN) {
      for (int nt = 0; nt < kNTiles; ++nt)
        for (int e = 0; e < 4; ++e) acc[nt][e] += dp[nt][e];
    }
    if constexpr (!kOneBarrier) __syncthreads();
    if (next_q) q_stage ^= 1;
    if (next_kv) kv_stage ^= 1;
    fresh_q = next_q;
    fresh_tile = next_tile;
    cur = next;
  }

  if (kDq) {
    const float scale[2] = {p.scale, p.scale};
    Element* dq = static_cast<Element*>(p.dq) + out.b * p.dq_stride.b + out.n * p.dq_stride.n +
                  out.h * p.dq_stride.h;
    store_acc_rows<Element, kDTiles>(acc_dq, dq, p.dq_stride.l, p.dq_stride.d,
                                     out.qt * kBlockM + warp_row, p.Lq, p.D, plan.pairs_dq, lane,
                                     scale);
    return;
  }

  // Bias gradient: sum the accumulator over keys (within quads and tiles) and/or over query
  // rows (within the warp, then across warps in a fixed order), then store element (r, c) of
  // the block's output tile: to the gradient, or to this chunk's partial tile.
  const BiasGradParams& gp = p.dbias[task.grad_slot];
  const bool sum_k = task.loop_k, sum_q = task.loop_q;
  const int64_t base = out.b * gp.stride.b + out.n * gp.stride.n + out.h * gp.stride.h;
  const int64_t i0 = out.qt * kBlockM, j0 = out.kt * kBlockN;
  float* partial = task.partials ? task.partials + (chunk * task.blocks + block) * kTile * kTile : nullptr;
  auto store = [&](int r, int c, float v) {
    if (i0 + r >= p.Lq || j0 + c >= p.Lk) return;
    if (partial) {
      partial[r * kTile + c] = v;
    } else {
      store_any(gp.ptr, gp.dtype, base + (i0 + r) * gp.stride.q + (j0 + c) * gp.stride.k, v);
    }
  };
  if (sum_k) {
    for (int r = 0; r < 2; ++r) {
      float v = 0.0f;
      for (int nt = 0; nt < kNTiles; ++nt) v += acc[nt][2 * r] + acc[nt][2 * r + 1];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      acc[0][2 * r] = v;  // row sum of rows g, g + 8
    }
    if (!sum_q) {
      for (int r = 0; r < 2; ++r) {
        if (t == 0) store(warp_row + g + 8 * r, 0, acc[0][2 * r]);
      }
      return;
    }
    // Both summed: fold into column 0 of the column-sum path below.
    for (int nt = 0; nt < kNTiles; ++nt)
      for (int e = 0; e < 4; ++e) acc[nt][e] = (nt == 0 && t == 0 && e % 2 == 0) ? acc[0][e] : 0.0f;
  }
  if (sum_q) {
    // Column sums: rows g and g + 8, then the eight g of the warp, then the four warps.
    for (int nt = 0; nt < kNTiles; ++nt) {
      for (int e = 0; e < 2; ++e) {
        float v = acc[nt][e] + acc[nt][e + 2];
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        if (g == 0) sReduce[warp * kBlockN + nt * 8 + 2 * t + e] = v;
      }
    }
    __syncthreads();
    if (tid < kBlockN && (!sum_k || tid == 0)) {
      store(0, tid, sReduce[tid] + sReduce[kBlockN + tid] + sReduce[2 * kBlockN + tid] +
                        sReduce[3 * kBlockN + tid]);
    }
    return;
  }
  for (int nt = 0; nt < kNTiles; ++nt) {
    for (int e = 0; e < 4; ++e) store(warp_row + g + 8 * (e / 2), nt * 8 + 2 * t + (e % 2), acc[nt][e]);
  }
}

// Sums the chunks' partial tiles in chunk order and writes the bias gradient. (static: every
// instantiation file includes this header.) Four blocks a tile, each thread four consecutive
// elements of a row: one 16-byte load per chunk, the tile's coordinates once per block (per
// element they were most of its instructions).
constexpr int kReduceThreads = 256, kReduceBlocksPerTile = kTile * kTile / (4 * kReduceThreads);
static __global__ void __launch_bounds__(kReduceThreads)
    bias_grad_reduce_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ LaunchPlan plan,
                            const __grid_constant__ RowsTask task) {
  start_after_previous_grid();  // before any global memory access (kernel_launch.h)
  const int64_t block = blockIdx.x / kReduceBlocksPerTile;
  const int e = (blockIdx.x % kReduceBlocksPerTile) * (4 * kReduceThreads) + 4 * threadIdx.x;
  const int r = e / kTile, c = e % kTile;
  const TileCoord out = rows_coord(task, p, plan, block, 0);
  const int64_t i = out.qt * kTile + r, j = out.kt * kTile + c;
  if ((task.loop_q && r > 0) || i >= p.Lq || j >= p.Lk) return;
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float4* src = reinterpret_cast<const float4*>(task.partials + block * kTile * kTile + e);
  const int64_t chunk_step = task.blocks * kTile * kTile / 4;
  for (int64_t chunk = 0; chunk < task.chunks; ++chunk) {
    const float4 x = __ldcg(src + chunk * chunk_step);
    v.x += x.x;
    v.y += x.y;
    v.z += x.z;
    v.w += x.w;
  }
  const BiasGradParams& gp = p.dbias[task.grad_slot];
  const int64_t at = out.b * gp.stride.b + out.n * gp.stride.n + out.h * gp.stride.h + i * gp.stride.q;
  const float values[4] = {v.x, v.y, v.z, v.w};
  for (int q = 0; q < 4; ++q) {
    if ((task.loop_k && c + q > 0) || j + q >= p.Lk) break;
    store_any(gp.ptr, gp.dtype, at + (j + q) * gp.stride.k, values[q]);
  }
}

// After a chunked gradient's kernel (task.partials set): sums its partials in chunk order.
static inline cudaError_t run_bias_grad_reduce(const BwdParams& p, const LaunchPlan& plan, const RowsTask& task,
                                               cudaStream_t stream) {
  return launch_kernel(bias_grad_reduce_kernel, static_cast<size_t>(task.blocks * kReduceBlocksPerTile),
                       kReduceThreads, 0, stream, p, plan, task);
}

template <typename Element, int kHeadDim, bool kFast>
cudaError_t run_bwd_rows(const BwdParams& p, const LaunchPlan& plan, const RowsTask& task,
                         cudaStream_t stream) {
  using T = BwdRowTraits<Element, kHeadDim>;
  auto kernel = task.grad_slot < 0 ? bwd_rows_kernel<Element, kHeadDim, RowsJob::kDq, kFast>
                                   : bwd_rows_kernel<Element, kHeadDim, RowsJob::kBias, kFast>;
  if constexpr (kFast) {
    if (rows_task_over_n(task, plan)) {
      kernel = bwd_rows_kernel<Element, kHeadDim, RowsJob::kBiasOverN, true>;
    }
  }
  if (cudaError_t err = reserve_smem(kernel, T::kSmemBytes)) return err;
  const size_t blocks = static_cast<size_t>(task.blocks * task.chunks);
  if (cudaError_t err = launch_kernel(kernel, blocks, T::kThreads, T::kSmemBytes, stream, p, plan, task)) return err;
  return task.partials == nullptr ? cudaSuccess : run_bias_grad_reduce(p, plan, task, stream);
}

}  // namespace evoattn::cuda
