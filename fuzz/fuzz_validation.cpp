// libFuzzer target: the C API's validation. Each input decodes into every argument of
// evoattn_backward_workspace_size, evoattn_forward and evoattn_backward (the encoding is below;
// fuzz/make_corpus.py writes seeds in it). Each call must return success or a documented error
// status whose message names the entry point, and must leave its outputs untouched on an error.
//
// The harness never lies about memory, so that a sanitizer report is the library's fault:
//  - a view gets its own heap buffer exactly as large as its sizes and strides reach (ASan
//    flags one byte past it), or NULL where that would exceed kMaxTensorBytes; separate buffers
//    because outputs overlapping inputs is a promise the caller makes, not a checked error;
//  - the workspace is a buffer of exactly the bytes claimed;
//  - an accepted problem is computed only when small (kMaxWork); a bigger one is checked by the
//    library's own validation (src/api/validate.h) alone, so every input takes milliseconds.
//
// Input: options, the tensors in the order of Slot, then one byte of call flags.
//   options  flags (bit 0: pass them, else NULL; bit 1: abi_version from the input),
//            [abi_version], has_scale, scale (8 raw bytes), deterministic, allow_tf32,
//            num_threads
//   tensor   flags (bit 0: pass it, else NULL; bit 1: data NULL; bit 2: data one byte past its
//            buffer's 16-byte alignment), dtype, device, device_ordinal, ndim, sizes[5],
//            strides[5], fill (the byte its buffer is filled with)
//   call     bits 0-1: backward's workspace (0 NULL, 1 the queried size, 2 one byte short,
//            3 misaligned); bit 2: NULL for the workspace query's `bytes`
//   Every field but the flags, scale and fill is an integer as Reader::integer reads it; the
//   input reads as zeros past its end. FUZZ_VALIDATION_VERBOSE=1 prints each call's status.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <memory>
#include <vector>

#include "api/validate.h"
#include "evoattn/evoattn.h"

namespace {

constexpr int64_t kMaxTensorBytes = int64_t{1} << 16;
constexpr size_t kMaxWorkspaceBytes = size_t{1} << 20;
constexpr double kMaxWork = 1 << 16;  // B*N*H*Lq*Lk*D of a problem that is computed

[[noreturn]] void fail(const char* fn, const char* what) {
  std::fprintf(stderr, "fuzz_validation: %s: %s (last error: \"%s\")\n", fn, what,
               evoattn_last_error());
  std::abort();
}

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}

  uint8_t byte() { return p_ < end_ ? *p_++ : 0; }

  uint64_t little_endian(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{byte()} << (8 * i);
    return v;
  }

  // One byte for the common small values (0x00..0xBF: -64..127) or for an edge validation must
  // hold at (0xC0..0xFE: kEdges); 0xFF, then 8 raw bytes, for anything else.
  int64_t integer() {
    const uint8_t c = byte();
    if (c < 0xC0) return int64_t{c} - 64;
    if (c < 0xFF) return kEdges[(c - 0xC0) % std::size(kEdges)];
    return static_cast<int64_t>(little_endian(8));
  }

  double real() {
    const uint64_t bits = little_endian(8);
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
  }

  static constexpr int64_t kEdges[] = {
      std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
      std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
      int64_t{1} << 40,                    (int64_t{1} << 40) + 1,
      -(int64_t{1} << 40),                 -(int64_t{1} << 40) - 1,
      int64_t{1} << 60,                    (int64_t{1} << 60) + 1,
      int64_t{1} << 62,                    -(int64_t{1} << 62),
      int64_t{1} << 31,                    int64_t{1} << 32,
      128,                                 129,
      257,                                 int64_t{1} << 20,
      int64_t{0xFFFFFFFF}};

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

using Buffer = std::unique_ptr<uint8_t, void (*)(void*)>;

// Exactly `bytes` (ASan guards the end), 16-byte aligned like framework allocations.
Buffer allocate(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 16, bytes > 0 ? bytes : 1) != 0) std::abort();
  return Buffer(static_cast<uint8_t*>(p), std::free);
}

enum Slot { kQ, kK, kV, kMaskBias, kPairBias, kMask, kO, kLse, kDO, kDQ, kDK, kDV,
            kDMaskBias, kDPairBias, kNumSlots };

struct Tensor {
  bool present = false;
  evoattn_tensor_t view{};
  Buffer buffer{nullptr, std::free};
  size_t bytes = 0;

  const evoattn_tensor_t* arg() const { return present ? &view : nullptr; }
  std::vector<uint8_t> contents() const {
    return buffer ? std::vector<uint8_t>(buffer.get(), buffer.get() + bytes) : std::vector<uint8_t>{};
  }
};

size_t element_bytes(int32_t dtype) {
  switch (dtype) {
    case EVOATTN_FLOAT16:
    case EVOATTN_BFLOAT16: return 2;
    case EVOATTN_FLOAT32: return 4;
    case EVOATTN_BOOL: return 1;
  }
  return 4;  // an unknown code must be rejected; the largest size keeps the buffer honest anyway
}

void decode_tensor(Reader& in, Tensor& t) {
  const uint8_t flags = in.byte();
  t.present = (flags & 1) != 0;
  // Raw codes, stored as a C caller may store them: any int, in or out of the enumeration.
  const int32_t dtype = static_cast<int32_t>(in.integer());
  const int32_t device = static_cast<int32_t>(in.integer());
  std::memcpy(&t.view.dtype, &dtype, sizeof dtype);
  std::memcpy(&t.view.device, &device, sizeof device);
  t.view.device_ordinal = static_cast<int32_t>(in.integer());
  t.view.ndim = static_cast<int32_t>(in.integer());
  for (int64_t& s : t.view.sizes) s = in.integer();
  for (int64_t& s : t.view.strides) s = in.integer();
  const uint8_t fill = in.byte();
  if (!t.present || (flags & 2) != 0) return;

  // The element offsets the view reaches, [lowest, highest], over the dimensions it has.
  int64_t lowest = 0, highest = 0;
  const int rank = t.view.ndim < 0 ? 0 : t.view.ndim > 5 ? 5 : t.view.ndim;
  for (int i = 0; i < rank; ++i) {
    const int64_t size = t.view.sizes[i], stride = t.view.strides[i];
    if (size <= 1) continue;  // no step along this dimension
    if (size > kMaxTensorBytes || stride > kMaxTensorBytes || stride < -kMaxTensorBytes) return;
    (stride < 0 ? lowest : highest) += stride * (size - 1);
  }
  const size_t element = element_bytes(dtype), misalign = (flags & 4) != 0 ? 1 : 0;
  const int64_t bytes = (highest - lowest + 1) * int64_t(element) + int64_t(misalign);
  if (bytes > kMaxTensorBytes) return;  // data stays NULL
  t.bytes = size_t(bytes);
  t.buffer = allocate(t.bytes);
  std::memset(t.buffer.get(), fill, t.bytes);
  t.view.data = t.buffer.get() + misalign + size_t(-lowest) * element;
}

struct Options {
  bool present = false;
  evoattn_options_t value{};
  const evoattn_options_t* arg() const { return present ? &value : nullptr; }
};

Options decode_options(Reader& in) {
  Options o;
  const uint8_t flags = in.byte();
  o.present = (flags & 1) != 0;
  evoattn_options_init(&o.value);
  if ((flags & 2) != 0) o.value.abi_version = static_cast<uint32_t>(in.integer());
  o.value.has_scale = static_cast<int32_t>(in.integer());
  o.value.scale = in.real();
  o.value.deterministic = static_cast<int32_t>(in.integer());
  o.value.allow_tf32 = static_cast<int32_t>(in.integer());
  o.value.num_threads = static_cast<int32_t>(in.integer());
  // Every positive count is as valid as another; more threads would only slow the fuzzer.
  if (o.value.num_threads > 2) o.value.num_threads = 2;
  return o;
}

// The header's promise for every call: success with no message, or a documented error status
// with a message that starts with the entry point's name. EVOATTN_ERROR_INTERNAL (an exception
// inside the library) counts as a bug on problems this small.
void check_status(const char* fn, evoattn_status_t status) {
  const char* message = evoattn_last_error();
  static const bool verbose = std::getenv("FUZZ_VALIDATION_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "%s: %s %s\n", fn, evoattn_status_string(status), message);
  int32_t code;
  std::memcpy(&code, &status, sizeof code);
  if (code == EVOATTN_SUCCESS) {
    if (message[0] != '\0') fail(fn, "success, but a last error is left");
    return;
  }
  if (code < EVOATTN_ERROR_INVALID_ARGUMENT || code > EVOATTN_ERROR_CUDA) {
    fail(fn, "an undocumented or internal error status");
  }
  const size_t n = std::strlen(fn);
  if (std::strncmp(message, fn, n) != 0 || message[n] != ':') {
    fail(fn, "an error whose message does not start with the entry point's name");
  }
}

double work(const evoattn::Problem& p) {
  return double(p.B) * double(p.N) * double(p.H) * double(p.Lq) * double(p.Lk) * double(p.D);
}

// Runs `call` unless validation accepts a problem too big to compute here, and checks it: the
// status as check_status wants it, the same status validation alone gives when that rejects,
// and the buffers of `outputs` unchanged after an error.
template <typename Validate, typename Call>
void run_checked(const char* fn, const Tensor* tensors, std::initializer_list<Slot> outputs,
                 Validate&& validate, Call&& call) {
  evoattn::Problem problem{};
  const evoattn_status_t expected = validate(&problem);
  if (expected == EVOATTN_SUCCESS && work(problem) > kMaxWork) return;
  std::vector<std::vector<uint8_t>> before;
  for (Slot s : outputs) before.push_back(tensors[s].contents());
  const evoattn_status_t status = call();
  check_status(fn, status);
  if (expected != EVOATTN_SUCCESS && status != expected) {
    fail(fn, "a status other than validation's own");
  }
  if (status != EVOATTN_SUCCESS) {
    size_t i = 0;
    for (Slot s : outputs) {
      if (tensors[s].contents() != before[i++]) fail(fn, "an error, but an output was written");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace evoattn;
  Reader in(data, size);
  const Options options = decode_options(in);
  Tensor t[kNumSlots];
  for (Tensor& tensor : t) decode_tensor(in, tensor);
  const uint8_t call_flags = in.byte();

  // The workspace query: reads no data, so any sizes reach the kernels' sizing code.
  size_t workspace_bytes = 0;
  const char* query = "evoattn_backward_workspace_size";
  const evoattn_status_t queried = evoattn_backward_workspace_size(
      t[kQ].arg(), t[kK].arg(), t[kV].arg(), t[kMaskBias].arg(), t[kPairBias].arg(),
      t[kMask].arg(), t[kDMaskBias].arg(), t[kDPairBias].arg(), options.arg(),
      (call_flags & 4) != 0 ? nullptr : &workspace_bytes);
  check_status(query, queried);

  const char* forward = "evoattn_forward";
  const ForwardArgs fwd{t[kQ].arg(),        t[kK].arg(),    t[kV].arg(), t[kMaskBias].arg(),
                        t[kPairBias].arg(), t[kMask].arg(), t[kO].arg(), t[kLse].arg()};
  run_checked(
      forward, t, {kO, kLse},
      [&](Problem* problem) {
        evoattn_options_t opt;
        const evoattn_status_t s = validate_options(forward, options.arg(), &opt);
        return s != EVOATTN_SUCCESS ? s : validate_forward(forward, fwd, opt, true, problem);
      },
      [&] {
        return evoattn_forward(fwd.q, fwd.k, fwd.v, fwd.mask_bias, fwd.pair_bias, fwd.mask, fwd.o,
                               fwd.lse, options.arg(), nullptr);
      });

  // Backward's workspace, as the call flags say, sized by the query above.
  Buffer workspace{nullptr, std::free};
  void* workspace_ptr = nullptr;
  size_t claimed = 0;
  if (queried == EVOATTN_SUCCESS && (call_flags & 4) == 0 && workspace_bytes <= kMaxWorkspaceBytes) {
    switch (call_flags & 3) {
      case 0:  // NULL, with the right size claimed
        claimed = workspace_bytes;
        break;
      case 1:
      case 2:  // exact, or one byte short
        claimed = (call_flags & 3) == 1 || workspace_bytes == 0 ? workspace_bytes : workspace_bytes - 1;
        workspace = allocate(claimed);
        workspace_ptr = workspace.get();
        break;
      case 3:  // large enough, 8 bytes off 16-byte alignment
        claimed = workspace_bytes;
        workspace = allocate(claimed + 8);
        workspace_ptr = workspace.get() + 8;
        break;
    }
  }

  const char* backward = "evoattn_backward";
  BackwardArgs bwd{};
  bwd.fwd = fwd;
  bwd.d_o = t[kDO].arg();
  bwd.dq = t[kDQ].arg();
  bwd.dk = t[kDK].arg();
  bwd.dv = t[kDV].arg();
  bwd.d_bias[0] = t[kDMaskBias].arg();
  bwd.d_bias[1] = t[kDPairBias].arg();
  run_checked(
      backward, t, {kDQ, kDK, kDV, kDMaskBias, kDPairBias},
      [&](Problem* problem) {
        evoattn_options_t opt;
        const evoattn_status_t s = validate_options(backward, options.arg(), &opt);
        return s != EVOATTN_SUCCESS ? s : validate_backward(backward, bwd, opt, true, problem);
      },
      [&] {
        return evoattn_backward(bwd.d_o, fwd.q, fwd.k, fwd.v, fwd.o, fwd.lse, fwd.mask_bias,
                                fwd.pair_bias, fwd.mask, bwd.dq, bwd.dk, bwd.dv, bwd.d_bias[0],
                                bwd.d_bias[1], workspace_ptr, claimed, options.arg(), nullptr);
      });
  return 0;
}
