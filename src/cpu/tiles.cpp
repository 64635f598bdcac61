#include "cpu/tiles.h"

#include <limits>

#include "common/half.h"

namespace evoattn::cpu {
namespace {

// Runs body(loader) with a loader specialised for the dtype, so the per-element switch is
// hoisted out of the loops.
template <typename Body>
void with_loader(DType dtype, Body&& body) {
  switch (dtype) {
    case DType::kF16:
      body([](const void* p, int64_t i) { return fp16_to_float(static_cast<const uint16_t*>(p)[i]); });
      break;
    case DType::kBF16:
      body([](const void* p, int64_t i) { return bf16_to_float(static_cast<const uint16_t*>(p)[i]); });
      break;
    case DType::kF32:
      body([](const void* p, int64_t i) { return static_cast<const float*>(p)[i]; });
      break;
    case DType::kBool:
      body([](const void* p, int64_t i) {
        return static_cast<const uint8_t*>(p)[i] ? 0.0f : -std::numeric_limits<float>::infinity();
      });
      break;
  }
}

}  // namespace

void load_rows(float* dst, const RowSource& src, int64_t r0, int rows, int D, float mul) {
  with_loader(src.dtype, [&](auto load) {
    for (int r = 0; r < rows; ++r) {
      const int64_t row = src.offset + (r0 + r) * src.row_stride;
      for (int d = 0; d < D; ++d) dst[r * D + d] = mul * load(src.base, row + d * src.d_stride);
    }
  });
}

void load_rows_transposed(float* dst, int ld, const RowSource& src, int64_t r0, int rows, int D) {
  with_loader(src.dtype, [&](auto load) {
    for (int r = 0; r < rows; ++r) {
      const int64_t row = src.offset + (r0 + r) * src.row_stride;
      for (int d = 0; d < D; ++d) dst[d * ld + r] = load(src.base, row + d * src.d_stride);
    }
  });
}

void store_rows(void* base, DType dtype, const SeqStrides& s, int64_t b, int64_t n, int64_t h,
                int64_t r0, int rows, int D, const float* src, float mul) {
  const int64_t offset = b * s.b + n * s.n + h * s.h;
  for (int r = 0; r < rows; ++r) {
    const int64_t row = offset + (r0 + r) * s.l;
    for (int d = 0; d < D; ++d) store_from_float(base, dtype, row + d * s.d, mul * src[r * D + d]);
  }
}

void scores(float* S, const float* Q, const float* Kt, int ldb, const FwdParams& p, int64_t b,
            int64_t n, int64_t h, int64_t i0, int rows, int64_t j0, int cols) {
  const int D = p.D;
  double acc[kBlockK];
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) acc[j] = 0.0;
    for (int d = 0; d < D; ++d) {
      const double a = Q[i * D + d];
      const float* kt = Kt + d * ldb;
      for (int j = 0; j < cols; ++j) acc[j] += a * kt[j];
    }
    for (const BiasParams& bias : p.bias) {
      if (bias.ptr == nullptr) continue;
      const ScoreStrides& st = bias.stride;
      const int64_t row = b * st.b + n * st.n + h * st.h + (i0 + i) * st.q + j0 * st.k;
      with_loader(bias.dtype, [&](auto load) {
        for (int j = 0; j < cols; ++j) acc[j] += load(bias.ptr, row + j * st.k);
      });
    }
    for (int j = 0; j < cols; ++j) S[i * cols + j] = static_cast<float>(acc[j]);
  }
}

void matmul_abt(float* C, const float* A, const float* Bt, int ldb, int M, int N, int D) {
  for (int i = 0; i < M; ++i) {
    float* c = C + i * N;
    for (int j = 0; j < N; ++j) c[j] = 0.0f;
    for (int d = 0; d < D; ++d) {
      const float a = A[i * D + d];
      const float* bt = Bt + d * ldb;
      for (int j = 0; j < N; ++j) c[j] += a * bt[j];
    }
  }
}

void matmul_acc(float* C, const float* P, const float* X, int M, int N, int D) {
  for (int i = 0; i < M; ++i) {
    float* c = C + i * D;
    for (int j = 0; j < N; ++j) {
      const float pij = P[i * N + j];
      const float* x = X + j * D;
      for (int d = 0; d < D; ++d) c[d] += pij * x[d];
    }
  }
}

void matmul_tn_acc(float* C, const float* P, const float* X, int M, int N, int D) {
  for (int i = 0; i < M; ++i) {
    const float* x = X + i * D;
    for (int j = 0; j < N; ++j) {
      const float pij = P[i * N + j];
      float* c = C + j * D;
      for (int d = 0; d < D; ++d) c[d] += pij * x[d];
    }
  }
}

}  // namespace evoattn::cpu
