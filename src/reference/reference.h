// Plain reference implementation for tests and the CLI's --verify: one (b, n, h) at a time,
// the full Lq x Lk score matrix in double, indexing straight from the tensor views (it shares
// no indexing code with the backends). Host tensors only.
#pragma once

#include <vector>

#include "evoattn/evoattn.h"

namespace evoattn::ref {

enum class Precision {
  kFloat64,        // every operation in double
  kFloat32Scores,  // as kFloat64, but each score rounded to float32 (docs/CONTRACT.md: -1e9 rows)
  kNaiveInDtype,   // matmul, softmax, matmul: float32 sums, each result rounded to the input dtype
};

struct Inputs {
  const evoattn_tensor_t* q;
  const evoattn_tensor_t* k;
  const evoattn_tensor_t* v;
  const evoattn_tensor_t* mask_bias;  // each optional
  const evoattn_tensor_t* pair_bias;
  const evoattn_tensor_t* mask;
  double scale;
};

// Contiguous results: o [B,N,Lq,H,D], lse [B,N,H,Lq].
struct Forward {
  std::vector<double> o, lse;
};

// dq/dk/dv contiguous like q/k/v; bias gradients contiguous in the bias's own sizes.
struct Backward {
  std::vector<double> dq, dk, dv, d_mask_bias, d_pair_bias;
};

Forward forward(const Inputs& in, Precision precision);
Backward backward(const Inputs& in, const evoattn_tensor_t* d_o, bool want_d_mask_bias,
                  bool want_d_pair_bias, Precision precision);

// Element `index` (row-major over t's sizes) of a host tensor, as double.
double element(const evoattn_tensor_t& t, const int64_t* index);
int64_t numel(const evoattn_tensor_t& t);

}  // namespace evoattn::ref
