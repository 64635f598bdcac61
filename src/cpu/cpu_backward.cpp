// CPU backward, in the same passes as the CUDA backward, each task owning what it writes
// (no atomics, so the result is bitwise identical for any thread count):
//
//   row statistics (workspace; see backend.h): Delta, row_max, row_log_sum
//   P  = exp(scale Q K^T + biases - row_max - row_log_sum),  dS = P * (dO V^T - Delta)
//   pass dK/dV : task (b, n, h, key block),   loop over query blocks: dV += P^T dO, dK += dS^T Q~
//   pass dQ    : task (b, n, h, query block), loop over key blocks:   dQ += dS K, times scale
//   pass dbias : task over the dimensions the bias keeps, loop over the ones it broadcasts on
//
// Q~ = scale * Q, so dK needs no final scale.
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

// The three row-statistics arrays at the front of the workspace.
struct RowStats {
  float* delta;
  float* row_max;
  float* row_log_sum;

  explicit RowStats(const BwdParams& p)
      : delta(static_cast<float*>(p.workspace)),
        row_max(delta + num_rows(p)),
        row_log_sum(row_max + num_rows(p)) {}
};

// The query side of a tile: scaled Q, dO and the row statistics for `rows` rows from i0.
struct QueryTile {
  std::vector<float> q, d_o, row_max, row_log_sum, delta;
  int64_t i0 = 0;
  int rows = 0;

  explicit QueryTile(int D)
      : q(kBlockQ * D), d_o(kBlockQ * D), row_max(kBlockQ), row_log_sum(kBlockQ), delta(kBlockQ) {}

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

// P and dS (rows x cols, row-major) of one tile. Fully masked rows (row_max = -inf) contribute
// nothing.
void probs_and_dscores(const BwdParams& p, int64_t b, int64_t n, int64_t h, const QueryTile& qt,
                       const KeyTile& kt, float* P, float* dS) {
  const int rows = qt.rows, cols = kt.cols;
  matmul_abt(P, qt.q.data(), kt.kt.data(), cols, rows, cols, p.D);
  add_biases(P, p, b, n, h, qt.i0, rows, kt.j0, cols);
  matmul_abt(dS, qt.d_o.data(), kt.vt.data(), cols, rows, cols, p.D);
  for (int i = 0; i < rows; ++i) {
    float* pi = P + i * cols;
    float* dsi = dS + i * cols;
    if (qt.row_max[i] == kNegInf) {
      for (int j = 0; j < cols; ++j) pi[j] = dsi[j] = 0.0f;
      continue;
    }
    for (int j = 0; j < cols; ++j) {
      pi[j] = std::exp((pi[j] - qt.row_max[i]) - qt.row_log_sum[i]);
      dsi[j] = pi[j] * (dsi[j] - qt.delta[i]);
    }
  }
}

// Row max and log-sum recomputed from one row's scores, and sum_j P dP when `want_delta`.
struct RowRecompute {
  float row_max, row_log_sum, delta;
};

RowRecompute recompute_row(const BwdParams& p, int64_t b, int64_t n, int64_t h, int64_t i,
                           const float* q, const float* d_o, bool want_delta) {
  const int D = p.D;
  const RowSource k_src = row_source(p.k, p.dtype, p.k_stride, b, n, h);
  const RowSource v_src = row_source(p.v, p.dtype, p.v_stride, b, n, h);
  std::vector<float> kt(D * kBlockK), vt(D * kBlockK), s(kBlockK), dp(kBlockK);
  // Online over key blocks: m = running max, l = sum exp(s - m), w = sum exp(s - m) dP.
  float m = kNegInf, l = 0.0f, w = 0.0f;
  for (int64_t j0 = 0; j0 < p.Lk; j0 += kBlockK) {
    const int cols = static_cast<int>(std::min<int64_t>(kBlockK, p.Lk - j0));
    load_rows_transposed(kt.data(), cols, k_src, j0, cols, D);
    matmul_abt(s.data(), q, kt.data(), cols, 1, cols, D);
    add_biases(s.data(), p, b, n, h, i, 1, j0, cols);
    if (want_delta) {
      load_rows_transposed(vt.data(), cols, v_src, j0, cols, D);
      matmul_abt(dp.data(), d_o, vt.data(), cols, 1, cols, D);
    }
    float block_max = kNegInf;
    for (int j = 0; j < cols; ++j) block_max = std::fmax(block_max, s[j]);
    if (block_max == kNegInf) continue;
    if (block_max > m) {
      const float alpha = std::exp(m - block_max);
      l *= alpha;
      w *= alpha;
      m = block_max;
    }
    for (int j = 0; j < cols; ++j) {
      const float e = std::exp(s[j] - m);
      l += e;
      if (want_delta) w += e * dp[j];
    }
  }
  if (m == kNegInf) return RowRecompute{kNegInf, 0.0f, 0.0f};
  return RowRecompute{m, std::log(l), w / l};
}

void compute_row_stats(const BwdParams& p, const RowStats& stats) {
  const int D = p.D;
  parallel_for(p.B * p.N * p.H, p.num_threads, [&](int64_t task) {
    const int64_t h = task % p.H, n = task / p.H % p.N, b = task / (p.H * p.N);
    std::vector<float> o(kBlockQ * D), d_o(kBlockQ * D), q(kBlockQ * D);
    const int64_t lse_row = b * p.lse_stride_b + n * p.lse_stride_n + h * p.lse_stride_h;
    for (int64_t i0 = 0; i0 < p.Lq; i0 += kBlockQ) {
      const int rows = static_cast<int>(std::min<int64_t>(kBlockQ, p.Lq - i0));
      load_rows(o.data(), row_source(p.o, p.dtype, p.o_stride, b, n, h), i0, rows, D);
      load_rows(d_o.data(), row_source(p.d_o, p.dtype, p.do_stride, b, n, h), i0, rows, D);
      load_rows(q.data(), row_source(p.q, p.dtype, p.q_stride, b, n, h), i0, rows, D, p.scale);
      for (int i = 0; i < rows; ++i) {
        const int64_t row = task * p.Lq + i0 + i;
        const float lse = p.lse[lse_row + (i0 + i) * p.lse_stride_q];
        float sum = 0.0f;
        for (int d = 0; d < D; ++d) sum += o[i * D + d] * d_o[i * D + d];
        stats.delta[row] = sum;
        stats.row_max[row] = lse;
        stats.row_log_sum[row] = 0.0f;
        if (!recompute_row_stats(lse, D)) continue;
        const RowRecompute r = recompute_row(p, b, n, h, i0 + i, q.data() + i * D,
                                             d_o.data() + i * D, D < kExactDeltaHeadDim);
        stats.row_max[row] = r.row_max;
        stats.row_log_sum[row] = r.row_log_sum;
        if (D < kExactDeltaHeadDim) stats.delta[row] = r.delta;
      }
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
  dk_dv_pass(p, stats);
  dq_pass(p, stats);
  for (const BiasGradParams& g : p.dbias) {
    if (g.requested) dbias_pass(p, stats, g);
  }
  return EVOATTN_SUCCESS;
}

}  // namespace evoattn
