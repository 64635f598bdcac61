#include "api/make_params.h"

#include <cmath>

namespace evoattn {
namespace {

SeqStrides seq_strides(const evoattn_tensor_t* t) {
  return SeqStrides{t->strides[0], t->strides[1], t->strides[2], t->strides[3], t->strides[4]};
}

// Size-1 dimensions get stride 0, so kernels index every view with the full [B,N,H,Lq,Lk].
ScoreStrides score_strides(const evoattn_tensor_t* t) {
  if (t->ndim == 3) {  // boolean mask [B, N, Lk]
    return ScoreStrides{t->sizes[0] == 1 ? 0 : t->strides[0], t->sizes[1] == 1 ? 0 : t->strides[1],
                        0, 0, t->strides[2]};
  }
  int64_t s[5];
  for (int i = 0; i < 5; ++i) s[i] = t->sizes[i] == 1 ? 0 : t->strides[i];
  return ScoreStrides{s[0], s[1], s[2], s[3], s[4]};
}

BiasParams bias_params(const evoattn_tensor_t* t) {
  if (t == nullptr) return BiasParams{nullptr, DType::kF32, ScoreStrides{0, 0, 0, 0, 0}};
  return BiasParams{t->data, static_cast<DType>(t->dtype), score_strides(t)};
}

BiasGradParams bias_grad_params(const evoattn_tensor_t* grad, const evoattn_tensor_t* bias,
                                const Problem& p) {
  BiasGradParams g{};
  if (grad == nullptr) return g;
  g.requested = true;
  g.ptr = grad->data;
  g.dtype = static_cast<DType>(grad->dtype);
  g.stride = score_strides(grad);
  // A dimension is summed when the bias has size 1 there and the score space does not.
  const int64_t full[5] = {p.B, p.N, p.H, p.Lq, p.Lk};
  bool r[5];
  for (int i = 0; i < 5; ++i) r[i] = bias->sizes[i] == 1 && full[i] > 1;
  g.reduce_b = r[0];
  g.reduce_n = r[1];
  g.reduce_h = r[2];
  g.reduce_q = r[3];
  g.reduce_k = r[4];
  return g;
}

}  // namespace

FwdParams make_fwd_params(const ForwardArgs& a, const Problem& p, const evoattn_options_t& opt) {
  FwdParams f{};
  f.B = p.B;
  f.N = p.N;
  f.H = p.H;
  f.Lq = p.Lq;
  f.Lk = p.Lk;
  f.D = p.D;
  f.dtype = p.dtype;
  f.q = a.q->data;
  f.k = a.k->data;
  f.v = a.v->data;
  f.o = a.o ? a.o->data : nullptr;
  f.q_stride = seq_strides(a.q);
  f.k_stride = seq_strides(a.k);
  f.v_stride = seq_strides(a.v);
  if (a.o) f.o_stride = seq_strides(a.o);
  if (a.lse) {
    f.lse = static_cast<float*>(a.lse->data);
    f.lse_stride_b = a.lse->strides[0];
    f.lse_stride_n = a.lse->strides[1];
    f.lse_stride_h = a.lse->strides[2];
    f.lse_stride_q = a.lse->strides[3];
  }
  f.bias[0] = bias_params(a.mask_bias);
  f.bias[1] = bias_params(a.pair_bias);
  f.bias[2] = bias_params(a.mask);
  f.scale = static_cast<float>(p.scale);
  f.scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
  f.allow_tf32 = opt.allow_tf32 != 0;
  f.deterministic = opt.deterministic != 0;
  f.num_threads = opt.num_threads;
  f.device = p.device_ordinal;
  return f;
}

BwdParams make_bwd_params(const BackwardArgs& a, const Problem& p, const evoattn_options_t& opt,
                          void* workspace, size_t workspace_bytes) {
  BwdParams b{};
  static_cast<FwdParams&>(b) = make_fwd_params(a.fwd, p, opt);
  b.d_o = a.d_o ? a.d_o->data : nullptr;
  b.dq = a.dq ? a.dq->data : nullptr;
  b.dk = a.dk ? a.dk->data : nullptr;
  b.dv = a.dv ? a.dv->data : nullptr;
  if (a.d_o) b.do_stride = seq_strides(a.d_o);
  if (a.dq) b.dq_stride = seq_strides(a.dq);
  if (a.dk) b.dk_stride = seq_strides(a.dk);
  if (a.dv) b.dv_stride = seq_strides(a.dv);
  const evoattn_tensor_t* biases[kNumGradSlots] = {a.fwd.mask_bias, a.fwd.pair_bias};
  for (int s = 0; s < kNumGradSlots; ++s) b.dbias[s] = bias_grad_params(a.d_bias[s], biases[s], p);
  b.workspace = workspace;
  b.workspace_bytes = workspace_bytes;
  return b;
}

}  // namespace evoattn
