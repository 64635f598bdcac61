// XLA FFI handlers for evoattn.jax: typed custom calls "evoattn_forward" / "evoattn_backward"
// for the platforms "cpu" and "CUDA". Buffers are XLA's dense row-major arrays; the handler
// turns them into C API views (layout "BNHLD" is the same call with permuted strides).
//
// vmap: evoattn.jax calls ffi_call with vmap_method="expand_dims", so under k nested vmaps every
// buffer has k extra leading dims, each of size 1 (unbatched) or the vmapped size. When every
// buffer's leading dims (those k plus B) flatten into one dimension with a single stride, they
// are folded into B and the C API is called once; otherwise the handler loops over the vmapped
// indices, one call per index, on the same stream (and the same workspace).
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include <nanobind/stl/string.h>

#include "bindings.h"
#include "options.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace nb = nanobind;

namespace evoattn_py {

// Every attribute that evoattn.jax passes (the same set to both targets).
struct FfiConfig {
  int64_t layout;  // 0: q, k, v, o are [B, N, L, H, D]; 1: [B, N, H, L, D]
  int64_t has_mask_bias;
  int64_t has_pair_bias;
  int64_t has_mask;
  int64_t mask_rank;  // 3 ([B, N, Lk]) or 5
  int64_t has_scale;
  double scale;
  int64_t deterministic;
  int64_t allow_tf32;
  int64_t need_d_mask_bias;
  int64_t need_d_pair_bias;
};

}  // namespace evoattn_py

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    evoattn_py::FfiConfig, ::xla::ffi::StructMember<int64_t>("layout"),
    ::xla::ffi::StructMember<int64_t>("has_mask_bias"),
    ::xla::ffi::StructMember<int64_t>("has_pair_bias"), ::xla::ffi::StructMember<int64_t>("has_mask"),
    ::xla::ffi::StructMember<int64_t>("mask_rank"), ::xla::ffi::StructMember<int64_t>("has_scale"),
    ::xla::ffi::StructMember<double>("scale"), ::xla::ffi::StructMember<int64_t>("deterministic"),
    ::xla::ffi::StructMember<int64_t>("allow_tf32"),
    ::xla::ffi::StructMember<int64_t>("need_d_mask_bias"),
    ::xla::ffi::StructMember<int64_t>("need_d_pair_bias"));

namespace evoattn_py {
namespace {

// One buffer with its extra (vmap) leading dims; strides in elements, row-major.
struct Buf {
  char* data = nullptr;
  evoattn_dtype_t dtype = EVOATTN_FLOAT32;
  int64_t elem_bytes = 4;
  std::vector<int64_t> dims, strides;
  bool seq = false;  // q, k, v, o or a gradient of one: the layout attribute applies
  bool bias = false;  // a bias, mask or bias gradient: a size-1 B dim broadcasts (is summed)
  const char* name = "";
};

struct Device {
  evoattn_device_type_t type;
  int32_t ordinal;
  void* stream;
};

// Messages name the user's call, as evoattn/_core.py's do at trace time.
constexpr const char* kCall = "evoattn.jax.evoformer_attention: ";

ffi::Error bad(const std::string& what) { return ffi::Error::InvalidArgument(kCall + what); }

ffi::Error status_error(evoattn_status_t status) {
  std::string message = evoattn_last_error();  // "evoattn_forward: argument ..."
  message = kCall + message.substr(message.find(": ") == std::string::npos ? 0 : message.find(": ") + 2);
  switch (status) {
    case EVOATTN_ERROR_INVALID_ARGUMENT:
    case EVOATTN_ERROR_WORKSPACE_TOO_SMALL: return ffi::Error::InvalidArgument(message);
    case EVOATTN_ERROR_UNSUPPORTED: return ffi::Error(ffi::ErrorCode::kUnimplemented, message);
    default: return ffi::Error::Internal(message);
  }
}

ffi::Error make_buf(const ffi::AnyBuffer& b, int base_rank, int extra, bool seq, const char* name,
                    Buf* out) {
  switch (b.element_type()) {
    case ffi::DataType::F16: out->dtype = EVOATTN_FLOAT16; out->elem_bytes = 2; break;
    case ffi::DataType::BF16: out->dtype = EVOATTN_BFLOAT16; out->elem_bytes = 2; break;
    case ffi::DataType::F32: out->dtype = EVOATTN_FLOAT32; out->elem_bytes = 4; break;
    case ffi::DataType::PRED: out->dtype = EVOATTN_BOOL; out->elem_bytes = 1; break;
    default: return bad(std::string("argument '") + name + "': unsupported element type");
  }
  const auto dims = b.dimensions();
  if (static_cast<int>(dims.size()) != base_rank + extra) {
    return bad(std::string("argument '") + name + "': expected rank " +
               std::to_string(base_rank + extra) + ", got " + std::to_string(dims.size()));
  }
  out->data = static_cast<char*>(b.untyped_data());
  out->dims.assign(dims.begin(), dims.end());
  out->strides.assign(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) {
    out->strides[i] = out->strides[i + 1] * out->dims[i + 1];
  }
  out->seq = seq;
  out->bias = !seq && base_rank != 4;  // everything but q, k, v, o, their gradients and LSE
  out->name = name;
  return ffi::Error::Success();
}

int64_t eff_stride(const Buf& b, int i) { return b.dims[i] == 1 ? 0 : b.strides[i]; }

// The C API view of b's base dims at element offset `offset`, with the B dim replaced.
evoattn_tensor_t view(const Buf& b, int extra, int64_t b_size, int64_t b_stride, int64_t offset,
                      int64_t layout, const Device& dev) {
  evoattn_tensor_t t{};
  t.data = b.data + offset * b.elem_bytes;
  t.dtype = b.dtype;
  t.device = dev.type;
  t.device_ordinal = dev.ordinal;
  t.ndim = static_cast<int32_t>(b.dims.size()) - extra;
  for (int i = 0; i < t.ndim; ++i) {
    t.sizes[i] = b.dims[extra + i];
    t.strides[i] = b.strides[extra + i];
  }
  t.sizes[0] = b_size;
  t.strides[0] = b_stride;
  if (b.seq && layout == 1) {  // memory [B, N, H, L, D] seen as [B, N, L, H, D]
    std::swap(t.sizes[2], t.sizes[3]);
    std::swap(t.strides[2], t.strides[3]);
  }
  return t;
}

// How the leading dims (extra vmap dims, then B) are walked: one folded call or a loop.
class LeadingDims {
 public:
  LeadingDims(const std::vector<Buf*>& bufs, int extra) : bufs_(bufs), extra_(extra) {
    full_.assign(extra + 1, 1);
    for (const Buf* b : bufs)
      for (int i = 0; i < extra; ++i) full_[i] = std::max(full_[i], b->dims[i]);
    full_[extra] = bufs[0]->dims[extra];  // q's B
    folded_ = try_fold();
  }

  // Checked before any call: each vmap dim of each buffer is 1 or the full size.
  ffi::Error check() const {
    for (const Buf* b : bufs_)
      for (int i = 0; i < extra_; ++i)
        if (b->dims[i] != 1 && b->dims[i] != full_[i])
          return bad(std::string("argument '") + b->name + "': inconsistent vmapped dims");
    return ffi::Error::Success();
  }

  // When folded, a bias broadcast over the folded dims whose gradient is per folded index (an
  // unbatched bias differentiated under vmap) takes the full size with stride 0, so that the
  // library computes one gradient per index instead of their sum.
  void match_gradient(size_t bias, size_t grad) {
    if (folded_ && fold_size_[grad] != fold_size_[bias]) fold_size_[bias] = fold_size_[grad];
  }

  int64_t iterations() const {
    if (folded_) return 1;
    int64_t n = 1;
    for (int i = 0; i < extra_; ++i) n *= full_[i];
    return n;
  }

  // The view of buffer `j` for iteration `it`.
  evoattn_tensor_t view_of(size_t j, int64_t it, int64_t layout, const Device& dev) const {
    const Buf& b = *bufs_[j];
    if (folded_) return view(b, extra_, fold_size_[j], fold_stride_[j], 0, layout, dev);
    int64_t offset = 0;
    for (int i = extra_ - 1; i >= 0; --i) {
      offset += (it % full_[i]) * eff_stride(b, i);
      it /= full_[i];
    }
    return view(b, extra_, b.dims[extra_], b.strides[extra_], offset, layout, dev);
  }

 private:
  bool try_fold() {
    std::vector<int> merged;
    int64_t total = 1;
    for (int i = 0; i <= extra_; ++i) {
      if (full_[i] > 1) merged.push_back(i);
      total *= full_[i];
    }
    for (const Buf* b : bufs_) {
      for (size_t m = 0; m + 1 < merged.size(); ++m) {
        if (eff_stride(*b, merged[m]) != eff_stride(*b, merged[m + 1]) * full_[merged[m + 1]])
          return false;
      }
      if (merged.empty()) {
        fold_size_.push_back(b->dims[extra_]);
        fold_stride_.push_back(b->strides[extra_]);
      } else {
        // A bias broadcast over every folded dim stays size 1 (its gradient is summed over
        // them); q, k, v (and LSE) need the full size, with stride 0 where unbatched.
        const int64_t s = eff_stride(*b, merged.back());
        fold_size_.push_back(s == 0 && b->bias ? 1 : total);
        fold_stride_.push_back(s);
      }
    }
    return true;
  }

  std::vector<Buf*> bufs_;
  int extra_;
  std::vector<int64_t> full_;
  bool folded_ = false;
  std::vector<int64_t> fold_size_, fold_stride_;
};

evoattn_options_t options_of(const FfiConfig& c) {
  return make_options(c.has_scale ? std::optional<double>(c.scale) : std::nullopt, c.deterministic != 0,
                      c.allow_tf32 != 0, 0);
}

bool any_empty(const std::vector<Buf*>& bufs) {
  for (const Buf* b : bufs)
    for (int64_t d : b->dims)
      if (d == 0) return true;
  return false;
}

// Reads the optional biases (in the order mask_bias, pair_bias, mask) after `first` args.
ffi::Error read_biases(const ffi::RemainingArgs& args, size_t first, const FfiConfig& c, int extra,
                       Buf bias[3], bool present[3]) {
  const int64_t flags[3] = {c.has_mask_bias, c.has_pair_bias, c.has_mask};
  const char* names[3] = {"mask_bias", "pair_bias", "mask"};
  size_t next = first;
  for (int s = 0; s < 3; ++s) {
    present[s] = flags[s] != 0;
    if (!present[s]) continue;
    auto b = args.get<ffi::AnyBuffer>(next++);
    if (b.has_error()) return b.error();
    const int rank = s == 2 ? static_cast<int>(c.mask_rank) : 5;
    if (auto e = make_buf(b.value(), rank, extra, false, names[s], &bias[s]); e.failure()) return e;
  }
  if (next != args.size()) return bad("unexpected number of operands");
  return ffi::Error::Success();
}

int extra_dims_of(const ffi::RemainingArgs& args, size_t q_index) {
  auto q = args.get<ffi::AnyBuffer>(q_index);
  return q.has_error() ? 0 : static_cast<int>(q.value().dimensions().size()) - 5;
}

ffi::Error forward_impl(const Device& dev, ffi::RemainingArgs args, ffi::RemainingRets rets,
                        const FfiConfig& c) {
  const int extra = extra_dims_of(args, 0);
  if (extra < 0) return bad("argument 'q': expected rank >= 5");
  Buf q, k, v, o, lse, bias[3];
  bool present[3];
  const char* in_names[3] = {"q", "k", "v"};
  Buf* in[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (b.has_error()) return b.error();
    if (auto e = make_buf(b.value(), 5, extra, true, in_names[i], in[i]); e.failure()) return e;
  }
  if (auto e = read_biases(args, 3, c, extra, bias, present); e.failure()) return e;
  auto o_ret = rets.get<ffi::AnyBuffer>(0);
  auto lse_ret = rets.get<ffi::AnyBuffer>(1);
  if (o_ret.has_error()) return o_ret.error();
  if (lse_ret.has_error()) return lse_ret.error();
  if (auto e = make_buf(*o_ret.value(), 5, extra, true, "o", &o); e.failure()) return e;
  if (auto e = make_buf(*lse_ret.value(), 4, extra, false, "lse", &lse); e.failure()) return e;

  // Order: q, k, v, o, lse, then the present biases.
  std::vector<Buf*> bufs = {&q, &k, &v, &o, &lse};
  int slot_of[3] = {-1, -1, -1};
  for (int s = 0; s < 3; ++s)
    if (present[s]) slot_of[s] = static_cast<int>(bufs.size()), bufs.push_back(&bias[s]);
  if (any_empty(bufs)) return ffi::Error::Success();
  const LeadingDims lead(bufs, extra);
  if (auto e = lead.check(); e.failure()) return e;

  const evoattn_options_t opt = options_of(c);
  for (int64_t it = 0; it < lead.iterations(); ++it) {
    evoattn_tensor_t t[8];
    for (size_t j = 0; j < bufs.size(); ++j) t[j] = lead.view_of(j, it, c.layout, dev);
    auto slot = [&](int s) -> const evoattn_tensor_t* { return slot_of[s] < 0 ? nullptr : &t[slot_of[s]]; };
    const evoattn_status_t st = evoattn_forward(&t[0], &t[1], &t[2], slot(0), slot(1), slot(2),
                                                &t[3], &t[4], &opt, dev.stream);
    if (st != EVOATTN_SUCCESS) return status_error(st);
  }
  return ffi::Error::Success();
}

// Results: dq, dk, dv, the requested bias gradients, then the workspace (a uint8 buffer the
// Python side sized with evoattn_backward_workspace_size at trace time).
ffi::Error backward_impl(const Device& dev, ffi::RemainingArgs args, ffi::RemainingRets rets,
                         const FfiConfig& c) {
  // Operands: d_o, q, k, v, o, lse, then the present biases.
  const int extra = extra_dims_of(args, 1);
  if (extra < 0) return bad("argument 'q': expected rank >= 5");
  Buf d_o, q, k, v, o, lse, dq, dk, dv, bias[3], dbias[2];
  bool present[3];
  struct In {
    Buf* buf;
    int rank;
    bool seq;
    const char* name;
  };
  const In ins[6] = {{&d_o, 5, true, "d_o"}, {&q, 5, true, "q"}, {&k, 5, true, "k"},
                     {&v, 5, true, "v"},     {&o, 5, true, "o"}, {&lse, 4, false, "lse"}};
  for (int i = 0; i < 6; ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (b.has_error()) return b.error();
    if (auto e = make_buf(b.value(), ins[i].rank, extra, ins[i].seq, ins[i].name, ins[i].buf);
        e.failure())
      return e;
  }
  if (auto e = read_biases(args, 6, c, extra, bias, present); e.failure()) return e;
  const In outs[3] = {{&dq, 5, true, "dq"}, {&dk, 5, true, "dk"}, {&dv, 5, true, "dv"}};
  for (int i = 0; i < 3; ++i) {
    auto r = rets.get<ffi::AnyBuffer>(i);
    if (r.has_error()) return r.error();
    if (auto e = make_buf(*r.value(), 5, extra, true, outs[i].name, outs[i].buf); e.failure())
      return e;
  }
  const bool need[2] = {c.need_d_mask_bias != 0, c.need_d_pair_bias != 0};
  const char* dnames[2] = {"d_mask_bias", "d_pair_bias"};
  size_t next_ret = 3;
  for (int s = 0; s < 2; ++s) {
    if (!need[s]) continue;
    if (!present[s]) return bad(std::string(dnames[s]) + " asked for without its bias");
    auto r = rets.get<ffi::AnyBuffer>(next_ret++);
    if (r.has_error()) return r.error();
    if (auto e = make_buf(*r.value(), 5, extra, false, dnames[s], &dbias[s]); e.failure()) return e;
  }
  auto ws = rets.get<ffi::AnyBuffer>(next_ret);
  if (ws.has_error()) return ws.error();
  void* workspace = ws.value()->untyped_data();
  const size_t workspace_capacity = ws.value()->size_bytes();

  std::vector<Buf*> bufs = {&d_o, &q, &k, &v, &o, &lse, &dq, &dk, &dv};
  int slot_of[3] = {-1, -1, -1}, dslot_of[2] = {-1, -1};
  for (int s = 0; s < 3; ++s)
    if (present[s]) slot_of[s] = static_cast<int>(bufs.size()), bufs.push_back(&bias[s]);
  for (int s = 0; s < 2; ++s)
    if (need[s]) dslot_of[s] = static_cast<int>(bufs.size()), bufs.push_back(&dbias[s]);
  if (any_empty(bufs)) return ffi::Error::Success();
  LeadingDims lead(bufs, extra);
  if (auto e = lead.check(); e.failure()) return e;
  for (int s = 0; s < 2; ++s)
    if (need[s]) lead.match_gradient(slot_of[s], dslot_of[s]);

  const evoattn_options_t opt = options_of(c);
  size_t workspace_bytes = 0;
  for (int64_t it = 0; it < lead.iterations(); ++it) {
    evoattn_tensor_t t[14];
    for (size_t j = 0; j < bufs.size(); ++j) t[j] = lead.view_of(j, it, c.layout, dev);
    auto slot = [&](int s) -> const evoattn_tensor_t* { return slot_of[s] < 0 ? nullptr : &t[slot_of[s]]; };
    auto dslot = [&](int s) -> const evoattn_tensor_t* {
      return dslot_of[s] < 0 ? nullptr : &t[dslot_of[s]];
    };
    if (it == 0) {  // every iteration has the same sizes and strides
      const evoattn_status_t st = evoattn_backward_workspace_size(
          &t[1], &t[2], &t[3], slot(0), slot(1), slot(2), dslot(0), dslot(1), &opt,
          &workspace_bytes);
      if (st != EVOATTN_SUCCESS) return status_error(st);
      if (workspace_bytes > workspace_capacity) {
        return ffi::Error(ffi::ErrorCode::kInternal,
                          std::string(kCall) + "workspace result of " +
                              std::to_string(workspace_capacity) + " bytes, " +
                              std::to_string(workspace_bytes) + " needed");
      }
    }
    const evoattn_status_t st = evoattn_backward(
        &t[0], &t[1], &t[2], &t[3], &t[4], &t[5], slot(0), slot(1), slot(2), &t[6], &t[7], &t[8],
        dslot(0), dslot(1), workspace, workspace_bytes, &opt, dev.stream);
    if (st != EVOATTN_SUCCESS) return status_error(st);
  }
  return ffi::Error::Success();
}

ffi::Error forward_cpu(ffi::RemainingArgs args, ffi::RemainingRets rets, FfiConfig c) {
  return forward_impl(Device{EVOATTN_DEVICE_CPU, 0, nullptr}, args, rets, c);
}

ffi::Error backward_cpu(ffi::RemainingArgs args, ffi::RemainingRets rets, FfiConfig c) {
  return backward_impl(Device{EVOATTN_DEVICE_CPU, 0, nullptr}, args, rets, c);
}

ffi::Error forward_cuda(void* stream, int32_t ordinal, ffi::RemainingArgs args,
                        ffi::RemainingRets rets, FfiConfig c) {
  return forward_impl(Device{EVOATTN_DEVICE_CUDA, ordinal, stream}, args, rets, c);
}

ffi::Error backward_cuda(void* stream, int32_t ordinal, ffi::RemainingArgs args,
                         ffi::RemainingRets rets, FfiConfig c) {
  return backward_impl(Device{EVOATTN_DEVICE_CUDA, ordinal, stream}, args, rets, c);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(EvoattnForwardCpu, forward_cpu,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs<FfiConfig>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(EvoattnBackwardCpu, backward_cpu,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs<FfiConfig>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(EvoattnForwardCuda, forward_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void*>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs<FfiConfig>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(EvoattnBackwardCuda, backward_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void*>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs<FfiConfig>());

void bind_xla_ffi(nb::module_& m) {
  m.def(
      "xla_ffi_handlers",
      [](const std::string& platform) {
        nb::dict d;
        if (platform == "cpu") {
          d["evoattn_forward"] = nb::capsule(reinterpret_cast<void*>(EvoattnForwardCpu));
          d["evoattn_backward"] = nb::capsule(reinterpret_cast<void*>(EvoattnBackwardCpu));
        } else if (platform == "CUDA") {
          d["evoattn_forward"] = nb::capsule(reinterpret_cast<void*>(EvoattnForwardCuda));
          d["evoattn_backward"] = nb::capsule(reinterpret_cast<void*>(EvoattnBackwardCuda));
        } else {
          throw nb::value_error("evoattn: platform must be 'cpu' or 'CUDA'");
        }
        return d;
      },
      nb::arg("platform"),
      "{target name: PyCapsule} of the typed XLA FFI handlers for jax.ffi.register_ffi_target.");
}

}  // namespace evoattn_py
