// Every error class of docs/CONTRACT.md "Memory, streams, errors": the status, a last-error message that
// names the argument, and outputs left exactly as they were (poisoned). A valid float32 problem
// is set up once per test; each test breaks one thing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention_case.h"

namespace evoattn::test {
namespace {

constexpr int64_t B = 2, N = 3, H = 2, Lq = 4, Lk = 5, D = 8;

// One argument: its view (which tests may edit) and whether it is passed or NULL.
struct Arg {
  util::Tensor tensor;
  evoattn_tensor_t view{};
  bool given = true;
  const evoattn_tensor_t* ptr() const { return given ? &view : nullptr; }
};

Arg make_arg(const std::vector<int64_t>& sizes, evoattn_dtype_t dtype, bool output) {
  Arg a;
  a.tensor = util::Tensor::empty(sizes, dtype);
  std::memset(a.tensor.buffer.data(), output ? 0xFF : 0, a.tensor.buffer.bytes());
  a.view = a.tensor.view;
  return a;
}

class Validation : public ::testing::Test {
 protected:
  void SetUp() override {
    build(D);
    evoattn_options_init(&options);
    ASSERT_EQ(workspace_size(&workspace_bytes), EVOATTN_SUCCESS) << evoattn_last_error();
    ASSERT_GT(workspace_bytes, 0u);
    workspace = util::Buffer(workspace_bytes, EVOATTN_DEVICE_CPU);
    workspace_ptr = workspace.data();
  }

  // Every argument for head dim `d`, outputs poisoned with 0xFF bytes.
  void build(int64_t d) {
    q = make_arg({B, N, Lq, H, d}, EVOATTN_FLOAT32, false);
    k = make_arg({B, N, Lk, H, d}, EVOATTN_FLOAT32, false);
    v = make_arg({B, N, Lk, H, d}, EVOATTN_FLOAT32, false);
    mask_bias = make_arg({B, N, 1, 1, Lk}, EVOATTN_FLOAT32, false);
    pair_bias = make_arg({B, 1, H, Lq, Lk}, EVOATTN_FLOAT32, false);
    mask = make_arg({B, N, Lk}, EVOATTN_BOOL, false);
    d_o = make_arg({B, N, Lq, H, d}, EVOATTN_FLOAT32, false);
    o = make_arg({B, N, Lq, H, d}, EVOATTN_FLOAT32, true);
    lse = make_arg({B, N, H, Lq}, EVOATTN_FLOAT32, true);
    dq = make_arg({B, N, Lq, H, d}, EVOATTN_FLOAT32, true);
    dk = make_arg({B, N, Lk, H, d}, EVOATTN_FLOAT32, true);
    dv = make_arg({B, N, Lk, H, d}, EVOATTN_FLOAT32, true);
    d_mask_bias = make_arg({B, N, 1, 1, Lk}, EVOATTN_FLOAT32, true);
    d_pair_bias = make_arg({B, 1, H, Lq, Lk}, EVOATTN_FLOAT32, true);
  }

  evoattn_status_t forward() {
    return evoattn_forward(q.ptr(), k.ptr(), v.ptr(), mask_bias.ptr(), pair_bias.ptr(), mask.ptr(),
                           o.ptr(), lse.ptr(), &options, nullptr);
  }

  evoattn_status_t backward() {
    return evoattn_backward(d_o.ptr(), q.ptr(), k.ptr(), v.ptr(), o.ptr(), lse.ptr(),
                            mask_bias.ptr(), pair_bias.ptr(), mask.ptr(), dq.ptr(), dk.ptr(),
                            dv.ptr(), d_mask_bias.ptr(), d_pair_bias.ptr(), workspace_ptr,
                            workspace_bytes, &options, nullptr);
  }

  evoattn_status_t workspace_size(size_t* bytes) {
    return evoattn_backward_workspace_size(q.ptr(), k.ptr(), v.ptr(), mask_bias.ptr(),
                                           pair_bias.ptr(), mask.ptr(), d_mask_bias.ptr(),
                                           d_pair_bias.ptr(), &options, bytes);
  }

  // The call failed with `want`, its message names 'arg', and no output byte changed.
  void expect_error(evoattn_status_t got, evoattn_status_t want, const std::string& arg) {
    const std::string message = evoattn_last_error();
    EXPECT_EQ(got, want) << message;
    EXPECT_NE(message.find("'" + arg + "'"), std::string::npos)
        << "the message does not name '" << arg << "': " << message;
    for (const Arg* out : {&o, &lse, &dq, &dk, &dv, &d_mask_bias, &d_pair_bias}) {
      const auto* bytes = static_cast<const unsigned char*>(out->tensor.buffer.data());
      for (size_t i = 0; i < out->tensor.buffer.bytes(); ++i) {
        if (bytes[i] != 0xFF) {
          ADD_FAILURE() << "an output was written by a failing call (byte " << i << ")";
          return;
        }
      }
    }
  }

  // The same error from the forward, the backward and (unless it is about data) the
  // workspace query.
  void expect_error_everywhere(evoattn_status_t want, const std::string& arg,
                               bool about_data = false) {
    expect_error(forward(), want, arg);
    expect_error(backward(), want, arg);
    size_t bytes = 0;
    if (!about_data) expect_error(workspace_size(&bytes), want, arg);
  }

  Arg q, k, v, mask_bias, pair_bias, mask, d_o, o, lse, dq, dk, dv, d_mask_bias, d_pair_bias;
  evoattn_options_t options{};
  util::Buffer workspace;
  void* workspace_ptr = nullptr;
  size_t workspace_bytes = 0;
};

TEST_F(Validation, NullRequiredTensor) {
  const std::pair<Arg*, const char*> inputs[] = {{&q, "q"}, {&k, "k"}, {&v, "v"}};
  for (const auto& [arg, name] : inputs) {
    SCOPED_TRACE(name);
    arg->given = false;
    expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, name);
    arg->given = true;
  }
  const std::pair<Arg*, const char*> backward_only[] = {
      {&d_o, "d_o"}, {&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}, {&o, "o"}};
  for (const auto& [arg, name] : backward_only) {
    SCOPED_TRACE(name);
    arg->given = false;
    expect_error(backward(), EVOATTN_ERROR_INVALID_ARGUMENT, name);
    arg->given = true;
  }
  o.given = false;
  expect_error(forward(), EVOATTN_ERROR_INVALID_ARGUMENT, "o");
}

TEST_F(Validation, LseNullInBackward) {
  lse.given = false;
  expect_error(backward(), EVOATTN_ERROR_INVALID_ARGUMENT, "lse");
}

TEST_F(Validation, NullData) {
  q.view.data = nullptr;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "q", /*about_data=*/true);
  q.view = q.tensor.view;
  pair_bias.view.data = nullptr;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "pair_bias", true);
  pair_bias.view = pair_bias.tensor.view;
  o.view.data = nullptr;
  expect_error(forward(), EVOATTN_ERROR_INVALID_ARGUMENT, "o");
  o.view = o.tensor.view;
  dk.view.data = nullptr;
  expect_error(backward(), EVOATTN_ERROR_INVALID_ARGUMENT, "dk");
}

TEST_F(Validation, WrongNumberOfDimensions) {
  q.view.ndim = 4;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "q");
  q.view = q.tensor.view;
  mask_bias.view.ndim = 3;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "mask_bias");
  mask_bias.view = mask_bias.tensor.view;
  mask.view.ndim = 4;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "mask");
  mask.view = mask.tensor.view;
  lse.view.ndim = 3;
  expect_error(forward(), EVOATTN_ERROR_INVALID_ARGUMENT, "lse");
}

TEST_F(Validation, SizeZero) {
  q.view.sizes[0] = 0;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "q");
}

TEST_F(Validation, KeyValueSizeMismatch) {
  k.view.sizes[3] = H + 1;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "k");
  k.view = k.tensor.view;
  v.view.sizes[2] = Lk - 1;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "v");
}

TEST_F(Validation, BiasDoesNotBroadcast) {
  mask_bias.view.sizes[4] = Lk + 1;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "mask_bias");
  mask_bias.view = mask_bias.tensor.view;
  pair_bias.view.sizes[3] = 2;  // neither Lq = 4 nor 1
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "pair_bias");
  pair_bias.view = pair_bias.tensor.view;
  mask.view.sizes[2] = Lk - 1;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "mask");
}

TEST_F(Validation, WrongDtypes) {
  mask.view.dtype = EVOATTN_FLOAT32;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "mask");
  mask.view = mask.tensor.view;
  mask_bias.view.dtype = EVOATTN_FLOAT16;  // neither q's dtype nor float32
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "mask_bias");
  mask_bias.view = mask_bias.tensor.view;
  k.view.dtype = EVOATTN_BFLOAT16;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "k");
  k.view = k.tensor.view;
  o.view.dtype = EVOATTN_FLOAT16;
  expect_error(forward(), EVOATTN_ERROR_INVALID_ARGUMENT, "o");
  o.view = o.tensor.view;
  d_o.view.dtype = EVOATTN_FLOAT16;
  expect_error(backward(), EVOATTN_ERROR_INVALID_ARGUMENT, "d_o");
  d_o.view = d_o.tensor.view;
  d_pair_bias.view.dtype = EVOATTN_BOOL;
  expect_error(backward(), EVOATTN_ERROR_INVALID_ARGUMENT, "d_pair_bias");
}

// Stores `code` in an enum field as a C caller can, without forming an out-of-range C++ enum
// value here (which UndefinedBehaviorSanitizer reports).
template <typename Enum>
void store_code(Enum* field, int32_t code) {
  static_assert(sizeof(Enum) == sizeof(code), "the C API's enums are 32-bit");
  std::memcpy(field, &code, sizeof code);
}

TEST_F(Validation, UnsupportedDtype) {
  q.view.dtype = EVOATTN_BOOL;
  expect_error_everywhere(EVOATTN_ERROR_UNSUPPORTED, "q");
  for (int32_t code : {9, -1, std::numeric_limits<int32_t>::min()}) {
    store_code(&q.view.dtype, code);
    expect_error_everywhere(EVOATTN_ERROR_UNSUPPORTED, "q");
    EXPECT_NE(std::string(evoattn_last_error()).find("unknown dtype code " + std::to_string(code)),
              std::string::npos) << evoattn_last_error();
  }
}

TEST_F(Validation, UnknownDeviceCode) {
  for (int32_t code : {2, -7}) {
    store_code(&k.view.device, code);
    expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "k");
    EXPECT_NE(std::string(evoattn_last_error()).find("unknown device type"), std::string::npos);
  }
}

TEST_F(Validation, StrideOutOfRange) {
  // INT64_MIN has no magnitude in 64 bits (llabs of it is negative): it must not pass as small.
  for (int64_t stride : {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                         (int64_t{1} << 40) + 1, -(int64_t{1} << 40) - 1}) {
    SCOPED_TRACE(stride);
    q.view.strides[0] = stride;
    expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "q");
    EXPECT_NE(std::string(evoattn_last_error()).find("strides of magnitude at most 2^40"),
              std::string::npos) << evoattn_last_error();
  }
}

TEST_F(Validation, ViewsBeyondTheIndexRange) {
  // Sizes and strides each within 2^40 whose products are not: the element count, or the
  // farthest element's offset, past 2^60 (for an output, where the overlap check multiplies
  // them, this was a signed overflow).
  constexpr int64_t kBig = int64_t{1} << 40;
  for (Arg* a : {&q, &k, &v, &d_o, &o, &dq, &dk, &dv}) {
    a->view.sizes[1] = kBig;
    a->view.strides[1] = 1;
  }
  lse.view.sizes[1] = kBig;
  mask_bias.view.sizes[1] = mask.view.sizes[1] = 1;
  o.view.strides[1] = kBig;  // offset (2^40 - 1) * 2^40
  expect_error(forward(), EVOATTN_ERROR_INVALID_ARGUMENT, "o");
  EXPECT_NE(std::string(evoattn_last_error()).find("reach beyond 2^60 elements"), std::string::npos)
      << evoattn_last_error();
  o.view.strides[1] = 1;
  q.view.sizes[0] = k.view.sizes[0] = v.view.sizes[0] = kBig;  // 2^81 elements
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "q");
  EXPECT_NE(std::string(evoattn_last_error()).find("reach beyond 2^60 elements"), std::string::npos);
}

TEST_F(Validation, WorkspaceBeyond64Bits) {
  // q [2^20, 1, 2^20, 2^20, 1] (2^60 elements) with a pair bias of as many: the workspace bound
  // (row statistics, float32 dQ and d_pair_bias) is about 20 * 2^60 bytes, past 2^64. The query
  // once returned a wrapped size here.
  constexpr int64_t kM = int64_t{1} << 20;
  auto set = [](Arg& a, std::vector<int64_t> sizes, std::vector<int64_t> strides) {
    a.view.ndim = static_cast<int32_t>(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      a.view.sizes[i] = sizes[i];
      a.view.strides[i] = strides[i];
    }
  };
  set(q, {kM, 1, kM, kM, 1}, {kM * kM, 0, kM, 1, 1});
  set(k, {kM, 1, 1, kM, 1}, {kM, 0, 0, 1, 1});
  set(v, {kM, 1, 1, kM, 1}, {kM, 0, 0, 1, 1});
  set(pair_bias, {kM, 1, kM, kM, 1}, {kM * kM, 0, kM, 1, 1});
  set(d_pair_bias, {kM, 1, kM, kM, 1}, {kM * kM, 0, kM, 1, 1});
  mask_bias.given = mask.given = d_mask_bias.given = false;
  size_t bytes = 12345;
  expect_error(workspace_size(&bytes), EVOATTN_ERROR_INVALID_ARGUMENT, "q");
  EXPECT_NE(std::string(evoattn_last_error()).find("exceeds 2^64 bytes"), std::string::npos)
      << evoattn_last_error();
  EXPECT_EQ(bytes, 12345u);
  d_pair_bias.given = false;  // the row statistics and dQ alone: about 16 * 2^60, still past
  expect_error(workspace_size(&bytes), EVOATTN_ERROR_INVALID_ARGUMENT, "q");
}

TEST_F(Validation, HeadDimAbove128) {
  build(129);  // the workspace (independent of D) stays large enough
  expect_error_everywhere(EVOATTN_ERROR_UNSUPPORTED, "q");
}

TEST_F(Validation, MisalignedData) {
  q.view.data = static_cast<char*>(q.tensor.buffer.data()) + 2;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "q");
  q.view = q.tensor.view;
  o.view.data = static_cast<char*>(o.tensor.buffer.data()) + 1;
  expect_error(forward(), EVOATTN_ERROR_INVALID_ARGUMENT, "o");
}

TEST_F(Validation, TensorsOnDifferentDevices) {
  const std::pair<Arg*, const char*> inputs[] = {
      {&k, "k"}, {&pair_bias, "pair_bias"}, {&mask, "mask"}};
  for (const auto& [arg, name] : inputs) {
    SCOPED_TRACE(name);
    arg->view.device = EVOATTN_DEVICE_CUDA;
    expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, name);
    EXPECT_NE(std::string(evoattn_last_error()).find("cuda:0"), std::string::npos);
    arg->view.device = EVOATTN_DEVICE_CPU;
  }
  o.view.device = EVOATTN_DEVICE_CUDA;
  expect_error(forward(), EVOATTN_ERROR_INVALID_ARGUMENT, "o");
  o.view.device = EVOATTN_DEVICE_CPU;
  dq.view.device = EVOATTN_DEVICE_CUDA;
  expect_error(backward(), EVOATTN_ERROR_INVALID_ARGUMENT, "dq");
}

// Views tagged CUDA (on host memory, never read) in a library that cannot run them.
TEST_F(Validation, CudaTensorsWithoutCudaBackend) {
  if (evoattn_cuda_available() != 0) GTEST_SKIP() << "a CUDA backend is available";
  for (Arg* a : {&q, &k, &v, &mask_bias, &pair_bias, &mask, &d_o, &o, &lse, &dq, &dk, &dv,
                 &d_mask_bias, &d_pair_bias}) {
    a->view.device = EVOATTN_DEVICE_CUDA;
  }
  ASSERT_EQ(workspace_size(&workspace_bytes), EVOATTN_SUCCESS) << evoattn_last_error();
  workspace = util::Buffer(workspace_bytes, EVOATTN_DEVICE_CPU);  // never read
  workspace_ptr = workspace.data();
  expect_error(forward(), EVOATTN_ERROR_BACKEND_UNAVAILABLE, "q");
  expect_error(backward(), EVOATTN_ERROR_BACKEND_UNAVAILABLE, "q");
}

TEST_F(Validation, WorkspaceTooSmall) {
  workspace_ptr = nullptr;
  expect_error(backward(), EVOATTN_ERROR_WORKSPACE_TOO_SMALL, "workspace");
  workspace_ptr = workspace.data();
  --workspace_bytes;
  expect_error(backward(), EVOATTN_ERROR_WORKSPACE_TOO_SMALL, "workspace");
}

TEST_F(Validation, MisalignedWorkspace) {
  workspace = util::Buffer(workspace_bytes + 16, EVOATTN_DEVICE_CPU);
  workspace_ptr = static_cast<char*>(workspace.data()) + 4;
  expect_error(backward(), EVOATTN_ERROR_INVALID_ARGUMENT, "workspace");
}

TEST_F(Validation, NonFiniteScale) {
  options.has_scale = 1;
  for (double scale :
       {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    options.scale = scale;
    expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "options.scale");
  }
}

TEST_F(Validation, OptionsAbiVersionMismatch) {
  options.abi_version = EVOATTN_ABI_VERSION + 1;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "options");
}

TEST_F(Validation, NegativeThreadCount) {
  options.num_threads = -1;
  expect_error_everywhere(EVOATTN_ERROR_INVALID_ARGUMENT, "options.num_threads");
}

TEST_F(Validation, GradientForAbsentBias) {
  mask_bias.given = false;
  size_t bytes = 0;
  expect_error(backward(), EVOATTN_ERROR_INVALID_ARGUMENT, "d_mask_bias");
  expect_error(workspace_size(&bytes), EVOATTN_ERROR_INVALID_ARGUMENT, "d_mask_bias");
  mask_bias.given = true;
  pair_bias.given = false;
  expect_error(backward(), EVOATTN_ERROR_INVALID_ARGUMENT, "d_pair_bias");
  expect_error(workspace_size(&bytes), EVOATTN_ERROR_INVALID_ARGUMENT, "d_pair_bias");
}

TEST_F(Validation, BiasGradientWrongShape) {
  d_pair_bias.view.sizes[1] = N;  // the bias has size 1 there
  expect_error(backward(), EVOATTN_ERROR_INVALID_ARGUMENT, "d_pair_bias");
}

TEST_F(Validation, OverlappingOutputs) {
  o.view.strides[4] = 0;
  expect_error(forward(), EVOATTN_ERROR_INVALID_ARGUMENT, "o");
  o.view = o.tensor.view;
  lse.view.strides[3] = 0;
  expect_error(forward(), EVOATTN_ERROR_INVALID_ARGUMENT, "lse");
  lse.view = lse.tensor.view;
  dq.view.strides[2] = 1;  // rows overlap the head dim
  expect_error(backward(), EVOATTN_ERROR_INVALID_ARGUMENT, "dq");
  dq.view = dq.tensor.view;
  d_mask_bias.view.strides[4] = 0;
  expect_error(backward(), EVOATTN_ERROR_INVALID_ARGUMENT, "d_mask_bias");
}

TEST_F(Validation, LseWrongDtypeOrShape) {
  lse.view.dtype = EVOATTN_FLOAT16;
  expect_error(forward(), EVOATTN_ERROR_INVALID_ARGUMENT, "lse");
  expect_error(backward(), EVOATTN_ERROR_INVALID_ARGUMENT, "lse");
  lse.view = lse.tensor.view;
  lse.view.sizes[3] = Lq + 1;
  expect_error(forward(), EVOATTN_ERROR_INVALID_ARGUMENT, "lse");
}

TEST_F(Validation, WorkspaceSizeNeedsAnOutputPointer) {
  expect_error(workspace_size(nullptr), EVOATTN_ERROR_INVALID_ARGUMENT, "bytes");
}

TEST_F(Validation, SuccessClearsTheLastError) {
  q.given = false;
  ASSERT_NE(forward(), EVOATTN_SUCCESS);
  ASSERT_STRNE(evoattn_last_error(), "");
  q.given = true;
  size_t bytes = 0;
  ASSERT_EQ(workspace_size(&bytes), EVOATTN_SUCCESS);
  EXPECT_STREQ(evoattn_last_error(), "");
  q.given = false;
  ASSERT_NE(backward(), EVOATTN_SUCCESS);
  q.given = true;
  ASSERT_EQ(forward(), EVOATTN_SUCCESS) << evoattn_last_error();
  EXPECT_STREQ(evoattn_last_error(), "");
}

// has_scale = 0 means the default scale: whatever `scale` holds is not read.
TEST_F(Validation, ScaleIgnoredWithoutHasScale) {
  options.scale = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(forward(), EVOATTN_SUCCESS) << evoattn_last_error();
}

}  // namespace
}  // namespace evoattn::test
