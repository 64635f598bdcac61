#include "attention_case.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <sstream>
#include <utility>

namespace evoattn::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr evoattn_device_type_t kHost = EVOATTN_DEVICE_CPU;

evoattn_device_type_t device_of(Backend b) {
  return b == Backend::kCpu ? EVOATTN_DEVICE_CPU : EVOATTN_DEVICE_CUDA;
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kContiguous: return "contig";
    case Layout::kHeadMajor: return "headmajor";
    case Layout::kPadded: return "padded";
    case Layout::kStridedD: return "strideD";
    case Layout::kReversed: return "reversed";
  }
  return "?";
}

std::vector<int64_t> layout_strides(const std::vector<int64_t>& sizes, Layout layout) {
  const int nd = static_cast<int>(sizes.size());
  std::vector<int> order(nd);  // memory order, outermost first
  for (int d = 0; d < nd; ++d) order[d] = d;
  if (layout == Layout::kHeadMajor && nd >= 4) std::swap(order[2], order[3]);
  const int64_t pad = layout == Layout::kPadded ? 3 : 0;
  int64_t step = layout == Layout::kStridedD ? 2 : 1;
  std::vector<int64_t> strides(nd);
  for (int i = nd - 1; i >= 0; --i) {
    strides[order[i]] = step;
    step = step * sizes[order[i]] + pad;
  }
  if (layout == Layout::kReversed && nd >= 3) strides[2] = -strides[2];
  return strides;
}

// A host view of `sizes` in `layout`, dims flagged in `expanded` with stride 0. The whole
// buffer is poisoned with 0xFF bytes, a NaN in every float dtype, so outputs never written and
// input padding that gets read both show up as NaN.
util::Tensor make_tensor(const std::vector<int64_t>& sizes, evoattn_dtype_t dtype, Layout layout,
                         const std::vector<bool>& expanded = {}) {
  std::vector<int64_t> dense = sizes;
  for (size_t d = 0; d < expanded.size(); ++d)
    if (expanded[d]) dense[d] = 1;
  std::vector<int64_t> strides = layout_strides(dense, layout);
  for (size_t d = 0; d < expanded.size(); ++d)
    if (expanded[d]) strides[d] = 0;
  int64_t lo = 0, hi = 0;  // extreme element offsets from the view's base
  for (size_t d = 0; d < sizes.size(); ++d)
    (strides[d] < 0 ? lo : hi) += (sizes[d] - 1) * strides[d];
  const int64_t lead = layout == Layout::kPadded ? 1 : 0;  // elements before the view: misaligned
  const size_t elem = util::dtype_size(dtype);
  util::Tensor t;
  t.buffer = util::Buffer(static_cast<size_t>(lead + hi - lo + 1) * elem, kHost);
  std::memset(t.buffer.data(), 0xFF, t.buffer.bytes());
  t.view = util::make_view(static_cast<char*>(t.buffer.data()) + (lead - lo) * elem, dtype, sizes,
                           strides);
  return t;
}

// A bias-shaped view from a pattern (see Case::mask_bias).
util::Tensor make_bias(const std::string& pattern, const std::vector<int64_t>& full,
                       evoattn_dtype_t dtype, Layout layout) {
  std::vector<int64_t> sizes(5);
  std::vector<bool> expanded(5);
  for (int d = 0; d < 5; ++d) {
    sizes[d] = pattern.at(d) == '1' ? 1 : full[d];
    expanded[d] = pattern[d] == '0';
  }
  return make_tensor(sizes, dtype, layout, expanded);
}

// `t` on `device`, same layout, same offset of the view inside its buffer (Tensor::to keeps
// the strides but puts the view at the buffer's start).
util::Tensor moved(const util::Tensor& t, evoattn_device_type_t device) {
  if (t.view.data == nullptr) return util::Tensor{};
  util::Tensor out = t.to(device);
  out.view.data =
      static_cast<char*>(out.buffer.data()) +
      (static_cast<const char*>(t.view.data) - static_cast<const char*>(t.buffer.data()));
  return out;
}

const evoattn_tensor_t* opt(const util::Tensor& t) { return t.view.data ? &t.view : nullptr; }

// The sub-view at `index` over the leading dims (size 1 there), e.g. {b, n} or one element.
evoattn_tensor_t narrow(const evoattn_tensor_t& t, std::initializer_list<int64_t> index) {
  evoattn_tensor_t s = t;
  int64_t offset = 0;
  int d = 0;
  for (int64_t i : index) {
    offset += i * t.strides[d];
    s.sizes[d++] = 1;
  }
  s.data = static_cast<char*>(t.data) + offset * static_cast<int64_t>(util::dtype_size(t.dtype));
  return s;
}

// One NaN in a query (every score of row Lq/2 at (0, N-1, h = 0) NaN: no finite maximum, which a
// kernel must not take for a masked row), one in a key (rows of (B-1, N-1, h = 0) turn NaN), one
// in a value (column D-1 of O at (0, 0, h = H-1)) and one in the pair bias (row Lq-1 at b = 0,
// h = 0, if there is one).
void plant_nans(const Case& c, Inputs& in) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  util::fill_value(narrow(in.q.view, {0, c.N - 1, c.Lq / 2, 0, 0}), nan);
  util::fill_value(narrow(in.k.view, {c.B - 1, c.N - 1, 0, 0, 0}), nan);
  util::fill_value(narrow(in.v.view, {0, 0, c.Lk - 1, c.H - 1, c.D - 1}), nan);
  if (in.pair_bias.view.data)
    util::fill_value(narrow(in.pair_bias.view, {0, 0, 0, c.Lq - 1, 0}), nan);
}

void make_rows_masked(const Case& c, Inputs& in) {
  if (c.masked_rows == MaskedRows::kMinusInf) {
    util::fill_value(narrow(in.mask.view, {0, 0}), 0.0);
    util::fill_value(narrow(in.mask_bias.view, {c.B - 1, c.N - 1}), -kInf);
  } else if (c.masked_rows == MaskedRows::kMinus1e9) {
    util::fill_value(narrow(in.mask_bias.view, {0, 0}), c.big_bias);
    util::fill_value(narrow(in.mask_bias.view, {c.B - 1, c.N - 1}), c.big_bias);
  } else if (c.masked_rows == MaskedRows::kPairMinusInf) {
    util::fill_value(narrow(in.pair_bias.view, {0, 0, 0, 0}), -kInf);
    for (int64_t k : {int64_t{0}, std::min<int64_t>(3, c.Lk - 1), c.Lk - 1}) {
      util::fill_value(narrow(in.pair_bias.view, {0, 0, 0, std::min<int64_t>(1, c.Lq - 1), k}), -kInf);
    }
  } else if (c.masked_rows == MaskedRows::kPairMinus1e9) {
    util::fill_value(narrow(in.pair_bias.view, {0, 0, 0, 0}), c.big_bias);
  } else if (c.masked_rows == MaskedRows::kFirstKeyTile) {
    for (int64_t k = 0; k < std::min<int64_t>(64, c.Lk); ++k) {
      util::fill_value(narrow(in.mask_bias.view, {0, 0, 0, 0, k}), -1e9);
      if (in.mask.view.data) {
        util::fill_value(narrow(in.mask.view, {c.B - 1, c.N - 1, k}), 0.0);
      } else {
        util::fill_value(narrow(in.mask_bias.view, {c.B - 1, c.N - 1, 0, 0, k}), -kInf);
      }
    }
  }
}

}  // namespace

bool backend_missing(Backend backend) {
  return backend == Backend::kCuda && evoattn_cuda_available() == 0;
}

Case& Case::biases(std::string mb, std::string pb) {
  mask_bias = std::move(mb);
  pair_bias = std::move(pb);
  return *this;
}

Case& Case::grads(bool mb, bool pb) {
  grad_mask_bias = mb;
  grad_pair_bias = pb;
  return *this;
}

Case& Case::with_mask(std::string pattern) {
  mask = std::move(pattern);
  return *this;
}

Case& Case::layouts(Layout in, Layout out) {
  layout = in;
  out_layout = out;
  return *this;
}

std::string Case::name() const {
  std::ostringstream s;
  s << (backend == Backend::kCpu ? "cpu" : "cuda") << "_" << util::dtype_name(dtype) << "_B" << B
    << "N" << N << "H" << H << "_Lq" << Lq << "Lk" << Lk << "_D" << D;
  if (!mask_bias.empty()) s << "_mb_" << mask_bias << (grad_mask_bias ? "_grad" : "");
  if (!pair_bias.empty()) s << "_pb_" << pair_bias << (grad_pair_bias ? "_grad" : "");
  if (bias_f32) s << "_f32bias";
  if (!mask.empty()) s << "_mask_" << mask;
  if (masked_rows == MaskedRows::kMinusInf) s << "_rowsinf";
  if (masked_rows == MaskedRows::kMinus1e9) s << "_rows1e9";
  if (masked_rows == MaskedRows::kPairMinusInf) s << "_pairinf";
  if (masked_rows == MaskedRows::kPairMinus1e9) s << "_pair1e9";
  if (masked_rows == MaskedRows::kFirstKeyTile) s << "_firsttile";
  if (big_bias != -1e9) s << "_big" << static_cast<int64_t>(-big_bias / 1e8) << "e8";
  if (layout != Layout::kContiguous) s << "_in_" << layout_name(layout);
  if (out_layout != Layout::kContiguous) s << "_out_" << layout_name(out_layout);
  if (scale != 0.0) s << "_scaled" << (scale < 0 ? "neg" : "") << static_cast<int64_t>(std::fabs(scale) * 100);
  if (nan_inputs) s << "_nan";
  if (key_ramp != 0.0) s << "_ramp" << static_cast<int>(key_ramp * 100);
  if (tf32) s << "_tf32";
  if (logit_scale != 0.0) s << "_logits" << static_cast<int64_t>(logit_scale);
  if (one_hot_rows) s << "_onehot";
  s << "_s" << seed;
  return s.str();
}

Case shape(int64_t B, int64_t N, int64_t H, int64_t Lq, int64_t Lk, int64_t D,
           evoattn_dtype_t dtype) {
  Case c;
  c.B = B;
  c.N = N;
  c.H = H;
  c.Lq = Lq;
  c.Lk = Lk;
  c.D = D;
  c.dtype = dtype;
  return c;
}

std::vector<Case> on_backends(const std::vector<Case>& cases, uint64_t seed_base) {
  std::vector<Case> out;
  for (Backend backend : {Backend::kCpu, Backend::kCuda}) {
    for (size_t i = 0; i < cases.size(); ++i) {
      out.push_back(cases[i]);
      out.back().backend = backend;
      out.back().seed = seed_base + i;
    }
  }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name(); }

void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

evoattn_options_t case_options(const Case& c) {
  evoattn_options_t options;
  evoattn_options_init(&options);
  if (c.scale != 0.0) {
    options.has_scale = 1;
    options.scale = c.scale;
  }
  options.allow_tf32 = c.tf32 ? 1 : 0;
  return options;
}

ref::Inputs Inputs::ref() const {
  return ref::Inputs{&q.view, &k.view, &v.view, opt(mask_bias), opt(pair_bias), opt(mask), scale};
}

Inputs make_inputs(const Case& c) {
  std::mt19937_64 rng(c.seed);
  Inputs in;
  in.q = make_tensor({c.B, c.N, c.Lq, c.H, c.D}, c.dtype, c.layout);
  in.k = make_tensor({c.B, c.N, c.Lk, c.H, c.D}, c.dtype, c.layout);
  in.v = make_tensor({c.B, c.N, c.Lk, c.H, c.D}, c.dtype, c.layout);
  in.d_o = make_tensor({c.B, c.N, c.Lq, c.H, c.D}, c.dtype, c.layout);
  const double q_range = c.logit_scale != 0.0 ? c.logit_scale : 2.0;
  const double k_range = c.logit_scale != 0.0 ? 1.0 : 2.0;
  util::fill_uniform(in.q.view, rng, -q_range, q_range);  // by default scores of std. dev. ~1.3
  util::fill_uniform(in.k.view, rng, -k_range, k_range);
  util::fill_uniform(in.v.view, rng, -1.0, 1.0);
  util::fill_uniform(in.d_o.view, rng, -1.0, 1.0);
  const std::vector<int64_t> full = {c.B, c.N, c.H, c.Lq, c.Lk};
  const evoattn_dtype_t bias_dtype = c.bias_f32 ? EVOATTN_FLOAT32 : c.dtype;
  auto add_key_ramp = [&](util::Tensor& bias) {
    std::vector<double> values = util::to_doubles(bias.view);  // logical order: k last
    const int64_t keys = bias.view.sizes[4];
    for (size_t i = 0; i < values.size(); ++i) values[i] += c.key_ramp * static_cast<double>(i % keys);
    util::from_doubles(bias.view, values);
  };
  if (!c.mask_bias.empty()) {
    in.mask_bias = make_bias(c.mask_bias, full, bias_dtype, c.layout);
    util::fill_uniform(in.mask_bias.view, rng, -2.0, 2.0);
    if (c.key_ramp != 0.0) add_key_ramp(in.mask_bias);
  }
  if (!c.pair_bias.empty()) {
    in.pair_bias = make_bias(c.pair_bias, full, bias_dtype, c.layout);
    util::fill_uniform(in.pair_bias.view, rng, -2.0, 2.0);
    if (c.key_ramp != 0.0 && c.mask_bias.empty()) add_key_ramp(in.pair_bias);
    if (c.one_hot_rows) {
      std::vector<double> values = util::to_doubles(in.pair_bias.view);  // logical order: k last
      const int64_t keys = in.pair_bias.view.sizes[4];
      std::uniform_real_distribution<double> gap(20.0, 60.0);
      for (size_t row = 0; row < values.size(); row += keys) {
        const int64_t top = static_cast<int64_t>(rng() % static_cast<uint64_t>(keys));
        for (int64_t j = 0; j < keys; ++j) values[row + j] = j == top ? 0.0 : -gap(rng);
      }
      util::from_doubles(in.pair_bias.view, values);
    }
  }
  if (c.mask.size() == 3) {
    in.mask = make_tensor({c.mask[0] == '1' ? 1 : c.B, c.mask[1] == '1' ? 1 : c.N, c.Lk},
                          EVOATTN_BOOL, c.layout);
  } else if (!c.mask.empty()) {
    in.mask = make_bias(c.mask, full, EVOATTN_BOOL, c.layout);
  }
  if (!c.mask.empty()) util::fill_uniform(in.mask.view, rng, 0.0, 1.0);  // half the keys kept
  make_rows_masked(c, in);
  if (c.nan_inputs) plant_nans(c, in);
  in.scale = c.scale != 0.0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.D));
  return in;
}

ForwardRun run_forward(const Case& c, const Inputs& in, const evoattn_options_t* options) {
  const evoattn_device_type_t dev = device_of(c.backend);
  const util::Tensor q = moved(in.q, dev), k = moved(in.k, dev), v = moved(in.v, dev);
  const util::Tensor mb = moved(in.mask_bias, dev), pb = moved(in.pair_bias, dev);
  const util::Tensor mask = moved(in.mask, dev);
  const util::Tensor o = moved(make_tensor(in.q.sizes(), c.dtype, c.out_layout), dev);
  const util::Tensor lse =
      moved(make_tensor({c.B, c.N, c.H, c.Lq}, EVOATTN_FLOAT32, c.out_layout), dev);
  ForwardRun run;
  run.status = evoattn_forward(q.ptr(), k.ptr(), v.ptr(), opt(mb), opt(pb), opt(mask), o.ptr(),
                               lse.ptr(), options, nullptr);
  run.error = evoattn_last_error();
  run.o = moved(o, kHost);
  run.lse = moved(lse, kHost);
  return run;
}

BackwardRun run_backward(const Case& c, const Inputs& in, const ForwardRun& fwd,
                         const evoattn_options_t* options) {
  const evoattn_device_type_t dev = device_of(c.backend);
  const util::Tensor q = moved(in.q, dev), k = moved(in.k, dev), v = moved(in.v, dev);
  const util::Tensor d_o = moved(in.d_o, dev), o = moved(fwd.o, dev), lse = moved(fwd.lse, dev);
  const util::Tensor mb = moved(in.mask_bias, dev), pb = moved(in.pair_bias, dev);
  const util::Tensor mask = moved(in.mask, dev);
  const util::Tensor dq = moved(make_tensor(in.q.sizes(), c.dtype, c.out_layout), dev);
  const util::Tensor dk = moved(make_tensor(in.k.sizes(), c.dtype, c.out_layout), dev);
  const util::Tensor dv = moved(make_tensor(in.v.sizes(), c.dtype, c.out_layout), dev);
  util::Tensor d_mb, d_pb;
  if (c.grad_mask_bias) {
    d_mb = moved(make_tensor(in.mask_bias.sizes(), in.mask_bias.view.dtype, c.out_layout), dev);
  }
  if (c.grad_pair_bias) {
    d_pb = moved(make_tensor(in.pair_bias.sizes(), in.pair_bias.view.dtype, c.out_layout), dev);
  }
  BackwardRun run;
  size_t bytes = 0;
  run.status = evoattn_backward_workspace_size(q.ptr(), k.ptr(), v.ptr(), opt(mb), opt(pb),
                                               opt(mask), opt(d_mb), opt(d_pb), options, &bytes);
  if (run.status == EVOATTN_SUCCESS) {
    const util::Buffer workspace(bytes, dev);
    run.status = evoattn_backward(d_o.ptr(), q.ptr(), k.ptr(), v.ptr(), o.ptr(), lse.ptr(), opt(mb),
                                  opt(pb), opt(mask), dq.ptr(), dk.ptr(), dv.ptr(), opt(d_mb),
                                  opt(d_pb), workspace.data(), bytes, options, nullptr);
  }
  run.error = evoattn_last_error();
  run.dq = moved(dq, kHost);
  run.dk = moved(dk, kHost);
  run.dv = moved(dv, kHost);
  run.d_mask_bias = moved(d_mb, kHost);
  run.d_pair_bias = moved(d_pb, kHost);
  return run;
}

bool same_bytes(const util::Tensor& a, const util::Tensor& b) {
  // memcmp's pointers must be valid even for 0 bytes: an empty tensor's may be null.
  return a.buffer.bytes() == b.buffer.bytes() &&
         (a.buffer.bytes() == 0 || std::memcmp(a.buffer.data(), b.buffer.data(), a.buffer.bytes()) == 0);
}

void expect_forward_and_backward_match(const Case& c) {
  const Inputs in = make_inputs(c);
  const evoattn_options_t options = case_options(c);
  const ForwardRun fwd = run_forward(c, in, &options);
  expect_forward_matches(c, in, fwd);
  ASSERT_EQ(fwd.status, EVOATTN_SUCCESS) << fwd.error;
  expect_backward_matches(c, in, run_backward(c, in, fwd, &options));
}

}  // namespace evoattn::test
