/*
 * evoattn: fused Evoformer attention, forward and backward.
 *
 *   s[j] = scale * <Q[b,n,i,h,:], K[b,n,j,h,:]> + mask_bias[b,n,j] + pair_bias[b,h,i,j]
 *   O[b,n,i,h,:] = sum_j softmax_j(s)[j] * V[b,n,j,h,:],  LSE[b,n,h,i] = log sum_j exp(s[j])
 *
 * Stable C API. Every tensor is a strided view (sizes and strides in elements); broadcast
 * dimensions of a bias have size 1 (or stride 0). No call allocates device memory,
 * synchronises the device or uses a stream other than the one given. Errors return a status
 * and leave a thread-local message (evoattn_last_error) naming the argument; outputs are then
 * left untouched.
 */
#ifndef EVOATTN_EVOATTN_H_
#define EVOATTN_EVOATTN_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define EVOATTN_API __declspec(dllexport)
#elif defined(__GNUC__)
#define EVOATTN_API __attribute__((visibility("default")))
#else
#define EVOATTN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define EVOATTN_VERSION_MAJOR 0
#define EVOATTN_VERSION_MINOR 1
#define EVOATTN_VERSION_PATCH 0
/* The ABI of the structs below; bumped whenever a struct changes layout. */
#define EVOATTN_ABI_VERSION 1

typedef enum evoattn_status {
  EVOATTN_SUCCESS = 0,
  EVOATTN_ERROR_INVALID_ARGUMENT = 1,    /* null pointer, shape/stride mismatch, bad scale... */
  EVOATTN_ERROR_UNSUPPORTED = 2,         /* dtype, head dim or layout this build cannot run */
  EVOATTN_ERROR_WORKSPACE_TOO_SMALL = 3, /* backward workspace smaller than the query said */
  EVOATTN_ERROR_BACKEND_UNAVAILABLE = 4, /* CUDA tensors but no CUDA backend / no device */
  EVOATTN_ERROR_CUDA = 5,                /* a CUDA runtime call failed */
  EVOATTN_ERROR_INTERNAL = 6
} evoattn_status_t;

typedef enum evoattn_dtype {
  EVOATTN_FLOAT16 = 0,
  EVOATTN_BFLOAT16 = 1,
  EVOATTN_FLOAT32 = 2,
  EVOATTN_BOOL = 3 /* one byte per element, 0 = masked out; only for the boolean mask */
} evoattn_dtype_t;

typedef enum evoattn_device_type { EVOATTN_DEVICE_CPU = 0, EVOATTN_DEVICE_CUDA = 1 } evoattn_device_type_t;

/* A strided view of up to 5 dimensions. Sizes and strides are in elements; strides may be
 * zero (broadcast) or negative on inputs. Outputs must not overlap themselves (checked), each
 * other, the inputs or the workspace (not checked: the kernels of one call may run at once). */
typedef struct evoattn_tensor {
  void* data;
  evoattn_dtype_t dtype;
  evoattn_device_type_t device;
  int32_t device_ordinal; /* CUDA device index; ignored for the CPU */
  int32_t ndim;
  int64_t sizes[5];
  int64_t strides[5];
} evoattn_tensor_t;

typedef struct evoattn_options {
  uint32_t abi_version; /* set by evoattn_options_init */
  int32_t has_scale;    /* 0: scale = 1/sqrt(D) */
  double scale;         /* any finite value when has_scale != 0 */
  int32_t deterministic; /* 1 (default): bitwise-reproducible outputs and gradients */
  int32_t allow_tf32;    /* 0 (default): float32 inputs compute in IEEE float32 */
  int32_t num_threads;   /* CPU backend only; 0 = all hardware threads */
} evoattn_options_t;

/* Fills the defaults: scale 1/sqrt(D), deterministic, no TF32, all CPU threads. */
EVOATTN_API void evoattn_options_init(evoattn_options_t* options);

/*
 * Forward.
 *   q        [B, N, Lq, H, D]       float16 | bfloat16 | float32
 *   k, v     [B, N, Lk, H, D]       same dtype as q
 *   mask_bias, pair_bias  optional (NULL), each a 5-D view broadcastable to
 *            [B, N, H, Lq, Lk] (the Evoformer forms are [B, N, 1, 1, Lk] and [B, 1, H, Lq, Lk]),
 *            dtype of q or float32. Either slot takes any broadcast pattern.
 *   mask     optional boolean mask, [B, N, Lk] (3-D) or 5-D broadcastable to [B, N, H, Lq, Lk];
 *            0 = the key is masked out (a bias of -inf); no gradient.
 *   o        [B, N, Lq, H, D], dtype of q (output)
 *   lse      [B, N, H, Lq] float32 (output, natural log); may be NULL when no backward follows.
 *   stream   cudaStream_t for CUDA tensors (NULL = the legacy default stream); ignored on CPU.
 */
EVOATTN_API evoattn_status_t evoattn_forward(const evoattn_tensor_t* q, const evoattn_tensor_t* k,
                                             const evoattn_tensor_t* v,
                                             const evoattn_tensor_t* mask_bias,
                                             const evoattn_tensor_t* pair_bias,
                                             const evoattn_tensor_t* mask, const evoattn_tensor_t* o,
                                             const evoattn_tensor_t* lse,
                                             const evoattn_options_t* options, void* stream);

/*
 * Backward. Takes what the forward saved (q, k, v, o, lse) and its biases, plus d_o.
 *   dq, dk, dv            outputs shaped like q, k, v, in their dtype.
 *   d_mask_bias, d_pair_bias  optional outputs shaped like mask_bias / pair_bias (their
 *            broadcast dimensions are summed), dtype float32 or that of q. NULL = not wanted.
 *   workspace             device (or host, for CPU tensors) memory of at least the size that
 *            evoattn_backward_workspace_size reports for the same arguments, 16-byte aligned
 *            (cudaMalloc and framework allocators give 256 bytes or more).
 */
EVOATTN_API evoattn_status_t evoattn_backward(
    const evoattn_tensor_t* d_o, const evoattn_tensor_t* q, const evoattn_tensor_t* k,
    const evoattn_tensor_t* v, const evoattn_tensor_t* o, const evoattn_tensor_t* lse,
    const evoattn_tensor_t* mask_bias, const evoattn_tensor_t* pair_bias,
    const evoattn_tensor_t* mask, const evoattn_tensor_t* dq, const evoattn_tensor_t* dk,
    const evoattn_tensor_t* dv, const evoattn_tensor_t* d_mask_bias,
    const evoattn_tensor_t* d_pair_bias, void* workspace, size_t workspace_bytes,
    const evoattn_options_t* options, void* stream);

/* Bytes of workspace evoattn_backward needs for these arguments (data pointers are not read). */
EVOATTN_API evoattn_status_t evoattn_backward_workspace_size(
    const evoattn_tensor_t* q, const evoattn_tensor_t* k, const evoattn_tensor_t* v,
    const evoattn_tensor_t* mask_bias, const evoattn_tensor_t* pair_bias,
    const evoattn_tensor_t* mask, const evoattn_tensor_t* d_mask_bias,
    const evoattn_tensor_t* d_pair_bias, const evoattn_options_t* options, size_t* bytes);

/* The message of the last failed call on this thread ("" after a success). */
EVOATTN_API const char* evoattn_last_error(void);
EVOATTN_API const char* evoattn_status_string(evoattn_status_t status);

/* Library version (major*10000 + minor*100 + patch) and a printable string. */
EVOATTN_API int evoattn_version(void);
EVOATTN_API const char* evoattn_version_string(void);

/* 1 when the library was built with the CUDA backend and a CUDA device is visible. */
EVOATTN_API int evoattn_cuda_available(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EVOATTN_EVOATTN_H_ */
