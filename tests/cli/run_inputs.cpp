#include "run_inputs.h"

#include <cmath>
#include <sstream>

#include "verify.h"

namespace evoattn::cli::test {
namespace {

std::vector<double> uniform(int64_t n, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  return v;
}

void save(const fs::path& path, NpyDType dtype, const std::vector<int64_t>& shape,
          const std::vector<double>& values, bool fortran_order = false) {
  NpyArray array = make_npy(dtype, shape, values);
  if (fortran_order) {
    // Lay the same logical array out column-major.
    const std::vector<double> row_major = array.values();
    std::vector<double> column_major(row_major.size());
    std::vector<int64_t> index(shape.size(), 0);
    for (size_t n = 0; n < row_major.size(); ++n) {
      int64_t offset = 0, stride = 1;
      for (size_t d = 0; d < shape.size(); ++d) {
        offset += index[d] * stride;
        stride *= shape[d];
      }
      column_major[offset] = row_major[n];
      for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
        if (++index[d] < shape[d]) break;
        index[d] = 0;
      }
    }
    array = make_npy(dtype, shape, column_major);
    array.fortran_order = true;
  }
  write_npy(path.string(), array);
}

int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

util::Tensor load(const fs::path& path, evoattn_dtype_t dtype) {
  const NpyArray array = read_npy(path.string());
  util::Tensor t = util::Tensor::empty(array.shape, dtype);
  util::from_doubles(t.view, array.values());
  return t;
}

std::optional<util::Tensor> load_if_present(const fs::path& path, evoattn_dtype_t dtype) {
  if (!fs::exists(path)) return std::nullopt;
  return load(path, dtype);
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  for (int64_t x : shape) s << x << ' ';
  return s.str();
}

}  // namespace

void write_run_inputs(const fs::path& dir, const RunInputs& in, std::mt19937_64& rng) {
  const std::vector<int64_t> q_shape = {in.B, in.N, in.Lq, in.H, in.D};
  const std::vector<int64_t> kv_shape = {in.B, in.N, in.Lk, in.H, in.D};
  save(dir / "q.npy", in.file_dtype, q_shape, uniform(count(q_shape), rng, -1, 1),
       in.fortran_order);
  save(dir / "k.npy", in.file_dtype, kv_shape, uniform(count(kv_shape), rng, -1, 1));
  save(dir / "v.npy", in.file_dtype, kv_shape, uniform(count(kv_shape), rng, -1, 1));
  if (!in.mask_bias.empty()) {
    save(dir / "mask_bias.npy", in.file_dtype, in.mask_bias,
         uniform(count(in.mask_bias), rng, -3, 0));
  }
  if (!in.pair_bias.empty()) {
    save(dir / "pair_bias.npy", in.file_dtype, in.pair_bias,
         uniform(count(in.pair_bias), rng, -2, 2), in.fortran_order);
  }
  if (in.mask) {
    std::bernoulli_distribution keep(0.8);
    std::vector<double> mask(static_cast<size_t>(in.B * in.N * in.Lk));
    for (double& x : mask) x = keep(rng);
    save(dir / "mask.npy", NpyDType::kBool, {in.B, in.N, in.Lk}, mask);
  }
  if (in.d_o) save(dir / "do.npy", in.file_dtype, q_shape, uniform(count(q_shape), rng, -1, 1));
}

std::string check_run_outputs(const fs::path& in_dir, const fs::path& out_dir,
                              evoattn_dtype_t dtype, double scale) {
  const HostInputs inputs{load(in_dir / "q.npy", dtype),
                          load(in_dir / "k.npy", dtype),
                          load(in_dir / "v.npy", dtype),
                          load_if_present(in_dir / "mask_bias.npy", dtype),
                          load_if_present(in_dir / "pair_bias.npy", dtype),
                          load_if_present(in_dir / "mask.npy", EVOATTN_BOOL),
                          load_if_present(in_dir / "do.npy", dtype)};
  const std::vector<int64_t> q = inputs.q.sizes(), k = inputs.k.sizes();
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"o", q}, {"lse", {q[0], q[1], q[3], q[2]}}};
  if (inputs.d_o) {
    expected.insert(expected.end(), {{"dq", q}, {"dk", k}, {"dv", k}});
    if (inputs.mask_bias) expected.emplace_back("dmask_bias", inputs.mask_bias->sizes());
    if (inputs.pair_bias) expected.emplace_back("dpair_bias", inputs.pair_bias->sizes());
  }
  std::ostringstream problems;
  OutputValues outputs;
  for (const auto& [name, shape] : expected) {
    const fs::path path = out_dir / (name + ".npy");
    if (!fs::exists(path)) {
      problems << name << ".npy missing; ";
      continue;
    }
    const NpyArray array = read_npy(path.string());
    if (array.dtype != NpyDType::kFloat32) problems << name << ".npy is not float32; ";
    if (array.shape != shape)
      problems << name << ".npy has shape " << shape_str(array.shape) << "; ";
    outputs.emplace_back(name, array.values());
  }
  const double bound = error_bound(dtype, false);
  for (const auto& [name, error] : reference_errors(inputs, scale, outputs)) {
    if (!(error <= bound))
      problems << name << " relative error " << error << " > " << bound << "; ";
  }
  return problems.str();
}

}  // namespace evoattn::cli::test
