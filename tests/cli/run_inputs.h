// Random .npy inputs for `evoattn run` tests, and the reference check of its outputs.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "evoattn/evoattn.h"

namespace evoattn::cli::test {

struct RunInputs {
  RunInputs(int64_t B_, int64_t N_, int64_t Lq_, int64_t Lk_, int64_t H_, int64_t D_,
            NpyDType file_dtype_ = NpyDType::kFloat32)
      : B(B_), N(N_), Lq(Lq_), Lk(Lk_), H(H_), D(D_), file_dtype(file_dtype_) {}

  int64_t B, N, Lq, Lk, H, D;
  NpyDType file_dtype;
  std::vector<int64_t> mask_bias;  // shape; empty = no mask_bias.npy
  std::vector<int64_t> pair_bias;  // shape; empty = no pair_bias.npy
  bool mask = false;               // mask.npy, [B, N, Lk]
  bool d_o = false;                // do.npy
  bool fortran_order = false;      // q.npy and pair_bias.npy in Fortran order
};

// Writes q, k, v (uniform in [-1, 1]) and the optional files of `in` into `dir`.
void write_run_inputs(const fs::path& dir, const RunInputs& in, std::mt19937_64& rng);

// Reads the inputs back from `in_dir` as `evoattn run` would (rounded to `dtype`), computes
// the float64 reference and returns "" when every output file in `out_dir` is within the contract's
// bound for `dtype`, otherwise a description of what is wrong.
std::string check_run_outputs(const fs::path& in_dir, const fs::path& out_dir,
                              evoattn_dtype_t dtype, double scale);

}  // namespace evoattn::cli::test
