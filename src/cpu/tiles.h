// Tile helpers for the CPU backend: gather strided rows into float32 tiles, add the biases of a
// score tile, and the three small matrix products the passes need. Destination first.
// Inner loops run over a contiguous index so the compiler vectorises them.
#pragma once

#include <cstdint>

#include "params.h"

namespace evoattn::cpu {

// Query rows per tile and keys per tile: a 32 x 64 float score tile plus the Q/K/V tiles for
// D = 128 stay within a 256 KiB L2 slice per core.
constexpr int kBlockQ = 32;
constexpr int kBlockK = 64;

// Where rows of a [B, N, L, H, D] tensor start for one (b, n, h).
struct RowSource {
  const void* base;
  DType dtype;
  int64_t offset;      // element offset of row 0, d 0
  int64_t row_stride;  // along L
  int64_t d_stride;
};

inline RowSource row_source(const void* base, DType dtype, const SeqStrides& s, int64_t b,
                            int64_t n, int64_t h) {
  return RowSource{base, dtype, b * s.b + n * s.n + h * s.h, s.l, s.d};
}

// dst[r * D + d] = mul * src[r0 + r][d]
void load_rows(float* dst, const RowSource& src, int64_t r0, int rows, int D, float mul = 1.0f);
// dst[d * ld + r] = src[r0 + r][d]   (transposed, for products that run along r)
void load_rows_transposed(float* dst, int ld, const RowSource& src, int64_t r0, int rows, int D);
// dst[r0 + r][d] = mul * src[r * D + d], rounded to the destination dtype
void store_rows(void* base, DType dtype, const SeqStrides& s, int64_t b, int64_t n, int64_t h,
                int64_t r0, int rows, int D, const float* src, float mul);

// The scores of a tile: S[i * cols + j] = sum_d Q[i * D + d] Kt[d * ldb + j] plus every bias of
// (b, n, h, i0 + i, j0 + j) (a false mask entry gives -inf), cols <= kBlockK. Summed in double
// and rounded once: a float32 sum carries a rounding of |s| per term, and at large logits
// (|s| ~ 1e4) those roundings were the gradients' largest error, twice the naive computation's.
void scores(float* S, const float* Q, const float* Kt, int ldb, const FwdParams& p, int64_t b,
            int64_t n, int64_t h, int64_t i0, int rows, int64_t j0, int cols);

// C[i * N + j] = sum_d A[i * D + d] * Bt[d * ldb + j]
void matmul_abt(float* C, const float* A, const float* Bt, int ldb, int M, int N, int D);
// C[i * D + d] += sum_j P[i * N + j] * X[j * D + d]
void matmul_acc(float* C, const float* P, const float* X, int M, int N, int D);
// C[j * D + d] += sum_i P[i * N + j] * X[i * D + d]   (P transposed)
void matmul_tn_acc(float* C, const float* P, const float* X, int M, int N, int D);

}  // namespace evoattn::cpu
