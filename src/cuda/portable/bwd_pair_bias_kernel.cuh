// Backward, the pair bias's gradient over n, with 128 keys a block: the head-dim-32 and -64
// fast paths with a fast bias tile (pair_bias_key_pairs in launch_plan.h). The job of bwd_rows_kernel's
// RowsJob::kBiasOverN (see there): block (b, h, query tile, two key tiles) walks n, and for
// every n recomputes S = Q K^T, dP = dO V^T, P and dS = P (dP - Delta), summed in registers.
//
// Why: that pass copies Q, dO, K and V of every n from L2 for each 64 x 64 tile, and at the
// H100's own clocks it ran at 79% of L2 throughput (ncu, PERF v23). Here two key tiles share
// one copy of Q and dO: 3 bytes of copies per score instead of 4, and half the barriers per
// score. Each warp takes 16 queries x 128 keys (64 accumulators) in eight passes of 16 keys.
// Q, dO, K and V are stored unpadded with XOR-swizzled chunks (SwizzledRows32 / 64) and the
// bias raw (RawBiasTile, read by ldmatrix): three blocks of 66 KB fit an SM at head dim 32.
// At 64 two stages take 96 KB, and the bias would leave one block per SM: each warp holds its
// 16 x 128 raw bias in 32 registers instead, read once (the tiles staged where the second
// stage goes), so two blocks of 98.5 KB fit.
// Deterministic: every n in a fixed order, chunks summed in order by bias_grad_reduce_kernel.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "backend.h"
#include "cuda/portable/bwd_rows_kernel.cuh"
#include "cuda/common/element.cuh"
#include "cuda/kernel_launch.h"
#include "cuda/launch_plan.h"
#include "cuda/common/ptx.cuh"
#include "cuda/smem_budget.h"
#include "cuda/portable/tile_io.cuh"
#include "params.h"

namespace evoattn::cuda {

template <typename Element, int kHeadDim>
struct PairBiasTraits {
  static constexpr int kBlockM = kTile, kBlockN = 2 * kTile, kThreads = 128;
  static constexpr int kKeyPass = 16;  // keys of one S / dP pass of a warp
  using Rows = std::conditional_t<kHeadDim == 32, SwizzledRows32, SwizzledRows64>;
  static constexpr int kQueryElems = kBlockM * kHeadDim, kKeyElems = kBlockN * kHeadDim;
  static constexpr int kStageElems = 2 * kQueryElems + 2 * kKeyElems;  // Q, dO, K, V
  static constexpr int kRawElems = 2 * kTile * kTile;                   // two raw bias tiles
  // The warp's bias in registers (see above), its tiles staged in the second stage's space.
  static constexpr bool kBiasInRegs = kHeadDim == 64;
  // Two stages of Q, dO, K, V, of the row statistics and of the key biases; the raw bias tiles.
  static constexpr size_t kSmemBytes = 2 * kStageElems * sizeof(Element) +
                                       (kBiasInRegs ? 0 : kRawElems * sizeof(uint16_t)) +
                                       (2 * 3 * kBlockM + 2 * kBlockN) * sizeof(float);
  static_assert((kHeadDim == 32 || kHeadDim == 64) && sizeof(Element) == 2 && Rows::kRowElems == kHeadDim,
                "instantiated for the 16-bit head-dim-32 and -64 buckets");
  static_assert(kRawElems * sizeof(uint16_t) <= kStageElems * sizeof(Element), "the raw tiles fit a stage");
  static_assert(kSmemBytes * rows_blocks_per_sm(kHeadDim) <= 227 * 1024, "rows_blocks_per_sm blocks on sm_90");
};

// The thread's chunks (rows tid / kChunks + kPassRows k, chunk tid % kChunks) of a [kRows x
// row elements] tile of one (b, h) for consecutive n, as SeqTileNWalk: a 32-bit offset stepped
// by the n stride.
template <typename Element, typename Rows, int kRows>
struct SwizzledNWalk {
  static constexpr int kChunks = Rows::kRowElems / 8, kPassRows = 128 / kChunks;
  static constexpr int kPasses = kRows / kPassRows;
  int next;  // the thread's chunk of pass 0 in the next n, from the base (inside the tensor)
  int left;  // rows from the thread's first row to the end (0 past D)

  __device__ __forceinline__ SwizzledNWalk(const SeqStrides& s, int b, int n0, int h, int row0,
                                           int num_rows, int D, int tid) {
    const int row = tid / kChunks, d = (tid % kChunks) * 8;
    left = d < D ? num_rows - row0 - row : 0;
    next = bnh_offset(s, b, n0, h) + (left > 0 ? (row0 + row) * static_cast<int>(s.l) + d : 0);
  }

  __device__ __forceinline__ void copy_next(Element* tile, int row_stride, int n_stride,
                                           const Element* base, int tid) {
    // + kPassRows (a multiple of 8) rows a pass: the same swizzle.
    const int dst = Rows::at(tid / kChunks, tid % kChunks);
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
      const bool valid = kPassRows * k < left;
      cp_async_16(tile + dst + kPassRows * k * Rows::kRowElems,
                  base + (valid ? next + kPassRows * k * row_stride : 0), valid);
    }
    next += n_stride;
  }
};

template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(128, rows_blocks_per_sm(kHeadDim))
    bwd_pair_bias_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ LaunchPlan plan,
                         const __grid_constant__ RowsTask task) {
  using T = PairBiasTraits<Element, kHeadDim>;
  using Rows = typename T::Rows;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN;
  constexpr int kKSteps = kHeadDim / 16;
  constexpr int kPassTiles = T::kKeyPass / 8, kPasses = kBlockN / T::kKeyPass;

  // Touches nothing the kernels still running (the dK/dV pass, an earlier gradient) write, and
  // writes nothing they read (its outputs, its own partials): runs beside their last blocks.
  // Where the dK/dV pass writes Delta (LaunchPlan::delta_in_dkdv), a Delta copied while still
  // pending (kDeltaPending: only n of that pass's last blocks) is read again until written.
  launch_dependents();
  const WaitForPreviousGridAtExit wait_at_exit;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  Element* sSeq = reinterpret_cast<Element*>(smem_raw);  // [2 stages][Q | dO | K | V]
  // [2 key tiles], with kBiasInRegs in the second stage until every warp has read them.
  uint16_t* sRaw = reinterpret_cast<uint16_t*>(sSeq + (T::kBiasInRegs ? 1 : 2) * T::kStageElems);
  // [2][Delta, max, log-sum][kBlockM]
  float* sStats = reinterpret_cast<float*>(sSeq + 2 * T::kStageElems) + (T::kBiasInRegs ? 0 : T::kRawElems / 2);
  float* sKey = sStats + 2 * 3 * kBlockM;                          // [2][kBlockN]

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4, warp_row = warp * 16;
  // Grid: (key-tile pair, chunk), chunk fastest. The pair's first tile in task.blocks order
  // (rows_coord: key tile fastest; the key-tile count is even, so pairs never straddle rows).
  const int64_t pair = blockIdx.x / task.chunks, chunk = blockIdx.x % task.chunks;
  const int64_t first_block = 2 * pair;
  const int64_t it_begin = chunk * task.chunk_iters;
  const int64_t it_end = it_begin + task.chunk_iters < task.iters ? it_begin + task.chunk_iters : task.iters;
  const TileCoord c0 = rows_coord(task, p, plan, first_block, it_begin);
  // 32-bit (bwd_fast_path: LaunchPlan::offsets32).
  const int b = static_cast<int>(c0.b), h = static_cast<int>(c0.h), n0 = static_cast<int>(c0.n);
  const int i_first = static_cast<int>(c0.qt) * kBlockM, j_first = static_cast<int>(c0.kt) * kTile;
  const int lq = static_cast<int>(p.Lq), lk = static_cast<int>(p.Lk);

  SwizzledNWalk<Element, Rows, kBlockM> q_walk(p.q_stride, b, n0, h, i_first, lq, p.D, tid);
  SwizzledNWalk<Element, Rows, kBlockM> do_walk(p.do_stride, b, n0, h, i_first, lq, p.D, tid);
  SwizzledNWalk<Element, Rows, kBlockN> k_walk(p.k_stride, b, n0, h, j_first, lk, p.D, tid);
  SwizzledNWalk<Element, Rows, kBlockN> v_walk(p.v_stride, b, n0, h, j_first, lk, p.D, tid);
  // Row statistics: threads 0..63 one row each; zero past Lq, where the reader takes
  // row_max = +inf, so P = 0.
  const bool stats_row = tid < kBlockM && i_first + tid < lq;
  const int64_t stats_rows = num_rows(p);
  const float* stats_src = static_cast<const float*>(p.workspace) +
                           (stats_row ? ((c0.b * p.N + c0.n) * p.H + c0.h) * p.Lq + i_first + tid : 0);
  const int64_t stats_step = stats_row ? p.H * p.Lq : 0;
  auto load_stage = [&](int s) {
    Element* st = sSeq + s * T::kStageElems;
    q_walk.copy_next(st, static_cast<int>(p.q_stride.l), static_cast<int>(p.q_stride.n),
                     static_cast<const Element*>(p.q), tid);
    do_walk.copy_next(st + T::kQueryElems, static_cast<int>(p.do_stride.l), static_cast<int>(p.do_stride.n),
                      static_cast<const Element*>(p.d_o), tid);
    k_walk.copy_next(st + 2 * T::kQueryElems, static_cast<int>(p.k_stride.l), static_cast<int>(p.k_stride.n),
                     static_cast<const Element*>(p.k), tid);
    v_walk.copy_next(st + 2 * T::kQueryElems + T::kKeyElems, static_cast<int>(p.v_stride.l),
                     static_cast<int>(p.v_stride.n), static_cast<const Element*>(p.v), tid);
    if (tid < kBlockM) {
      float* dst = sStats + s * 3 * kBlockM + tid;
      cp_async_4(dst, stats_src, stats_row);
      cp_async_4(dst + kBlockM, stats_src + (stats_row ? stats_rows : 0), stats_row);
      cp_async_4(dst + 2 * kBlockM, stats_src + (stats_row ? 2 * stats_rows : 0), stats_row);
      stats_src += stats_step;
    }
  };

  load_stage(0);
  // The bias tiles are the same for every n (rows_task_over_n): copied once; columns past Lk
  // zero-filled.
  for (int r = 0; r < 2; ++r) {
    RawBiasTileStream<int32_t> copy;
    copy.start(p, plan, tid, b, n0, h, i_first, j_first + r * kTile);
    copy.copy_next(sRaw + r * kTile * kTile, plan, tid);
  }
  cp_async_commit();
  // kBlockN == kThreads: one key each (-inf past Lk, so P = 0 there).
  KeyBiasPrefetch key_bias;
  key_bias.start(p, plan, b, n0, h);
  key_bias.load<true>(p, plan, b, n0, h, j_first + tid);

  float acc[kBlockN / 8][4];
  for (int nt = 0; nt < kBlockN / 8; ++nt)
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;

  // The bias of the warp's rows and every pass's 16 keys (kBiasInRegs): raw words, unpacked
  // where used as read_rows would. The second barrier frees the second stage for n0 + 1.
  uint32_t bias_words[T::kBiasInRegs ? kPasses : 1][4];
  if constexpr (T::kBiasInRegs) {
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int key0 = pass * T::kKeyPass;
      RawBiasTile::read_rows_raw(sRaw + key0 / kTile * kTile * kTile, warp_row, key0 % kTile / 8, lane,
                                 bias_words[pass]);
    }
    __syncthreads();
  }

  int stage = 0;
  int n = n0;
  for (int64_t it = it_begin; it < it_end; ++it, ++n) {
    // One barrier per n: it publishes this n's stage and tells that every warp has finished
    // the previous n, whose stage the copies of the next n, issued after it, overwrite.
    float* keys = sKey + stage * kBlockN;
    keys[tid] = key_bias.value_log2<true>(p, plan);
    cp_async_wait<0>();
    // delta_in_dkdv (head-dim bucket 64 only): a row's Delta copied while still pending is read
    // again, by its copying thread, until the dK/dV pass has written it (stats_src is already
    // the next n's).
    if (kHeadDim == 64 && plan.delta_in_dkdv && stats_row) {
      float* delta = sStats + stage * 3 * kBlockM + tid;
      while (__float_as_uint(*delta) == kDeltaPending) {
        __nanosleep(256);
        *delta = load_relaxed_gpu(stats_src - stats_step);
      }
    }
    __syncthreads();
    if (it + 1 < it_end) {
      load_stage(stage ^ 1);
      cp_async_commit();
      key_bias.start(p, plan, b, n + 1, h);
      key_bias.load<true>(p, plan, b, n + 1, h, j_first + tid);
    }

    // This thread's rows g, g + 8 of the tile.
    float row_max[2], row_log_sum[2], dlt[2];
    {
      const float* stats = sStats + stage * 3 * kBlockM;
      for (int r = 0; r < 2; ++r) {
        const int row = warp_row + g + 8 * r;
        dlt[r] = stats[row];
        row_max[r] = i_first + row < lq ? stats[kBlockM + row] : -neg_inf();
        row_log_sum[r] = stats[2 * kBlockM + row];
      }
    }
    // A recomputed row (row_log_sum != 0, backend.h) needs the two-step exponent below.
    const bool exact_rows = __any_sync(0xffffffffu, row_log_sum[0] != 0.0f || row_log_sum[1] != 0.0f);

    const Element* Qs = sSeq + stage * T::kStageElems;
    const Element* dOs = Qs + T::kQueryElems;
    const Element* Ks = dOs + T::kQueryElems;
    const Element* Vs = Ks + T::kKeyElems;
    uint32_t q_frag[kKSteps][4], do_frag[kKSteps][4];
    for (int kk = 0; kk < kKSteps; ++kk) {
      const int off = Rows::at(warp_row + lane % 16, 2 * kk + lane / 16);
      ldmatrix_x4(q_frag[kk], Qs + off);
      ldmatrix_x4(do_frag[kk], dOs + off);
    }

#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      // S and dP of keys [key0, + kKeyPass); dP's accumulators start at -Delta of their rows, so
      // they end as dP - Delta and dS goes into the bias accumulator by one FFMA.
      float s[kPassTiles][4], dp[kPassTiles][4];
      for (int nt = 0; nt < kPassTiles; ++nt) {
        for (int e = 0; e < 4; ++e) {
          s[nt][e] = 0.0f;
          dp[nt][e] = -dlt[e / 2];
        }
      }
      for (int kk = 0; kk < kKSteps; ++kk) {
        for (int np = 0; np < kPassTiles / 2; ++np) {
          const int key = pass * T::kKeyPass + np * 16 + (lane & 7) + ((lane >> 4) << 3);
          s_dp_key_pair<Element>(s[2 * np], s[2 * np + 1], dp[2 * np], dp[2 * np + 1], q_frag[kk], do_frag[kk], Ks,
                                 Vs, Rows::at(key, 2 * kk + ((lane >> 3) & 1)));
        }
      }
      // The pass's bias: its raw tile, and its first 8-key column tile in it.
      float tb[kPassTiles][4];
      static_assert(kPassTiles == 2, "one ldmatrix_x4 of bias a pass");
      if constexpr (T::kBiasInRegs) {
        RawBiasTile::unpack_rows<Element>(bias_words[pass], tb[0], tb[1]);
      } else {
        const int key0 = pass * T::kKeyPass;
        RawBiasTile::read_rows<Element>(sRaw + key0 / kTile * kTile * kTile, warp_row, key0 % kTile / 8, lane,
                                        tb[0], tb[1]);
      }
      // Without recomputed rows in the warp, row_log_sum is 0: x - row_max alone is the same
      // value (one instruction per score less).
      auto gradients = [&](auto exact) {
#pragma unroll
        for (int nt = 0; nt < kPassTiles; ++nt) {
          const int nt_block = pass * kPassTiles + nt;
          const float2 kbias = *reinterpret_cast<const float2*>(keys + nt_block * 8 + 2 * t);
          for (int r = 0; r < 2; ++r) {
            const float x0 = score_log2(s[nt][2 * r], p.scale_log2, kbias.x, tb[nt][2 * r]);
            const float x1 = score_log2(s[nt][2 * r + 1], p.scale_log2, kbias.y, tb[nt][2 * r + 1]);
            const float p0 = exp2_approx(decltype(exact)::value ? (x0 - row_max[r]) - row_log_sum[r] : x0 - row_max[r]);
            const float p1 = exp2_approx(decltype(exact)::value ? (x1 - row_max[r]) - row_log_sum[r] : x1 - row_max[r]);
            acc[nt_block][2 * r] = fmaf(p0, dp[nt][2 * r], acc[nt_block][2 * r]);
            acc[nt_block][2 * r + 1] = fmaf(p1, dp[nt][2 * r + 1], acc[nt_block][2 * r + 1]);
          }
        }
      };
      if (exact_rows) {
        gradients(std::true_type{});
      } else {
        gradients(std::false_type{});
      }
    }
    stage ^= 1;
  }

  // Element (r, c) of the pair's two output tiles: to the gradient, or to this chunk's partial
  // tiles (as bwd_rows_kernel: [chunk][task.blocks][64 x 64]).
  const BiasGradParams& gp = p.dbias[task.grad_slot];
  const TileCoord out = rows_coord(task, p, plan, first_block, 0);
  const int64_t base = out.b * gp.stride.b + out.n * gp.stride.n + out.h * gp.stride.h;
#pragma unroll
  for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = warp_row + g + 8 * (e / 2), c = nt * 8 + 2 * t + (e % 2);
      if (i_first + r >= lq || j_first + c >= lk) continue;
      if (task.partials != nullptr) {
        task.partials[((chunk * task.blocks + first_block + c / kTile) * kTile + r) * kTile + c % kTile] = acc[nt][e];
      } else {
        store_any(gp.ptr, gp.dtype, base + (i_first + r) * gp.stride.q + (j_first + c) * gp.stride.k, acc[nt][e]);
      }
    }
  }
}

// The launch, then (chunked) the chunks' sum. The dispatch takes it where
// pair_bias_key_pairs holds.
template <typename Element, int kHeadDim>
cudaError_t run_bwd_pair_bias(const BwdParams& p, const LaunchPlan& plan, const RowsTask& task,
                              cudaStream_t stream) {
  using T = PairBiasTraits<Element, kHeadDim>;
  if (plan.tile_fast_slot < 0 || !rows_task_over_n(task, plan) || plan.k_tiles % 2 != 0) {
    return cudaErrorInvalidValue;
  }
  auto kernel = bwd_pair_bias_kernel<Element, kHeadDim>;
  if (cudaError_t err = reserve_smem(kernel, T::kSmemBytes)) return err;
  const int64_t pairs = task.blocks / 2;
  const size_t blocks = static_cast<size_t>(pairs * task.chunks);
  if (cudaError_t err = launch_kernel(kernel, blocks, T::kThreads, T::kSmemBytes, stream, p, plan, task)) return err;
  return task.partials == nullptr ? cudaSuccess : run_bias_grad_reduce(p, plan, task, stream);
}

}  // namespace evoattn::cuda
