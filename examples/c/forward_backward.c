/* evoattn from C: forward and backward of Evoformer attention with both biases, on the CPU.
 *
 *   cc -std=c11 forward_backward.c -I<prefix>/include -L<prefix>/lib -levoattn \
 *      -Wl,-rpath,<prefix>/lib -o forward_backward
 *
 * or, from CMake: find_package(evoattn) and target_link_libraries(app evoattn::evoattn).
 *
 * The same calls run on a GPU when the tensors say EVOATTN_DEVICE_CUDA, their data is device
 * memory, and a cudaStream_t is passed as the last argument. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <evoattn/evoattn.h>

enum { B = 1, N = 4, H = 2, L = 16, D = 32 };

/* A contiguous (row-major) view of `ndim` sizes over `data`. */
static evoattn_tensor_t view(void* data, evoattn_dtype_t dtype, int ndim, const int64_t* sizes) {
  evoattn_tensor_t t = {0};
  t.data = data;
  t.dtype = dtype;
  t.device = EVOATTN_DEVICE_CPU;
  t.ndim = ndim;
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    t.sizes[i] = sizes[i];
    t.strides[i] = stride;
    stride *= sizes[i];
  }
  return t;
}

static float* random_floats(size_t n) {
  float* x = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) x[i] = (float)rand() / RAND_MAX - 0.5f;
  return x;
}

#define CHECK(call)                                                             \
  do {                                                                          \
    evoattn_status_t s_ = (call);                                               \
    if (s_ != EVOATTN_SUCCESS) {                                                \
      fprintf(stderr, "%s: %s\n", evoattn_status_string(s_), evoattn_last_error()); \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

int main(void) {
  const int64_t seq[5] = {B, N, L, H, D};         /* Q, K, V, O and their gradients */
  const int64_t mask_shape[5] = {B, N, 1, 1, L};  /* mask_bias [B, N, 1, 1, Lk] */
  const int64_t pair_shape[5] = {B, 1, H, L, L};  /* pair_bias [B, 1, H, Lq, Lk] */
  const int64_t lse_shape[4] = {B, N, H, L};      /* LSE [B, N, H, Lq], float32 */
  const size_t n_seq = (size_t)B * N * L * H * D, n_mask = (size_t)B * N * L;
  const size_t n_pair = (size_t)B * H * L * L, n_lse = (size_t)B * N * H * L;

  float *q = random_floats(n_seq), *k = random_floats(n_seq), *v = random_floats(n_seq);
  float *mask_bias = random_floats(n_mask), *pair_bias = random_floats(n_pair);
  float *d_o = random_floats(n_seq), *o = malloc(n_seq * sizeof(float));
  float *lse = malloc(n_lse * sizeof(float)), *dq = malloc(n_seq * sizeof(float));
  float *dk = malloc(n_seq * sizeof(float)), *dv = malloc(n_seq * sizeof(float));
  float* d_pair_bias = malloc(n_pair * sizeof(float));
  mask_bias[n_mask - 1] = -INFINITY; /* mask out the last key of the last row of the MSA */

  const evoattn_tensor_t tq = view(q, EVOATTN_FLOAT32, 5, seq), tk = view(k, EVOATTN_FLOAT32, 5, seq);
  const evoattn_tensor_t tv = view(v, EVOATTN_FLOAT32, 5, seq), to = view(o, EVOATTN_FLOAT32, 5, seq);
  const evoattn_tensor_t tmask = view(mask_bias, EVOATTN_FLOAT32, 5, mask_shape);
  const evoattn_tensor_t tpair = view(pair_bias, EVOATTN_FLOAT32, 5, pair_shape);
  const evoattn_tensor_t tlse = view(lse, EVOATTN_FLOAT32, 4, lse_shape);
  const evoattn_tensor_t tdo = view(d_o, EVOATTN_FLOAT32, 5, seq);
  const evoattn_tensor_t tdq = view(dq, EVOATTN_FLOAT32, 5, seq), tdk = view(dk, EVOATTN_FLOAT32, 5, seq);
  const evoattn_tensor_t tdv = view(dv, EVOATTN_FLOAT32, 5, seq);
  const evoattn_tensor_t tdpair = view(d_pair_bias, EVOATTN_FLOAT32, 5, pair_shape);

  evoattn_options_t options;
  evoattn_options_init(&options); /* scale 1/sqrt(D), deterministic, IEEE float32 */

  /* Forward: O and the LSE the backward needs. No boolean mask here (NULL). */
  CHECK(evoattn_forward(&tq, &tk, &tv, &tmask, &tpair, NULL, &to, &tlse, &options, NULL));

  /* Backward: ask for the workspace size, then pass that much memory. Only the pair-bias
   * gradient is requested (d_mask_bias = NULL); it is summed over N. */
  size_t ws_bytes = 0;
  CHECK(evoattn_backward_workspace_size(&tq, &tk, &tv, &tmask, &tpair, NULL, NULL, &tdpair,
                                        &options, &ws_bytes));
  void* workspace = aligned_alloc(256, (ws_bytes + 255) / 256 * 256);
  CHECK(evoattn_backward(&tdo, &tq, &tk, &tv, &to, &tlse, &tmask, &tpair, NULL, &tdq, &tdk, &tdv,
                         NULL, &tdpair, workspace, ws_bytes, &options, NULL));

  printf("evoattn %s: O[0] = %.6f, LSE[0] = %.6f, dQ[0] = %.6f, dPair[0] = %.6f, workspace %zu B\n",
         evoattn_version_string(), o[0], lse[0], dq[0], d_pair_bias[0], ws_bytes);

  void* buffers[] = {workspace, q, k, v, mask_bias, pair_bias, d_o, o, lse, dq, dk, dv, d_pair_bias};
  for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i) free(buffers[i]);
  return 0;
}
