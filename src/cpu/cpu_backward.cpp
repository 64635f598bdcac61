// CPU backward, in the same passes as the CUDA backward, each task owning what it writes
// (no atomics, so the result is bitwise identical for any thread count):
//
//   row statistics (workspace; see backend.h): Delta, row_max, row_log_sum
//   P  = exp(scale Q K^T + biases - row_max - row_log_sum),  dS = P * ((dO V^T - top_dp) - Delta)
//   exact Delta (float32, tiny head dims): Delta = sum_j P (dP - top_dp) from the very P and dP
//   tiles the passes below compute (backend.h says why)
//   pass dK/dV : task (b, n, h, key block),   loop over query blocks: dV += P^T dO, dK += dS^T Q~
//   pass dQ    : task (b, n, h, query block), loop over key blocks:   dQ += dS K, times scale
//   pass dbias : task over the dimensions the bias keeps, loop over the ones it broadcasts on
//
// Q~ = scale * Q, so dK needs no final scale.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend.h"
#include "common/half.h"
#include "cpu/parallel_for.h"
#include "cpu/tiles.h"

namespace evoattn {
namespace {

using namespace cpu;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t blocks(int64_t n, int block) { return (n + block - 1) / block; }

// The row-statistics arrays at the front of the workspace (top_dp: null unless shifted_delta).
struct RowStats {
  float* delta;
  float* row_max;
  float* row_log_sum;
  float* top_dp;

  explicit RowStats(const BwdParams& p)
      : delta(static_cast<float*>(p.workspace)),
        row_max(delta + num_rows(p)),
        row_log_sum(row_max + num_rows(p)),
        top_dp(shifted_delta(p) ? row_log_sum + num_rows(p) : nullptr) {}
};

// The query side of a tile: scaled Q, dO and the row statistics for `rows` rows from i0.
struct QueryTile {
  std::vector<float> q, d_o, row_max, row_log_sum, delta, top_dp;
  int64_t i0 = 0;
  int rows = 0;

  explicit QueryTile(int D)
      : q(kBlockQ * D), d_o(kBlockQ * D), row_max(kBlockQ), row_log_sum(kBlockQ), delta(kBlockQ),
        top_dp(kBlockQ) {}

  void load(const BwdParams& p, const RowStats& stats, int64_t b, int64_t n, int64_t h,
            int64_t first, int count) {
    i0 = first;
    rows = count;
    load_rows(q.data(), row_source(p.q, p.dtype, p.q_stride, b, n, h), i0, rows, p.D, p.scale);
    load_rows(d_o.data(), row_source(p.d_o, p.dtype, p.do_stride, b, n, h), i0, rows, p.D);
    const int64_t row = ((b * p.N + n) * p.H + h) * p.Lq + i0;
    for (int i = 0; i < rows; ++i) {
      row_max[i] = stats.row_max[row + i];
      row_log_sum[i] = stats.row_log_sum[row + i];
      delta[i] = stats.delta[row + i];
      top_dp[i] = stats.top_dp != nullptr ? stats.top_dp[row + i] : 0.0f;
    }
  }
};

// The key side: K and V transposed (for the score products) and K row-major (for dQ).
struct KeyTile {
  std::vector<float> kt, vt, k;
  int64_t j0 = 0;
  int cols = 0;

  explicit KeyTile(int D) : kt(D * kBlockK), vt(D * kBlockK), k(kBlockK * D) {}

  void load(const BwdParams& p, int64_t b, int64_t n, int64_t h, int64_t first, int count,
            bool want_rows) {
    j0 = first;
    cols = count;
    const RowSource k_src = row_source(p.k, p.dtype, p.k_stride, b, n, h);
    load_rows_transposed(kt.data(), cols, k_src, j0, cols, p.D);
    load_rows_transposed(vt.data(), cols, row_source(p.v, p.dtype, p.v_stride, b, n, h), j0, cols,
                         p.D);
    if (want_rows) load_rows(k.data(), k_src, j0, cols, p.D);
  }
};

// P and dP (rows x cols, row-major) of one tile, and the scores when asked. Fully masked rows
// (row_max = -inf) get 0 in P and dP: they contribute nothing.
void probs_and_dprobs(const BwdParams& p, int64_t b, int64_t n, int64_t h, const QueryTile& qt,
                      const KeyTile& kt, float* P, float* dP, float* scores_out = nullptr) {
  const int rows = qt.rows, cols = kt.cols;
  scores(P, qt.q.data(), kt.kt.data(), cols, p, b, n, h, qt.i0, rows, kt.j0, cols);
  if (scores_out != nullptr) std::copy(P, P + rows * cols, scores_out);
  matmul_abt(dP, qt.d_o.data(), kt.vt.data(), cols, rows, cols, p.D);
  for (int i = 0; i < rows; ++i) {
    float* pi = P + i * cols;
    float* dpi = dP + i * cols;
    if (qt.row_max[i] == kNegInf) {
      for (int j = 0; j < cols; ++j) pi[j] = dpi[j] = 0.0f;
      continue;
    }
    for (int j = 0; j < cols; ++j) pi[j] = std::exp((pi[j] - qt.row_max[i]) - qt.row_log_sum[i]);
  }
}

// P and dS = P * ((dP - top_dp) - Delta) of one tile.
void probs_and_dscores(const BwdParams& p, int64_t b, int64_t n, int64_t h, const QueryTile& qt,
                       const KeyTile& kt, float* P, float* dS) {
  probs_and_dprobs(p, b, n, h, qt, kt, P, dS);
  const int rows = qt.rows, cols = kt.cols;
  for (int i = 0; i < rows; ++i) {
    if (qt.row_max[i] == kNegInf) continue;
    for (int j = 0; j < cols; ++j) {
      dS[i * cols + j] = P[i * cols + j] * ((dS[i * cols + j] - qt.top_dp[i]) - qt.delta[i]);
    }
  }
}

// A row's max score and log sum_j exp(s_j - max), recomputed from its scores in one online pass.
struct RowRecompute {
  float row_max, row_log_sum;
};

RowRecompute recompute_row(const BwdParams& p, int64_t b, int64_t n, int64_t h, int64_t i,
                           const float* q) {
  const int D = p.D;
  const RowSource k_src = row_source(p.k, p.dtype, p.k_stride, b, n, h);
  std::vector<float> kt(D * kBlockK), s(kBlockK);
  float m = kNegInf, l = 0.0f;  // running max, sum exp(s - m)
  for (int64_t j0 = 0; j0 < p.Lk; j0 += kBlockK) {
    const int cols = static_cast<int>(std::min<int64_t>(kBlockK, p.Lk - j0));
    load_rows_transposed(kt.data(), cols, k_src, j0, cols, D);
    scores(s.data(), q, kt.data(), cols, p, b, n, h, i, 1, j0, cols);
    float block_max = kNegInf;
    for (int j = 0; j < cols; ++j) block_max = std::fmax(block_max, s[j]);
    if (block_max == kNegInf) continue;
    if (block_max > m) {
      l *= std::exp(m - block_max);
      m = block_max;
    }
    for (int j = 0; j < cols; ++j) l += std::exp(s[j] - m);
  }
  if (m == kNegInf) return RowRecompute{kNegInf, 0.0f};
  return RowRecompute{m, std::log(l)};
}

void compute_row_stats(const BwdParams& p, const RowStats& stats) {
  const int D = p.D;
  const bool delta_from_o = !exact_delta(p);
  parallel_for(p.B * p.N * p.H, p.num_threads, [&](int64_t task) {
    const int64_t h = task % p.H, n = task / p.H % p.N, b = task / (p.H * p.N);
    std::vector<float> o(kBlockQ * D), d_o(kBlockQ * D), q(kBlockQ * D);
    const int64_t lse_row = b * p.lse_stride_b + n * p.lse_stride_n + h * p.lse_stride_h;
    for (int64_t i0 = 0; i0 < p.Lq; i0 += kBlockQ) {
      const int rows = static_cast<int>(std::min<int64_t>(kBlockQ, p.Lq - i0));
      if (delta_from_o) {
        load_rows(o.data(), row_source(p.o, p.dtype, p.o_stride, b, n, h), i0, rows, D);
        load_rows(d_o.data(), row_source(p.d_o, p.dtype, p.do_stride, b, n, h), i0, rows, D);
      }
      load_rows(q.data(), row_source(p.q, p.dtype, p.q_stride, b, n, h), i0, rows, D, p.scale);
      for (int i = 0; i < rows; ++i) {
        const int64_t row = task * p.Lq + i0 + i;
        const float lse = p.lse[lse_row + (i0 + i) * p.lse_stride_q];
        float sum = 0.0f;
        if (delta_from_o) {
          for (int d = 0; d < D; ++d) sum += o[i * D + d] * d_o[i * D + d];
        }
        stats.delta[row] = sum;
        stats.row_max[row] = lse;
        stats.row_log_sum[row] = 0.0f;
        if (!recompute_row_stats(lse, D)) continue;
        const RowRecompute r = recompute_row(p, b, n, h, i0 + i, q.data() + i * D);
        stats.row_max[row] = r.row_max;
        stats.row_log_sum[row] = r.row_log_sum;
      }
    }
  });
}

// Delta = sum_j P (dP - top_dp) over the tiles of probs_and_dprobs, in key order, with top_dp
// the dP of the highest score so far (shifted_delta; else 0). When a higher score comes, the sum
// so far moves by (old top_dp - new top_dp) times the P summed so far: a rounding relative to
// that P mass, small in the one-hot rows the shift is for.
void exact_delta_pass(const BwdParams& p, const RowStats& stats) {
  const int D = p.D;
  const bool shift = stats.top_dp != nullptr;
  const int64_t q_blocks = blocks(p.Lq, kBlockQ);
  parallel_for(p.B * p.N * p.H * q_blocks, p.num_threads, [&](int64_t task) {
    const int64_t qb = task % q_blocks, bnh = task / q_blocks;
    const int64_t h = bnh % p.H, n = bnh / p.H % p.N, b = bnh / (p.H * p.N);
    QueryTile qt(D);
    KeyTile kt(D);
    qt.load(p, stats, b, n, h, qb * kBlockQ,
            static_cast<int>(std::min<int64_t>(kBlockQ, p.Lq - qb * kBlockQ)));
    std::vector<float> S(kBlockQ * kBlockK), P(kBlockQ * kBlockK), dP(kBlockQ * kBlockK);
    std::vector<float> delta(kBlockQ, 0.0f), mass(kBlockQ, 0.0f), top_s(kBlockQ, kNegInf);
    std::vector<float> top_dp(kBlockQ, 0.0f);
    for (int64_t j0 = 0; j0 < p.Lk; j0 += kBlockK) {
      kt.load(p, b, n, h, j0, static_cast<int>(std::min<int64_t>(kBlockK, p.Lk - j0)), false);
      probs_and_dprobs(p, b, n, h, qt, kt, P.data(), dP.data(), shift ? S.data() : nullptr);
      for (int i = 0; i < qt.rows; ++i) {
        for (int j = 0; j < kt.cols; ++j) {
          const float pij = P[i * kt.cols + j], dpij = dP[i * kt.cols + j];
          if (shift && S[i * kt.cols + j] > top_s[i]) {
            delta[i] += (top_dp[i] - dpij) * mass[i];
            top_s[i] = S[i * kt.cols + j];
            top_dp[i] = dpij;
          }
          delta[i] += pij * (dpij - top_dp[i]);
          mass[i] += pij;
        }
      }
    }
    for (int i = 0; i < qt.rows; ++i) {
      stats.delta[bnh * p.Lq + qt.i0 + i] = delta[i];
      if (shift) stats.top_dp[bnh * p.Lq + qt.i0 + i] = top_dp[i];
    }
  });
}

void dk_dv_pass(const BwdParams& p, const RowStats& stats) {
  const int D = p.D;
  const int64_t k_blocks = blocks(p.Lk, kBlockK);
  parallel_for(p.B * p.N * p.H * k_blocks, p.num_threads, [&](int64_t task) {
    const int64_t kb = task % k_blocks, h = task / k_blocks % p.H;
    const int64_t n = task / (k_blocks * p.H) % p.N, b = task / (k_blocks * p.H * p.N);
    QueryTile qt(D);
    KeyTile kt(D);
    kt.load(p, b, n, h, kb * kBlockK, static_cast<int>(std::min<int64_t>(kBlockK, p.Lk - kb * kBlockK)),
            false);
    std::vector<float> P(kBlockQ * kBlockK), dS(kBlockQ * kBlockK);
    std::vector<float> dk(kBlockK * D, 0.0f), dv(kBlockK * D, 0.0f);
    for (int64_t i0 = 0; i0 < p.Lq; i0 += kBlockQ) {
      qt.load(p, stats, b, n, h, i0, static_cast<int>(std::min<int64_t>(kBlockQ, p.Lq - i0)));
      probs_and_dscores(p, b, n, h, qt, kt, P.data(), dS.data());
      matmul_tn_acc(dv.data(), P.data(), qt.d_o.data(), qt.rows, kt.cols, D);
      matmul_tn_acc(dk.data(), dS.data(), qt.q.data(), qt.rows, kt.cols, D);
    }
    store_rows(p.dk, p.dtype, p.dk_stride, b, n, h, kt.j0, kt.cols, D, dk.data(), 1.0f);
    store_rows(p.dv, p.dtype, p.dv_stride, b, n, h, kt.j0, kt.cols, D, dv.data(), 1.0f);
  });
}

void dq_pass(const BwdParams& p, const RowStats& stats) {
  const int D = p.D;
  const int64_t q_blocks = blocks(p.Lq, kBlockQ);
  parallel_for(p.B * p.N * p.H * q_blocks, p.num_threads, [&](int64_t task) {
    const int64_t qb = task % q_blocks, h = task / q_blocks % p.H;
    const int64_t n = task / (q_blocks * p.H) % p.N, b = task / (q_blocks * p.H * p.N);
    QueryTile qt(D);
    KeyTile kt(D);
    qt.load(p, stats, b, n, h, qb * kBlockQ,
            static_cast<int>(std::min<int64_t>(kBlockQ, p.Lq - qb * kBlockQ)));
    std::vector<float> P(kBlockQ * kBlockK), dS(kBlockQ * kBlockK), dq(kBlockQ * D, 0.0f);
    for (int64_t j0 = 0; j0 < p.Lk; j0 += kBlockK) {
      kt.load(p, b, n, h, j0, static_cast<int>(std::min<int64_t>(kBlockK, p.Lk - j0)), true);
      probs_and_dscores(p, b, n, h, qt, kt, P.data(), dS.data());
      matmul_acc(dq.data(), dS.data(), kt.k.data(), qt.rows, kt.cols, D);
    }
    store_rows(p.dq, p.dtype, p.dq_stride, b, n, h, qt.i0, qt.rows, D, dq.data(), p.scale);
  });
}

// One range per score dimension: the task's own index where the bias keeps the dimension,
// the whole range where the gradient sums over it.
struct Range {
  int64_t begin, end;
};

Range task_range(bool reduced, int64_t index, int64_t count) {
  return reduced ? Range{0, count} : Range{index, index + 1};
}

void dbias_pass(const BwdParams& p, const RowStats& stats, const BiasGradParams& g) {
  const int D = p.D;
  const int64_t q_blocks = blocks(p.Lq, kBlockQ), k_blocks = blocks(p.Lk, kBlockK);
  const int64_t nb = g.reduce_b ? 1 : p.B, nn = g.reduce_n ? 1 : p.N, nh = g.reduce_h ? 1 : p.H;
  const int64_t nqb = g.reduce_q ? 1 : q_blocks, nkb = g.reduce_k ? 1 : k_blocks;
  const int acc_rows = g.reduce_q ? 1 : kBlockQ, acc_cols = g.reduce_k ? 1 : kBlockK;

  parallel_for(nb * nn * nh * nqb * nkb, p.num_threads, [&](int64_t task) {
    const int64_t kb = task % nkb, qb = task / nkb % nqb, h = task / (nkb * nqb) % nh;
    const int64_t n = task / (nkb * nqb * nh) % nn, b = task / (nkb * nqb * nh * nn);
    const Range rb = task_range(g.reduce_b, b, p.B), rn = task_range(g.reduce_n, n, p.N);
    const Range rh = task_range(g.reduce_h, h, p.H);
    const Range rq = task_range(g.reduce_q, qb, q_blocks), rk = task_range(g.reduce_k, kb, k_blocks);

    QueryTile qt(D);
    KeyTile kt(D);
    std::vector<float> P(kBlockQ * kBlockK), dS(kBlockQ * kBlockK);
    std::vector<float> acc(acc_rows * acc_cols, 0.0f), partial(acc_rows * acc_cols);
    for (int64_t bi = rb.begin; bi < rb.end; ++bi)
      for (int64_t ni = rn.begin; ni < rn.end; ++ni)
        for (int64_t hi = rh.begin; hi < rh.end; ++hi)
          for (int64_t kbi = rk.begin; kbi < rk.end; ++kbi) {
            kt.load(p, bi, ni, hi, kbi * kBlockK,
                    static_cast<int>(std::min<int64_t>(kBlockK, p.Lk - kbi * kBlockK)), false);
            for (int64_t qbi = rq.begin; qbi < rq.end; ++qbi) {
              qt.load(p, stats, bi, ni, hi, qbi * kBlockQ,
                      static_cast<int>(std::min<int64_t>(kBlockQ, p.Lq - qbi * kBlockQ)));
              probs_and_dscores(p, bi, ni, hi, qt, kt, P.data(), dS.data());
              // Sum the tile first, then add it: two-level sums keep float32 error small.
              std::fill(partial.begin(), partial.end(), 0.0f);
              for (int i = 0; i < qt.rows; ++i)
                for (int j = 0; j < kt.cols; ++j)
                  partial[(g.reduce_q ? 0 : i) * acc_cols + (g.reduce_k ? 0 : j)] += dS[i * kt.cols + j];
              for (size_t e = 0; e < acc.size(); ++e) acc[e] += partial[e];
            }
          }
    const int out_rows = g.reduce_q ? 1 : static_cast<int>(std::min<int64_t>(kBlockQ, p.Lq - qb * kBlockQ));
    const int out_cols = g.reduce_k ? 1 : static_cast<int>(std::min<int64_t>(kBlockK, p.Lk - kb * kBlockK));
    const int64_t base = b * g.stride.b + n * g.stride.n + h * g.stride.h;
    for (int i = 0; i < out_rows; ++i)
      for (int j = 0; j < out_cols; ++j) {
        const int64_t off = base + (qb * kBlockQ + i) * g.stride.q + (kb * kBlockK + j) * g.stride.k;
        store_from_float(g.ptr, g.dtype, off, acc[i * acc_cols + j]);
      }
  });
}

}  // namespace

evoattn_status_t cpu_backward(const BwdParams& p) {
  const RowStats stats(p);
  compute_row_stats(p, stats);
  if (exact_delta(p)) exact_delta_pass(p, stats);
  dk_dv_pass(p, stats);
  dq_pass(p, stats);
  for (const BiasGradParams& g : p.dbias) {
    if (g.requested) dbias_pass(p, stats, g);
  }
  return EVOATTN_SUCCESS;
}

}  // namespace evoattn
