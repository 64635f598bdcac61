// CUDA-only properties: calls on the caller's stream capture into a CUDA graph and replay to the
// same bytes (dQ in its own pass and in the dK/dV pass); 64-bit indexing with a tensor of more
// than 2^31 elements; the backward workspace within the contract's bound; the kernel variants of GPUs
// with less shared memory. Skipped without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "attention_case.h"
#include "cuda/launch_plan.h"
#include "evoattn/evoattn.h"
#include "reference/reference.h"
#include "scoped_env.h"
#include "tensor_util.h"

#ifdef EVOATTN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace evoattn::test {
namespace {

#ifdef EVOATTN_WITH_CUDA

using util::Tensor;
constexpr evoattn_device_type_t kGpu = EVOATTN_DEVICE_CUDA;

void check(cudaError_t e) { util::check_cuda(e, "cuda"); }

// Forward + backward (both bias gradients) of one problem on `stream`, device tensors given.
// N = 3, H = 2: dQ in its own pass; N = 128, H = 2 (B N H = 512): dQ in the dK/dV pass, with a
// running-dQ slot pool whose busy flags a memset on the stream clears.
struct Problem {
  Tensor q, k, v, d_o, mb, pb, o, lse, dq, dk, dv, dmb, dpb;
  util::Buffer workspace;

  Problem(uint64_t seed, int64_t N, int64_t H) {
    const int64_t B = 2, L = 70, D = 32;
    std::mt19937_64 rng(seed);
    auto random = [&](std::vector<int64_t> sizes, double lo, double hi) {
      Tensor t = Tensor::empty(sizes, EVOATTN_BFLOAT16);
      util::fill_uniform(t.view, rng, lo, hi);
      return t.to(kGpu);
    };
    q = random({B, N, L, H, D}, -1, 1);
    k = random({B, N, L, H, D}, -1, 1);
    v = random({B, N, L, H, D}, -1, 1);
    d_o = random({B, N, L, H, D}, -1, 1);
    mb = random({B, N, 1, 1, L}, -2, 0);
    pb = random({B, 1, H, L, L}, -2, 2);
    o = Tensor::empty({B, N, L, H, D}, EVOATTN_BFLOAT16, kGpu);
    lse = Tensor::empty({B, N, H, L}, EVOATTN_FLOAT32, kGpu);
    dq = Tensor::empty({B, N, L, H, D}, EVOATTN_BFLOAT16, kGpu);
    dk = Tensor::empty({B, N, L, H, D}, EVOATTN_BFLOAT16, kGpu);
    dv = Tensor::empty({B, N, L, H, D}, EVOATTN_BFLOAT16, kGpu);
    dmb = Tensor::empty({B, N, 1, 1, L}, EVOATTN_FLOAT32, kGpu);
    dpb = Tensor::empty({B, 1, H, L, L}, EVOATTN_FLOAT32, kGpu);
    size_t bytes = 0;
    EXPECT_EQ(evoattn_backward_workspace_size(q.ptr(), k.ptr(), v.ptr(), mb.ptr(), pb.ptr(), nullptr,
                                              dmb.ptr(), dpb.ptr(), nullptr, &bytes),
              EVOATTN_SUCCESS);
    workspace = util::Buffer(bytes, kGpu);
  }

  // The workspace too: the backward may rely on nothing in it (a stale running-dQ slot, or
  // busy flags it did not clear, would show).
  void poison_outputs(cudaStream_t stream) {
    for (Tensor* t : {&o, &lse, &dq, &dk, &dv, &dmb, &dpb}) {
      check(cudaMemsetAsync(t->buffer.data(), 0xff, t->buffer.bytes(), stream));
    }
    check(cudaMemsetAsync(workspace.data(), 0xff, workspace.bytes(), stream));
  }

  void run(cudaStream_t stream) {
    ASSERT_EQ(evoattn_forward(q.ptr(), k.ptr(), v.ptr(), mb.ptr(), pb.ptr(), nullptr, o.ptr(),
                              lse.ptr(), nullptr, stream),
              EVOATTN_SUCCESS)
        << evoattn_last_error();
    ASSERT_EQ(evoattn_backward(d_o.ptr(), q.ptr(), k.ptr(), v.ptr(), o.ptr(), lse.ptr(), mb.ptr(),
                               pb.ptr(), nullptr, dq.ptr(), dk.ptr(), dv.ptr(), dmb.ptr(), dpb.ptr(),
                               workspace.data(), workspace.bytes(), nullptr, stream),
              EVOATTN_SUCCESS)
        << evoattn_last_error();
  }

  std::vector<Tensor> results() const {
    std::vector<Tensor> out;
    for (const Tensor* t : {&o, &lse, &dq, &dk, &dv, &dmb, &dpb}) out.push_back(t->to(EVOATTN_DEVICE_CPU));
    return out;
  }
};

void expect_graph_replays_to_the_same_bytes(int64_t N, int64_t H) {
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Problem prob(/*seed=*/901 + N, N, H);

  prob.poison_outputs(stream);
  prob.run(stream);
  check(cudaStreamSynchronize(stream));
  const std::vector<Tensor> direct = prob.results();

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  prob.poison_outputs(stream);
  prob.run(stream);
  check(cudaStreamEndCapture(stream, &graph));
  check(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    prob.poison_outputs(stream);  // outside the graph too: the replay must write everything
    check(cudaGraphLaunch(exec, stream));
    check(cudaStreamSynchronize(stream));
    const std::vector<Tensor> replayed = prob.results();
    for (size_t i = 0; i < direct.size(); ++i) {
      EXPECT_TRUE(same_bytes(direct[i], replayed[i])) << "output " << i << ", replay " << replay;
    }
  }
  check(cudaGraphExecDestroy(exec));
  check(cudaGraphDestroy(graph));
  check(cudaStreamDestroy(stream));
}

TEST(CudaGraph, CapturedForwardBackwardReplaysToTheSameBytes) {
  if (backend_missing(Backend::kCuda)) GTEST_SKIP() << kNoCudaMessage;
  expect_graph_replays_to_the_same_bytes(/*N=*/3, /*H=*/2);
}

TEST(CudaGraph, CapturedFusedBackwardReplaysToTheSameBytes) {
  if (backend_missing(Backend::kCuda)) GTEST_SKIP() << kNoCudaMessage;
  expect_graph_replays_to_the_same_bytes(/*N=*/128, /*H=*/2);
}

// B = N = H = 1, Lq = Lk = 46400: the pair bias and its gradient hold 2.15e9 > 2^31 elements,
// so every bias offset past row 46281 overflows 32-bit arithmetic. Rows are checked against a
// float64 computation of just those rows (no bias-gradient reduction at B = N = H = 1).
TEST(LargeIndex, PairBiasBeyond2To31Elements) {
  if (backend_missing(Backend::kCuda)) GTEST_SKIP() << kNoCudaMessage;
  const int64_t L = 46400, D = 8;
  ASSERT_GT(L * L, int64_t{1} << 31);
  std::mt19937_64 rng(911);
  auto small = [&](double lo, double hi) {
    Tensor t = Tensor::empty({1, 1, L, 1, D}, EVOATTN_BFLOAT16);
    util::fill_uniform(t.view, rng, lo, hi);
    return t;
  };
  const Tensor q = small(-1, 1), k = small(-1, 1), v = small(-1, 1), d_o = small(-1, 1);
  // Row i of the bias is a random row rotated by 7919 i: cheap to build, different per row.
  Tensor row = Tensor::empty({L}, EVOATTN_BFLOAT16);
  util::fill_uniform(row.view, rng, -3, 3);
  const uint16_t* base = static_cast<const uint16_t*>(row.view.data);
  Tensor pb = Tensor::empty({1, 1, 1, L, L}, EVOATTN_BFLOAT16);
  uint16_t* dst = static_cast<uint16_t*>(pb.view.data);
  for (int64_t i = 0; i < L; ++i) {
    const int64_t shift = (i * 7919) % L;
    std::memcpy(dst + i * L, base + shift, (L - shift) * 2);
    std::memcpy(dst + i * L + (L - shift), base, shift * 2);
  }
  const Tensor gq = q.to(kGpu), gk = k.to(kGpu), gv = v.to(kGpu), gdo = d_o.to(kGpu), gpb = pb.to(kGpu);
  Tensor o = Tensor::empty({1, 1, L, 1, D}, EVOATTN_BFLOAT16, kGpu);
  Tensor lse = Tensor::empty({1, 1, 1, L}, EVOATTN_FLOAT32, kGpu);
  Tensor dq = Tensor::empty({1, 1, L, 1, D}, EVOATTN_BFLOAT16, kGpu);
  Tensor dk = Tensor::empty({1, 1, L, 1, D}, EVOATTN_BFLOAT16, kGpu);
  Tensor dv = Tensor::empty({1, 1, L, 1, D}, EVOATTN_BFLOAT16, kGpu);
  Tensor dpb = Tensor::empty({1, 1, 1, L, L}, EVOATTN_BFLOAT16, kGpu);
  check(cudaMemset(dpb.buffer.data(), 0xff, dpb.buffer.bytes()));
  ASSERT_EQ(evoattn_forward(gq.ptr(), gk.ptr(), gv.ptr(), nullptr, gpb.ptr(), nullptr, o.ptr(),
                            lse.ptr(), nullptr, nullptr),
            EVOATTN_SUCCESS)
      << evoattn_last_error();
  size_t bytes = 0;
  ASSERT_EQ(evoattn_backward_workspace_size(gq.ptr(), gk.ptr(), gv.ptr(), nullptr, gpb.ptr(), nullptr,
                                            nullptr, dpb.ptr(), nullptr, &bytes),
            EVOATTN_SUCCESS);
  util::Buffer workspace(bytes, kGpu);
  ASSERT_EQ(evoattn_backward(gdo.ptr(), gq.ptr(), gk.ptr(), gv.ptr(), o.ptr(), lse.ptr(), nullptr,
                             gpb.ptr(), nullptr, dq.ptr(), dk.ptr(), dv.ptr(), nullptr, dpb.ptr(),
                             workspace.data(), workspace.bytes(), nullptr, nullptr),
            EVOATTN_SUCCESS)
      << evoattn_last_error();
  check(cudaDeviceSynchronize());
  const Tensor o_h = o.to(EVOATTN_DEVICE_CPU), lse_h = lse.to(EVOATTN_DEVICE_CPU);
  const Tensor dq_h = dq.to(EVOATTN_DEVICE_CPU);

  const double scale = 1.0 / std::sqrt(double(D));
  const std::vector<double> qd = util::to_doubles(q.view), kd = util::to_doubles(k.view);
  const std::vector<double> vd = util::to_doubles(v.view), dod = util::to_doubles(d_o.view);
  const std::vector<double> od = util::to_doubles(o_h.view), dqd = util::to_doubles(dq_h.view);
  const std::vector<double> bias_row = util::to_doubles(row.view);
  std::vector<double> got, want;
  for (int64_t i : {int64_t{0}, int64_t{1}, L / 2, L - 2, L - 1}) {
    // float64 row i: scores, softmax, o, lse, dS = P (dP - sum P dP).
    std::vector<double> s(L), P(L), dp(L);
    double m = -INFINITY;
    for (int64_t j = 0; j < L; ++j) {
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += qd[i * D + d] * kd[j * D + d];
      s[j] = scale * dot + bias_row[(j + (i * 7919) % L) % L];
      m = std::max(m, s[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < L; ++j) sum += std::exp(s[j] - m);
    double delta = 0;
    for (int64_t j = 0; j < L; ++j) {
      P[j] = std::exp(s[j] - m) / sum;
      double d = 0;
      for (int dd = 0; dd < D; ++dd) d += dod[i * D + dd] * vd[j * D + dd];
      dp[j] = d;
      delta += P[j] * d;
    }
    for (int d = 0; d < D; ++d) {
      double acc = 0, acc_dq = 0;
      for (int64_t j = 0; j < L; ++j) {
        acc += P[j] * vd[j * D + d];
        acc_dq += P[j] * (dp[j] - delta) * scale * kd[j * D + d];
      }
      want.push_back(acc);
      got.push_back(od[i * D + d]);
      want.push_back(acc_dq);
      got.push_back(dqd[i * D + d]);
    }
    want.push_back(m + std::log(sum));
    got.push_back(static_cast<const float*>(lse_h.view.data)[i]);
    // The gradient row i sits at element offset i * L: past 2^31 for the last rows.
    Tensor grad_row = Tensor::empty({L}, EVOATTN_BFLOAT16);
    check(cudaMemcpy(grad_row.view.data, static_cast<uint16_t*>(dpb.view.data) + i * L, L * 2,
                     cudaMemcpyDeviceToHost));
    const std::vector<double> g = util::to_doubles(grad_row.view);
    for (int64_t j = 0; j < L; j += 97) {
      want.push_back(P[j] * (dp[j] - delta));
      got.push_back(g[j]);
    }
  }
  EXPECT_LE(util::relative_error(got, want), 8e-3) << "bf16 bound on sampled rows";
}


// docs/CONTRACT.md: the backward's workspace is at most float32 buffers the size of dQ (four
// floats a query row where D < 4) plus one per requested bias gradient. Descriptors only (the
// size query reads no data): the suite's shapes and a few edges, in bfloat16 and float32, with
// the gradients the bench asks for and with both. The query with descriptors whose data is NULL
// (JAX sizes the workspace at trace time so) gives the same size.
TEST(Workspace, WithinSpecBoundOnSuiteShapes) {
  if (backend_missing(Backend::kCuda)) GTEST_SKIP() << kNoCudaMessage;
  struct Shape {
    const char* name;
    int64_t B, N, L, H, D;
    bool mask, pair;
  };
  const Shape shapes[] = {
      {"tri256", 1, 256, 256, 4, 32, true, true},   {"tri768", 1, 768, 768, 4, 32, true, true},
      {"msarow", 1, 512, 256, 8, 32, true, true},   {"msacol", 1, 256, 512, 8, 32, true, false},
      {"extramsa", 1, 5120, 384, 8, 8, true, true}, {"template", 4, 256, 256, 4, 16, true, true},
      {"apb768", 1, 1, 768, 16, 24, false, true},   {"tri256d64", 1, 256, 256, 8, 64, true, true},
      {"b4tri384", 4, 384, 384, 4, 32, true, true}, {"d128", 1, 64, 200, 4, 128, true, true},
      {"one_key_tile", 1, 300, 40, 4, 32, true, true}, {"odd_d", 2, 70, 130, 3, 20, true, true},
      {"tiny", 1, 1, 4, 1, 8, true, true},   {"d2", 1, 8, 40, 2, 2, true, false},
      {"d3", 1, 8, 40, 2, 3, false, false},
  };
  std::vector<std::pair<evoattn_dtype_t, Shape>> cases;
  for (evoattn_dtype_t dtype : {EVOATTN_BFLOAT16, EVOATTN_FLOAT32}) {
    for (const Shape& s : shapes) cases.emplace_back(dtype, s);
  }
  auto desc = [](const std::vector<int64_t>& sizes, evoattn_dtype_t dtype) {
    void* never_read = reinterpret_cast<void*>(uintptr_t{1} << 36);  // 256-byte aligned
    return util::make_view(never_read, dtype, sizes, util::contiguous_strides(sizes), kGpu);
  };
  for (const auto& [dtype, s] : cases) {
    const evoattn_tensor_t q = desc({s.B, s.N, s.L, s.H, s.D}, dtype);
    const evoattn_tensor_t mb = desc({s.B, s.N, 1, 1, s.L}, dtype);
    const evoattn_tensor_t pb = desc({s.B, 1, s.H, s.L, s.L}, dtype);
    const double dq_floats = static_cast<double>(s.B * s.N * s.L * s.H * std::max<int64_t>(s.D, 4));
    for (bool mask_grad : {false, true}) {
      if (mask_grad && !s.mask) continue;
      const evoattn_tensor_t* dmb = mask_grad ? &mb : nullptr;
      const evoattn_tensor_t* dpb = s.pair ? &pb : nullptr;
      size_t bytes = 0;
      ASSERT_EQ(evoattn_backward_workspace_size(&q, &q, &q, s.mask ? &mb : nullptr,
                                                s.pair ? &pb : nullptr, nullptr, dmb, dpb, nullptr,
                                                &bytes),
                EVOATTN_SUCCESS)
          << s.name << ": " << evoattn_last_error();
      const double bound = 4.0 * (dq_floats + (mask_grad ? s.B * s.N * s.L : 0) +
                                  (s.pair ? s.B * s.H * s.L * s.L : 0));
      EXPECT_LE(static_cast<double>(bytes), bound)
          << s.name << " " << util::dtype_name(dtype) << (mask_grad ? " with d_mask_bias" : "")
          << ": workspace " << bytes
          << " bytes, contract bound " << bound;
      evoattn_tensor_t q0 = q, mb0 = mb, pb0 = pb;
      q0.data = mb0.data = pb0.data = nullptr;
      size_t bytes_without_data = 0;
      ASSERT_EQ(evoattn_backward_workspace_size(&q0, &q0, &q0, s.mask ? &mb0 : nullptr,
                                                s.pair ? &pb0 : nullptr, nullptr,
                                                mask_grad ? &mb0 : nullptr, s.pair ? &pb0 : nullptr,
                                                nullptr, &bytes_without_data),
                EVOATTN_SUCCESS)
          << s.name << ": " << evoattn_last_error();
      EXPECT_EQ(bytes_without_data, bytes) << s.name << " " << util::dtype_name(dtype)
                                           << (mask_grad ? " with d_mask_bias" : "")
                                           << ": size query without data";
    }
  }
}

#else

TEST(CudaGraph, CapturedForwardBackwardReplaysToTheSameBytes) { GTEST_SKIP() << kNoCudaMessage; }
TEST(CudaGraph, CapturedFusedBackwardReplaysToTheSameBytes) { GTEST_SKIP() << kNoCudaMessage; }
TEST(LargeIndex, PairBiasBeyond2To31Elements) { GTEST_SKIP() << kNoCudaMessage; }
TEST(Workspace, WithinSpecBoundOnSuiteShapes) { GTEST_SKIP() << kNoCudaMessage; }

#endif

// Sets EVOATTN_MAX_SMEM_PER_BLOCK for a scope (src/cuda/smem_budget.h): the library then plans
// and checks shared memory as on a GPU allowing that much per block.
class SmemCap : public ScopedEnv {
 public:
  explicit SmemCap(size_t bytes) : ScopedEnv("EVOATTN_MAX_SMEM_PER_BLOCK", std::to_string(bytes)) {}
};

constexpr size_t kSm86Smem = 99 * 1024, kA100Smem = 163 * 1024;

// The variants of GPUs with less shared memory per block than the H100, run on this one: the
// forward with one group per block at head dim 64 under 99 KB (RTX 30/40, L40; with the
// backward, whose dK/dV pass computes dQ in 97.8 KB) and at 128 under 163 KB (A100), two groups at
// 64 under 163 KB (A100) — each in its fast and (D = 60: no 16-byte rows) generic variant —
// against the reference; at 128 under 99 KB the error that names the shared memory. And the
// fused backward's running dQ in the workspace (LaunchPlan::dq_in_smem off: all of Lq does not
// fit two blocks per SM there), with more (b, n, h) than slots under 99 KB (blocks reuse
// finished blocks' slots), with and without tile-bias code. And the head-dim-64 dK/dV in key
// pairs where its O stages do not fit (170 KB at Lq = 66): Delta from the row statistics; and
// under 163 KB (A100) in key pairs with one query tile, computing Delta. One gtest case a run,
// so that shards share their float64 references (minutes as one case).
struct SmallGpuRun {
  size_t cap;  // EVOATTN_MAX_SMEM_PER_BLOCK
  Case c;
};

// Seeds 900, 901, ... in the order below; the head-dim-128 error case of each dtype takes the
// seed after its runs (small_gpu_unsupported_seed).
constexpr uint64_t kSmallGpuSeed = 900;
constexpr evoattn_dtype_t kSmallGpuDtypes[] = {EVOATTN_BFLOAT16, EVOATTN_FLOAT16};

std::vector<SmallGpuRun> small_gpu_runs() {
  std::vector<SmallGpuRun> out;
  uint64_t seed = kSmallGpuSeed;
  for (evoattn_dtype_t dt : kSmallGpuDtypes) {
    const SmallGpuRun runs[] = {
        {kSm86Smem, shape(1, 130, 2, 70, 136, 64, dt).biases("bn11k", "b1hqk").grads(true, true)},
        {kSm86Smem, shape(2, 2, 1, 65, 200, 64, dt).biases("bn11k", "b1hqk")},
        {kSm86Smem, shape(1, 3, 2, 70, 75, 60, dt).biases("bn11k", "b1hqk")},
        {kA100Smem, shape(1, 130, 2, 70, 136, 64, dt).biases("bn11k", "b1hqk").grads(true, true)},
        {kA100Smem, shape(2, 2, 1, 65, 200, 64, dt).biases("bn11k", "b1hqk")},
        {kA100Smem, shape(1, 5, 2, 70, 75, 60, dt).biases("bn11k", "b1hqk")},
        {kA100Smem, shape(2, 2, 2, 17, 136, 128, dt).biases("bn11k", "b1hqk")},
        {kA100Smem, shape(1, 40, 2, 70, 136, 128, dt).biases("bn11k", "b1hqk")},
        {kA100Smem, shape(1, 64, 4, 130, 136, 32, dt).biases("bn11k", "b1hqk").grads(true, true)},
        {kSm86Smem, shape(1, 256, 2, 70, 72, 16, dt).biases("bn11k", "b1hqk").grads(false, true)},
        {kSm86Smem, shape(1, 256, 2, 70, 72, 24, dt)},
        {170 * 1024, shape(1, 32, 8, 66, 128, 64, dt).biases("bn11k", "b1hqk").grads(true, true)},
        {kA100Smem, shape(1, 32, 8, 40, 256, 64, dt).biases("bn11k", "b1hqk").grads(true, true)},
    };
    for (SmallGpuRun r : runs) {
      r.c.backend = Backend::kCuda;
      r.c.seed = seed++;
      out.push_back(r);
    }
    ++seed;  // SmallGpuUnsupported's case of this dtype
  }
  return out;
}

// The seed of SmallGpuUnsupported's case of the dtype with index `d` in kSmallGpuDtypes: the one
// small_gpu_runs skips after that dtype's runs.
uint64_t small_gpu_unsupported_seed(size_t d) {
  const size_t runs = small_gpu_runs().size() / std::size(kSmallGpuDtypes);
  return kSmallGpuSeed + d * (runs + 1) + runs;
}

std::string small_gpu_run_name(const SmallGpuRun& r) {
  return r.c.name() + "_under_" + std::to_string(r.cap / 1024) + "KB";
}
void PrintTo(const SmallGpuRun& r, std::ostream* os) { *os << small_gpu_run_name(r); }

class SmallGpuVariants : public ::testing::TestWithParam<SmallGpuRun> {};

TEST_P(SmallGpuVariants, MatchReference) {
  if (backend_missing(Backend::kCuda)) GTEST_SKIP() << kNoCudaMessage;
  const SmallGpuRun& r = GetParam();
  SmemCap cap(r.cap);
  expect_forward_and_backward_match(r.c);
}

INSTANTIATE_TEST_SUITE_P(Caps, SmallGpuVariants, ::testing::ValuesIn(small_gpu_runs()),
                         [](const ::testing::TestParamInfo<SmallGpuRun>& info) {
                           return small_gpu_run_name(info.param);
                         });

TEST(SmallGpuUnsupported, HeadDim128Under99KBNamesSharedMemory) {
  if (backend_missing(Backend::kCuda)) GTEST_SKIP() << kNoCudaMessage;
  for (size_t d = 0; d < std::size(kSmallGpuDtypes); ++d) {
    Case big = shape(1, 2, 2, 17, 17, 128, kSmallGpuDtypes[d]);
    big.backend = Backend::kCuda;
    big.seed = small_gpu_unsupported_seed(d);
    SmemCap cap(kSm86Smem);
    const Inputs in = make_inputs(big);
    const evoattn_options_t options = case_options(big);
    const ForwardRun run = run_forward(big, in, &options);
    EXPECT_EQ(run.status, EVOATTN_ERROR_UNSUPPORTED) << run.error;
    EXPECT_NE(run.error.find("shared memory"), std::string::npos) << run.error;
  }
}

#ifdef EVOATTN_WITH_CUDA
// LaunchPlan::offsets32: the fast forward kernels index in int32, so the planner grants it only
// while every offset the forward forms — a tile (64 rows) past each end of Lq and Lk included,
// strides counted by magnitude — stays below 2^30. Host-only: runs without a GPU.
TEST(LaunchPlan, Offsets32OnlyBelow2To30) {
  alignas(16) static char data[16];
  auto plan_for = [&](int64_t N, int64_t n_sign, bool pair_bias_rows_apart) {
    FwdParams p{};
    p.B = 1, p.N = N, p.H = 4, p.Lq = p.Lk = 256, p.D = 32, p.dtype = DType::kBF16;
    p.q = p.k = p.v = data;
    p.o = data;
    const SeqStrides seq{N * 256 * 4 * 32, n_sign * 256 * 4 * 32, 4 * 32, 32, 1};
    p.q_stride = p.k_stride = p.v_stride = p.o_stride = seq;
    p.lse_stride_q = 1, p.lse_stride_h = 256, p.lse_stride_n = 4 * 256, p.lse_stride_b = N * 4 * 256;
    p.bias[1] = BiasParams{data, DType::kBF16, {0, 0, 256 * 256, 256, 1}};
    // Pair-bias rows 2^22 elements apart: (256 + 64) rows span more than 2^30.
    if (pair_bias_rows_apart) p.bias[1].stride = {0, 0, 0, int64_t{1} << 22, 1};
    return cuda::make_launch_plan(p, cuda::kTile, cuda::kTile);
  };
  // Q's largest offset: N 2^15 elements (N = 2^14: 2^29 plus a tile; N = 2^15: past 2^30).
  EXPECT_TRUE(plan_for(256, 1, false).offsets32);
  EXPECT_TRUE(plan_for(int64_t{1} << 14, 1, false).offsets32);
  EXPECT_TRUE(plan_for(int64_t{1} << 14, -1, false).offsets32);  // a reversed n stride
  EXPECT_FALSE(plan_for(int64_t{1} << 15, 1, false).offsets32);
  EXPECT_FALSE(plan_for(int64_t{1} << 15, -1, false).offsets32);
  EXPECT_FALSE(plan_for(256, 1, true).offsets32);
  // Without offsets32 the forward takes the generic kernels (which index in int64).
  EXPECT_TRUE(cuda::fwd_fast_path(plan_for(256, 1, false)));
  EXPECT_FALSE(cuda::fwd_fast_path(plan_for(256, 1, true)));
}

// The backward's fast kernels index Q, dO, K and V in int32 too (the pair-bias gradient's walk
// over n, the dK/dV kernel's tile copies): a backward plan also counts dO's offsets, and
// without offsets32 the generic kernels run.
TEST(LaunchPlan, BackwardOffsets32CountsDo) {
  alignas(16) static char data[16];
  auto plan_for = [&](int64_t do_n_stride) {
    BwdParams p{};
    p.B = 1, p.N = 256, p.H = 4, p.Lq = p.Lk = 256, p.D = 32, p.dtype = DType::kBF16;
    p.q = p.k = p.v = p.d_o = data;
    p.o = data;
    const SeqStrides seq{256 * 256 * 4 * 32, 256 * 4 * 32, 4 * 32, 32, 1};
    p.q_stride = p.k_stride = p.v_stride = p.o_stride = p.do_stride = seq;
    p.do_stride.n = do_n_stride;
    p.lse_stride_q = 1, p.lse_stride_h = 256, p.lse_stride_n = 4 * 256, p.lse_stride_b = 256 * 4 * 256;
    p.bias[1] = BiasParams{data, DType::kBF16, {0, 0, 256 * 256, 256, 1}};
    return cuda::make_launch_plan(p, cuda::kTile, cuda::kTile);
  };
  EXPECT_TRUE(plan_for(256 * 4 * 32).offsets32);
  EXPECT_TRUE(cuda::bwd_fast_path(plan_for(256 * 4 * 32)));
  // dO's rows 2^23 elements apart over 256 n: past 2^30.
  EXPECT_FALSE(plan_for(int64_t{1} << 23).offsets32);
  EXPECT_FALSE(cuda::bwd_fast_path(plan_for(int64_t{1} << 23)));
}
#else
TEST(LaunchPlan, Offsets32OnlyBelow2To30) { GTEST_SKIP() << "needs the CUDA backend's planner"; }
TEST(LaunchPlan, BackwardOffsets32CountsDo) { GTEST_SKIP() << "needs the CUDA backend's planner"; }
#endif

// The forward's work-item decode and the row statistics divide by multiplies (cuda::fast_div and
// fast_divmod, the same functions the kernels call): exact for every numerator below 2^31,
// here every divisor to 300 and the edges of the range, against integer division. Host-only:
// runs without a GPU.
TEST(FastDiv, MatchesIntegerDivisionBelow2To31) {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 300; ++d) divisors.push_back(d);
  for (uint32_t d : {1000u, 4095u, 4096u, 4097u, 65535u, 65536u, 1000003u, (1u << 30) - 1, 1u << 30,
                     (1u << 30) + 1, (1u << 31) - 1}) {
    divisors.push_back(d);
  }
  uint64_t state = 12345;
  auto next = [&] {  // splitmix64
    state += 0x9e3779b97f4a7c15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<uint32_t>((z ^ (z >> 31)) & 0x7fffffffu);
  };
  for (uint32_t d : divisors) {
    const cuda::FastDiv fd = cuda::make_fast_div(d);
    std::vector<uint32_t> ns{0u, 1u, d - 1, d, d + 1, 2 * d - 1, (1u << 31) - 1, (1u << 31) - 2};
    for (uint32_t m : {1u, 7u, 1000u}) {
      if (static_cast<uint64_t>(d) * m + d < (1u << 31)) {
        ns.push_back(d * m + d - 1);
        ns.push_back(d * m + d);
      }
    }
    for (int i = 0; i < 2000; ++i) ns.push_back(next());
    for (uint32_t n : ns) {
      if (n >= (1u << 31)) continue;
      ASSERT_EQ(cuda::fast_div(n, fd), n / d) << "n = " << n << ", d = " << d;
      uint32_t rem = 0;
      ASSERT_EQ(cuda::fast_divmod(n, fd, rem), n / d) << "n = " << n << ", d = " << d;
      ASSERT_EQ(rem, n % d) << "n = " << n << ", d = " << d;
    }
  }
}

}  // namespace
}  // namespace evoattn::test
