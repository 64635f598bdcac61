#include "cuda/tma_maps.h"

#include "cuda/kernel_launch.h"

namespace evoattn::cuda {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled, looked up once (null where the driver lacks it).
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

}  // namespace

// A dimension of size 1 takes any legal stride; others need a non-negative multiple of 16
// bytes below 2^40 (TMA's rules), so no broadcast (stride 0) and no reversed rows.
bool tma_legal(const TensorShape& t, const void* ptr) {
  if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 16 != 0 || t.stride[0] != 1) return false;
  for (int i = 0; i < t.rank; ++i) {
    if (t.size[i] < 1 || t.size[i] > (int64_t{1} << 32)) return false;
    if (i == 0 || t.size[i] == 1) continue;
    const int64_t bytes = t.stride[i] * 2;
    if (bytes <= 0 || bytes % 16 != 0 || bytes >= (int64_t{1} << 40)) return false;
  }
  return true;
}

cudaError_t encode_tma_map(CUtensorMap* map, const TensorShape& t, const void* ptr, int box_inner, int box_rows,
                           int swizzle_bytes) {
  const EncodeTiled fn = encode_tiled();
  if (fn == nullptr) return cudaErrorNotSupported;
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5], element_strides[5];
  for (int i = 0; i < t.rank; ++i) {
    dims[i] = static_cast<cuuint64_t>(t.size[i]);
    box[i] = static_cast<cuuint32_t>(i == 0 ? box_inner : i == 1 ? box_rows : 1);
    element_strides[i] = 1;
    if (i > 0) strides[i - 1] = static_cast<cuuint64_t>(t.size[i] == 1 ? 16 : t.stride[i] * 2);
  }
  const CUresult r = fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, static_cast<cuuint32_t>(t.rank), const_cast<void*>(ptr),
                        dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        swizzle_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                        : swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                              : CU_TENSOR_MAP_SWIZZLE_32B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

bool tma_encoder_available() { return encode_tiled() != nullptr; }

TensorShape seq_tensor_shape(const FwdParams& p, const SeqStrides& s, int64_t L) {
  return {5, {p.D, L, p.H, p.N, p.B}, {s.d, s.l, s.h, s.n, s.b}};
}

namespace {

// Boxes of kTile x box_rows elements in 128-byte swizzled rows.
cudaError_t encode(CUtensorMap* map, const TensorShape& t, const void* ptr, int box_rows = kTile) {
  return encode_tma_map(map, t, ptr, kTile, box_rows, 128);
}

TensorShape tile_shape(const FwdParams& p, const LaunchPlan& plan) {
  const ScoreStrides& s = plan.tile_single.stride;
  return {4, {p.Lk, p.Lq, p.H, p.B}, {s.k, s.q, s.h, s.b}};
}

}  // namespace

bool fwd_tma_usable(const FwdParams& p, const LaunchPlan& plan) {
  if (env_switch_on("EVOATTN_DISABLE_TMA")) return false;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p.device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major >= 9 && plan.tile_fast_slot >= 0 && tma_encoder_available() &&
         tma_legal(seq_tensor_shape(p, p.k_stride, p.Lk), p.k) && tma_legal(seq_tensor_shape(p, p.v_stride, p.Lk), p.v) &&
         tma_legal(seq_tensor_shape(p, p.o_stride, p.Lq), p.o) && tma_legal(tile_shape(p, plan), plan.tile_single.ptr);
}

cudaError_t encode_fwd_tma_maps(const FwdParams& p, const LaunchPlan& plan, FwdTmaMaps* maps) {
  if (cudaError_t e = encode(&maps->k, seq_tensor_shape(p, p.k_stride, p.Lk), p.k)) return e;
  if (cudaError_t e = encode(&maps->v, seq_tensor_shape(p, p.v_stride, p.Lk), p.v)) return e;
  if (cudaError_t e = encode(&maps->o, seq_tensor_shape(p, p.o_stride, p.Lq), p.o, kTmaStoreRows)) return e;
  return encode(&maps->bias, tile_shape(p, plan), plan.tile_single.ptr);
}

}  // namespace evoattn::cuda
