#include "reference/reference.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "common/half.h"

namespace evoattn::ref {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Broadcast read: a size-1 dimension ignores the index.
double at(const evoattn_tensor_t& t, std::initializer_list<int64_t> index) {
  int64_t offset = 0;
  int d = 0;
  for (int64_t i : index) {
    if (t.sizes[d] != 1) offset += i * t.strides[d];
    ++d;
  }
  return load_as_float(t.data, static_cast<DType>(t.dtype), offset);
}

struct Problem {
  const Inputs& in;
  int64_t B, N, H, Lq, Lk, D;
  DType dtype;
  Precision precision;

  Problem(const Inputs& inputs, Precision p)
      : in(inputs),
        B(inputs.q->sizes[0]),
        N(inputs.q->sizes[1]),
        H(inputs.q->sizes[3]),
        Lq(inputs.q->sizes[2]),
        Lk(inputs.k->sizes[2]),
        D(inputs.q->sizes[4]),
        dtype(static_cast<DType>(inputs.q->dtype)),
        precision(p) {
    for (const evoattn_tensor_t* t : {in.q, in.k, in.v, in.mask_bias, in.pair_bias, in.mask}) {
      if (t && t->device != EVOATTN_DEVICE_CPU) throw std::invalid_argument("reference: host tensors only");
    }
  }

  // Rounds the result of one operation when emulating the naive input-dtype computation.
  double rnd(double x) const {
    return precision == Precision::kNaiveInDtype ? round_to(dtype, static_cast<float>(x)) : x;
  }
  // Rounds a running sum (or a softmax intermediate) to float32 in naive mode: the naive
  // computation accumulates in float32, one fused multiply-add a term.
  double acc(double x) const {
    return precision == Precision::kNaiveInDtype ? static_cast<double>(static_cast<float>(x)) : x;
  }

  double bias(int64_t b, int64_t n, int64_t h, int64_t i, int64_t j, double s) const {
    if (in.mask_bias) s = rnd(s + at(*in.mask_bias, {b, n, h, i, j}));
    if (in.pair_bias) s = rnd(s + at(*in.pair_bias, {b, n, h, i, j}));
    if (in.mask) {
      const bool keep = in.mask->ndim == 3 ? at(*in.mask, {b, n, j}) == 0.0
                                           : at(*in.mask, {b, n, h, i, j}) == 0.0;
      if (!keep) s = -kInf;
    }
    return s;
  }

  // P for one (b, n, h): row-major Lq x Lk, plus the LSE of each row.
  void probabilities(int64_t b, int64_t n, int64_t h, std::vector<double>& P,
                     std::vector<double>& lse) const {
    P.assign(Lq * Lk, 0.0);
    lse.assign(Lq, -kInf);
    std::vector<double> s(Lk);
    for (int64_t i = 0; i < Lq; ++i) {
      double m = -kInf;
      bool nan = false;
      for (int64_t j = 0; j < Lk; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot = acc(dot + at(*in.q, {b, n, i, h, d}) * at(*in.k, {b, n, j, h, d}));
        double x = bias(b, n, h, i, j, rnd(in.scale * rnd(dot)));
        if (precision == Precision::kFloat32Scores) x = static_cast<float>(x);
        s[j] = x;
        m = std::fmax(m, x);
        nan = nan || std::isnan(x);
      }
      if (nan) {  // IEEE: a NaN score makes the whole row NaN
        for (int64_t j = 0; j < Lk; ++j) P[i * Lk + j] = std::nan("");
        lse[i] = std::nan("");
        continue;
      }
      if (m == -kInf) continue;  // fully masked row: P = 0, LSE = -inf
      double sum = 0.0;
      for (int64_t j = 0; j < Lk; ++j) sum = acc(sum + acc(std::exp(acc(s[j] - m))));
      for (int64_t j = 0; j < Lk; ++j) P[i * Lk + j] = rnd(acc(std::exp(acc(s[j] - m))) / sum);
      lse[i] = m + std::log(sum);
    }
  }

  int64_t seq_index(int64_t b, int64_t n, int64_t l, int64_t h, int64_t L) const {
    return (((b * N + n) * L + l) * H + h) * D;
  }
};

// Flat row-major index of (b, n, h, i, j) inside a bias-shaped gradient (size-1 dims summed).
int64_t bias_grad_index(const evoattn_tensor_t& t, const int64_t (&idx)[5]) {
  int64_t flat = 0;
  for (int d = 0; d < 5; ++d) flat = flat * t.sizes[d] + (t.sizes[d] == 1 ? 0 : idx[d]);
  return flat;
}

}  // namespace

int64_t numel(const evoattn_tensor_t& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.sizes[d];
  return n;
}

double element(const evoattn_tensor_t& t, const int64_t* index) {
  int64_t offset = 0;
  for (int d = 0; d < t.ndim; ++d) offset += index[d] * t.strides[d];
  return load_as_float(t.data, static_cast<DType>(t.dtype), offset);
}

Forward forward(const Inputs& in, Precision precision) {
  const Problem p(in, precision);
  Forward out;
  out.o.assign(p.B * p.N * p.Lq * p.H * p.D, 0.0);
  out.lse.assign(p.B * p.N * p.H * p.Lq, 0.0);
  std::vector<double> P, lse;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t h = 0; h < p.H; ++h) {
        p.probabilities(b, n, h, P, lse);
        for (int64_t i = 0; i < p.Lq; ++i) {
          out.lse[((b * p.N + n) * p.H + h) * p.Lq + i] = lse[i];
          double* o = &out.o[p.seq_index(b, n, i, h, p.Lq)];
          for (int64_t d = 0; d < p.D; ++d) {
            double acc = 0.0;
            for (int64_t j = 0; j < p.Lk; ++j) acc = p.acc(acc + P[i * p.Lk + j] * at(*in.v, {b, n, j, h, d}));
            o[d] = p.rnd(acc);
          }
        }
      }
  return out;
}

Backward backward(const Inputs& in, const evoattn_tensor_t* d_o, bool want_d_mask_bias,
                  bool want_d_pair_bias, Precision precision) {
  const Problem p(in, precision);
  Backward out;
  out.dq.assign(p.B * p.N * p.Lq * p.H * p.D, 0.0);
  out.dk.assign(p.B * p.N * p.Lk * p.H * p.D, 0.0);
  out.dv.assign(p.B * p.N * p.Lk * p.H * p.D, 0.0);
  if (want_d_mask_bias) out.d_mask_bias.assign(numel(*in.mask_bias), 0.0);
  if (want_d_pair_bias) out.d_pair_bias.assign(numel(*in.pair_bias), 0.0);

  std::vector<double> P, lse, dS(p.Lq * p.Lk);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t h = 0; h < p.H; ++h) {
        p.probabilities(b, n, h, P, lse);
        for (int64_t i = 0; i < p.Lq; ++i) {
          // dP = dO V^T, then the softmax backward dS = P (dP - sum_j P dP).
          double delta = 0.0;
          for (int64_t j = 0; j < p.Lk; ++j) {
            double dp = 0.0;
            for (int64_t d = 0; d < p.D; ++d) dp = p.acc(dp + at(*d_o, {b, n, i, h, d}) * at(*in.v, {b, n, j, h, d}));
            dS[i * p.Lk + j] = p.rnd(dp);
            delta = p.acc(delta + P[i * p.Lk + j] * dS[i * p.Lk + j]);
          }
          for (int64_t j = 0; j < p.Lk; ++j) {
            dS[i * p.Lk + j] = p.rnd(P[i * p.Lk + j] * p.acc(dS[i * p.Lk + j] - delta));
          }
        }
        for (int64_t j = 0; j < p.Lk; ++j) {
          double* dk = &out.dk[p.seq_index(b, n, j, h, p.Lk)];
          double* dv = &out.dv[p.seq_index(b, n, j, h, p.Lk)];
          for (int64_t d = 0; d < p.D; ++d) {
            double acc_k = 0.0, acc_v = 0.0;
            for (int64_t i = 0; i < p.Lq; ++i) {
              acc_k = p.acc(acc_k + p.rnd(in.scale * dS[i * p.Lk + j]) * at(*in.q, {b, n, i, h, d}));
              acc_v = p.acc(acc_v + P[i * p.Lk + j] * at(*d_o, {b, n, i, h, d}));
            }
            dk[d] = acc_k;
            dv[d] = acc_v;
          }
        }
        for (int64_t i = 0; i < p.Lq; ++i) {
          double* dq = &out.dq[p.seq_index(b, n, i, h, p.Lq)];
          for (int64_t d = 0; d < p.D; ++d) {
            double acc = 0.0;
            for (int64_t j = 0; j < p.Lk; ++j) {
              acc = p.acc(acc + p.rnd(in.scale * dS[i * p.Lk + j]) * at(*in.k, {b, n, j, h, d}));
            }
            dq[d] = acc;
          }
          for (int64_t j = 0; j < p.Lk; ++j) {
            const int64_t idx[5] = {b, n, h, i, j};
            if (want_d_mask_bias) {
              double& g = out.d_mask_bias[bias_grad_index(*in.mask_bias, idx)];
              g = p.acc(g + dS[i * p.Lk + j]);
            }
            if (want_d_pair_bias) {
              double& g = out.d_pair_bias[bias_grad_index(*in.pair_bias, idx)];
              g = p.acc(g + dS[i * p.Lk + j]);
            }
          }
        }
      }
  // dK, dV and the bias sums are each one float32 reduction: round to the dtype at the end.
  for (auto* v : {&out.dq, &out.dk, &out.dv, &out.d_mask_bias, &out.d_pair_bias})
    for (double& x : *v) x = p.rnd(x);
  return out;
}

}  // namespace evoattn::ref
