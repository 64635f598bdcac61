// CPU forward: one task per (b, n, h, block of kBlockQ query rows).
//
//   Q~ = scale * Q[rows]                        (float32 tile)
//   for each block of kBlockK keys:
//     S = Q~ K^T + biases                       (kBlockQ x kBlockK scores, never more)
//     m' = max(m, rowmax S); P = exp(S - m'); l = l * exp(m - m') + rowsum P
//     acc = acc * exp(m - m') + P V
//   O = acc / l, LSE = m + log l                (l = 0: a fully masked row, O = 0, LSE = -inf)
#include <cmath>
#include <limits>
#include <vector>

#include "backend.h"
#include "cpu/parallel_for.h"
#include "cpu/tiles.h"

namespace evoattn {

evoattn_status_t cpu_forward(const FwdParams& p) {
  using namespace cpu;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int D = p.D;
  const int64_t q_blocks = (p.Lq + kBlockQ - 1) / kBlockQ;

  parallel_for(p.B * p.N * p.H * q_blocks, p.num_threads, [&](int64_t task) {
    const int64_t qb = task % q_blocks;
    const int64_t h = task / q_blocks % p.H;
    const int64_t n = task / (q_blocks * p.H) % p.N;
    const int64_t b = task / (q_blocks * p.H * p.N);
    const int64_t i0 = qb * kBlockQ;
    const int rows = static_cast<int>(std::min<int64_t>(kBlockQ, p.Lq - i0));

    std::vector<float> q(kBlockQ * D), kt(D * kBlockK), v(kBlockK * D), s(kBlockQ * kBlockK);
    std::vector<float> acc(kBlockQ * D, 0.0f), m(kBlockQ, kNegInf), l(kBlockQ, 0.0f);
    load_rows(q.data(), row_source(p.q, p.dtype, p.q_stride, b, n, h), i0, rows, D, p.scale);
    const RowSource k_src = row_source(p.k, p.dtype, p.k_stride, b, n, h);
    const RowSource v_src = row_source(p.v, p.dtype, p.v_stride, b, n, h);

    for (int64_t j0 = 0; j0 < p.Lk; j0 += kBlockK) {
      const int cols = static_cast<int>(std::min<int64_t>(kBlockK, p.Lk - j0));
      load_rows_transposed(kt.data(), cols, k_src, j0, cols, D);
      load_rows(v.data(), v_src, j0, cols, D);
      scores(s.data(), q.data(), kt.data(), cols, p, b, n, h, i0, rows, j0, cols);
      for (int i = 0; i < rows; ++i) {
        float* si = s.data() + i * cols;
        float row_max = kNegInf;
        for (int j = 0; j < cols; ++j) row_max = std::fmax(row_max, si[j]);
        const float m_new = std::fmax(m[i], row_max);
        // While every key so far is masked, exponentiate against 0 so -inf - -inf never occurs.
        const float m_use = m_new == kNegInf ? 0.0f : m_new;
        const float alpha = std::exp(m[i] - m_use);
        float sum = 0.0f;
        for (int j = 0; j < cols; ++j) {
          si[j] = std::exp(si[j] - m_use);
          sum += si[j];
        }
        l[i] = l[i] * alpha + sum;
        m[i] = m_new;
        for (int d = 0; d < D; ++d) acc[i * D + d] *= alpha;
      }
      matmul_acc(acc.data(), s.data(), v.data(), rows, cols, D);
    }

    for (int i = 0; i < rows; ++i) {
      const float inv = l[i] == 0.0f ? 0.0f : 1.0f / l[i];
      for (int d = 0; d < D; ++d) acc[i * D + d] *= inv;
      if (p.lse != nullptr) {
        const float lse = l[i] == 0.0f ? kNegInf : m[i] + std::log(l[i]);
        p.lse[b * p.lse_stride_b + n * p.lse_stride_n + h * p.lse_stride_h +
              (i0 + i) * p.lse_stride_q] = lse;
      }
    }
    store_rows(p.o, p.dtype, p.o_stride, b, n, h, i0, rows, D, acc.data(), 1.0f);
  });
  return EVOATTN_SUCCESS;
}

}  // namespace evoattn
