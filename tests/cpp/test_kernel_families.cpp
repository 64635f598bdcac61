// The kernel families on one GPU: EVOATTN_KERNEL_FAMILY=hopper takes the Hopper forward and
// backward (src/cuda/hopper/) on compute capability 9.x, =portable the mma.sync kernels, unset
// (auto) the one that measured faster for the call. The whole 16-bit grid also runs under the Hopper switch
// (ctest's "hopper." tests, tests/cpp/CMakeLists.txt); these tests show the switch reaches a
// different kernel, which agrees with the portable one, and what auto takes.
// Skipped without a GPU of compute capability 9.x or without the Hopper family in the build.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention_case.h"
#include "evoattn/evoattn.h"
#include "scoped_env.h"
#include "tensor_util.h"

#ifdef EVOATTN_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/hopper/bwd_plan.h"
#include "cuda/hopper/fwd_plan.h"
#include "cuda/variants.h"
#endif

namespace evoattn::test {
namespace {

// The Hopper backward's running dQ in the workspace's pool (LaunchPlan::hopper_dq_pool) instead of
// shared memory, with 256 (b, n, h) or more (the workspace then holds the pool). In every case the
// Hopper kernel differs from the portable backward (where the pool cannot run and shared memory
// cannot hold the dQ, the switch would leave the call to the portable one) and agrees with it. With
// EVOATTN_EXP_BWD_DQ_GLOBAL=1 asking for the pool where shared memory also fits, dQ, dK and dV are
// bit for bit those of the shared-memory dQ, even where the pool brings three consumers in place
// of two: dQ sums its 16-key wgmma k-steps in key order whatever the key blocks, the running dQ is
// float32 in either place, and dK and dV sum over the query tiles in order.
struct DqPoolCase {
  int64_t N, Lq, Lk, D;
  bool asked;  // EVOATTN_EXP_BWD_DQ_GLOBAL=1, compared bit for bit with =0 (the shared-memory dQ)
};
constexpr DqPoolCase kDqPoolCases[] = {
    {64, 512, 512, 32, true},     // two consumers either way
    {64, 768, 768, 32, true},     // tri768's shape: three consumers on the pool, two in shared memory
    {80, 200, 384, 24, true},     // three consumers either way; 4 query tiles, a partial one, D < bucket
    {64, 896, 896, 32, false},    // shared memory does not fit: the pool by default, two consumers
    {64, 1000, 960, 32, false},   // the pool by default, three consumers, 16 query tiles and 5 key
                                  // blocks: 80 steps an item, so the turns shift across items
};

std::string dq_pool_case_name(const DqPoolCase& c) {
  return "N" + std::to_string(c.N) + "_Lq" + std::to_string(c.Lq) + "_Lk" + std::to_string(c.Lk) + "_D" +
         std::to_string(c.D) + (c.asked ? "_asked" : "_default");
}
void PrintTo(const DqPoolCase& c, std::ostream* os) { *os << dq_pool_case_name(c); }

// One test a case (KernelFamily/HopperBackwardRunningDq.InTheWorkspace/N64_Lq512_Lk512_D32_asked,
// ...), so that a sanitizer can run the small one alone.
class HopperBackwardRunningDq : public ::testing::TestWithParam<DqPoolCase> {};
INSTANTIATE_TEST_SUITE_P(KernelFamily, HopperBackwardRunningDq, ::testing::ValuesIn(kDqPoolCases),
                         [](const ::testing::TestParamInfo<DqPoolCase>& info) { return dq_pool_case_name(info.param); });

// The cases of the pair-bias family test (HopperPairBiasGradient.AgreesWithThePortableOneOverItsSplits),
// B N L H D (Lq = Lk = L), with mask and pair bias.
struct PairBiasCase {
  int64_t B, N, L, H, D;
  bool extreme_rows;
};
constexpr PairBiasCase kPairBiasCases[] = {
    {1, 3, 264, 32, 32, false}, {2, 2, 264, 40, 16, false},  {1, 1000, 136, 2, 24, false},
    {1, 2, 520, 16, 8, false},  {1, 4, 264, 32, 32, true},   {4, 64, 256, 4, 16, false},
    {1, 3, 264, 32, 64, false}, {1, 128, 256, 8, 48, false}, {1, 4, 264, 32, 64, true}};

std::string pair_bias_case_name(const PairBiasCase& c) {
  return "B" + std::to_string(c.B) + "_N" + std::to_string(c.N) + "_L" + std::to_string(c.L) + "_H" +
         std::to_string(c.H) + "_D" + std::to_string(c.D) + (c.extreme_rows ? "_extreme_rows" : "");
}
void PrintTo(const PairBiasCase& c, std::ostream* os) { *os << pair_bias_case_name(c); }

// One test a case (KernelFamily/HopperPairBiasGradient.AgreesWithThePortableOneOverItsSplits/
// B1_N3_L264_H32_D32, ...), so that a sanitizer's shards share them.
class HopperPairBiasGradient : public ::testing::TestWithParam<PairBiasCase> {};
INSTANTIATE_TEST_SUITE_P(KernelFamily, HopperPairBiasGradient, ::testing::ValuesIn(kPairBiasCases),
                         [](const ::testing::TestParamInfo<PairBiasCase>& info) { return pair_bias_case_name(info.param); });

#if defined(EVOATTN_WITH_CUDA) && defined(EVOATTN_WITH_HOPPER)

using util::Tensor;

bool hopper_gpu() {
  int count = 0, major = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess && major == 9;
}

struct Shape {
  int64_t B, N, Lq, Lk, H, D;
  bool mask_bias, pair_bias;
  bool pair_bias_per_n = false;  // the pair bias [B, N, H, Lq, Lk]: it varies along n
};

// A bfloat16 tensor on the GPU, uniform in [lo, hi).
Tensor random_bf16(std::mt19937_64& rng, const std::vector<int64_t>& sizes, double lo, double hi) {
  Tensor t = Tensor::empty(sizes, EVOATTN_BFLOAT16);
  util::fill_uniform(t.view, rng, lo, hi);
  return t.to(EVOATTN_DEVICE_CUDA);
}

// O and the LSE of one forward under `family`, outputs poisoned first.
std::vector<std::vector<double>> forward(const std::string& family, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor* mb, const Tensor* pb, Tensor& o,
                                         Tensor& lse) {
  const ScopedEnv env("EVOATTN_KERNEL_FAMILY", family);
  EXPECT_EQ(cudaMemset(o.buffer.data(), 0xff, o.buffer.bytes()), cudaSuccess);  // NaN poison
  EXPECT_EQ(cudaMemset(lse.buffer.data(), 0xff, lse.buffer.bytes()), cudaSuccess);
  EXPECT_EQ(evoattn_forward(q.ptr(), k.ptr(), v.ptr(), mb ? mb->ptr() : nullptr, pb ? pb->ptr() : nullptr,
                            nullptr, o.ptr(), lse.ptr(), nullptr, nullptr),
            EVOATTN_SUCCESS)
      << evoattn_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {util::to_doubles(o.to(EVOATTN_DEVICE_CPU).view), util::to_doubles(lse.to(EVOATTN_DEVICE_CPU).view)};
}

// Random bfloat16 inputs of a [B, N, L, H, D] attention (Lk keys: L unless given) with a mask
// bias and a pair bias, and the O and LSE of its last forward.
struct Inputs {
  Tensor q, k, v, mb, pb, o, lse;
  Inputs(std::mt19937_64& rng, int64_t B, int64_t N, int64_t L, int64_t H, int64_t D, int64_t Lk = 0)
      : q(random_bf16(rng, {B, N, L, H, D}, -2, 2)),
        k(random_bf16(rng, {B, N, Lk > 0 ? Lk : L, H, D}, -2, 2)),
        v(random_bf16(rng, {B, N, Lk > 0 ? Lk : L, H, D}, -1, 1)),
        mb(random_bf16(rng, {B, N, 1, 1, Lk > 0 ? Lk : L}, -3, 0)),
        pb(random_bf16(rng, {B, 1, H, L, Lk > 0 ? Lk : L}, -2, 2)),
        o(Tensor::empty({B, N, L, H, D}, EVOATTN_BFLOAT16, EVOATTN_DEVICE_CUDA)),
        lse(Tensor::empty({B, N, H, L}, EVOATTN_FLOAT32, EVOATTN_DEVICE_CUDA)) {}
  std::vector<std::vector<double>> forward(const std::string& family) {
    return evoattn::test::forward(family, q, k, v, &mb, &pb, o, lse);
  }
};

TEST(KernelFamily, HopperSwitchTakesAnotherForwardThatAgreesWithThePortableOne) {
  if (!hopper_gpu()) GTEST_SKIP() << "needs a GPU of compute capability 9.x";
  const Shape shapes[] = {
      {1, 4, 256, 256, 4, 32, true, true},  {2, 3, 130, 136, 2, 64, true, true},
      {1, 2, 70, 200, 2, 16, true, false},  {1, 1, 100, 72, 4, 24, false, true},
      {1, 2, 64, 64, 2, 128, true, true},   {1, 5, 257, 136, 1, 8, true, true},
      // Four consumers (head-dim bucket 16): whole blocks, and a last block whose fourth
      // consumer has no rows.
      {1, 3, 256, 136, 2, 16, true, true},  {2, 2, 700, 72, 1, 8, true, true},
      {1, 2, 700, 72, 2, 24, true, true},   // bucket 32: four consumers, one P register set
      // Four consumers on two n an item (fwd_two_n_for: Lq in 257-384, 513-640): a last item whose
      // second query tile has no rows; whole items; N = 15, whose last item's second n is past N
      // (bucket 32).
      {1, 2, 300, 136, 2, 16, true, true},  {1, 16, 384, 72, 1, 8, true, true},
      {1, 15, 576, 72, 1, 24, true, true},
      // A pair bias that varies along n: two n cannot share its boxes, so one n an item there.
      {1, 2, 384, 136, 2, 32, true, true, true},
  };
  // Every shape is one the Hopper forward takes (hopper::fwd_usable): 16-byte rows everywhere,
  // so Lk is a multiple of 8 for the pair bias's rows.
  uint64_t seed = 71;
  for (const Shape& s : shapes) {
    SCOPED_TRACE("B" + std::to_string(s.B) + " N" + std::to_string(s.N) + " Lq" + std::to_string(s.Lq) + " Lk" +
                 std::to_string(s.Lk) + " H" + std::to_string(s.H) + " D" + std::to_string(s.D));
    std::mt19937_64 rng(seed++);
    const Tensor q = random_bf16(rng, {s.B, s.N, s.Lq, s.H, s.D}, -2, 2);
    const Tensor k = random_bf16(rng, {s.B, s.N, s.Lk, s.H, s.D}, -2, 2);
    const Tensor v = random_bf16(rng, {s.B, s.N, s.Lk, s.H, s.D}, -1, 1);
    const Tensor mb = random_bf16(rng, {s.B, s.N, 1, 1, s.Lk}, -3, 0);
    const Tensor pb = random_bf16(rng, {s.B, s.pair_bias_per_n ? s.N : 1, s.H, s.Lq, s.Lk}, -2, 2);
    Tensor o = Tensor::empty({s.B, s.N, s.Lq, s.H, s.D}, EVOATTN_BFLOAT16, EVOATTN_DEVICE_CUDA);
    Tensor lse = Tensor::empty({s.B, s.N, s.H, s.Lq}, EVOATTN_FLOAT32, EVOATTN_DEVICE_CUDA);
    const Tensor* mbp = s.mask_bias ? &mb : nullptr;
    const Tensor* pbp = s.pair_bias ? &pb : nullptr;
    const auto hopper = forward("hopper", q, k, v, mbp, pbp, o, lse);
    const auto portable = forward("portable", q, k, v, mbp, pbp, o, lse);
    // Different kernels sum in different orders: some LSE differs in its last bits.
    EXPECT_NE(hopper[1], portable[1]) << "the switch did not change the kernel";
    double worst_o = 0.0, worst_lse = 0.0;
    for (size_t i = 0; i < hopper[0].size(); ++i) worst_o = std::max(worst_o, std::fabs(hopper[0][i] - portable[0][i]));
    for (size_t i = 0; i < hopper[1].size(); ++i) {
      worst_lse = std::max(worst_lse, std::fabs(hopper[1][i] - portable[1][i]));
    }
    // |O| <= 1 (V in [-1, 1]): two bfloat16 roundings apart at most, and P's own rounding.
    EXPECT_LE(worst_o, 2e-2);
    EXPECT_LE(worst_lse, 1e-3);
  }
}

// The automatic choice (EVOATTN_KERNEL_FAMILY unset) takes the Hopper forward where
// fwd_auto_prefers_hopper says it is faster, bit for bit the forced Hopper one, and the portable
// forward elsewhere: N = 160 (640 (b, n, h) at least, on two, three and four consumers and head
// dims 32, 64, 128, 16) has items enough on any GPU; N = 24 at head dim 32 (96 items, one query
// block of four consumers a (b, n, h)) and N = 8 at head dim 64 (64 items, two of two) fall on
// either side of the rule on this GPU's SM count (Hopper and portable on 132 SMs).
TEST(KernelFamily, AutoTakesTheHopperForwardWhereItMeasuredFaster) {
  if (!hopper_gpu()) GTEST_SKIP() << "needs a GPU of compute capability 9.x";
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  std::mt19937_64 rng(97);
  struct Shape {
    int64_t N, L, D;
    int64_t items;  // the Hopper forward's work items where few; 0: many
  };
  for (const Shape& shape : {Shape{160, 384, 32, 0}, Shape{160, 256, 64, 0}, Shape{160, 128, 128, 0},
                             Shape{160, 256, 16, 0}, Shape{24, 256, 32, 96}, Shape{8, 256, 64, 64}}) {
    SCOPED_TRACE("N" + std::to_string(shape.N) + " L" + std::to_string(shape.L) + " D" + std::to_string(shape.D));
    Inputs in(rng, 1, shape.N, shape.L, 4, shape.D);
    const auto automatic = in.forward("auto");
    const auto hopper = in.forward("hopper");
    const auto portable = in.forward("portable");
    ASSERT_NE(hopper[1], portable[1]) << "the families' LSEs should differ in some last bit";
    const bool takes_hopper = shape.items == 0 || cuda::hopper::fwd_auto_prefers_hopper(shape.items, sms);
    EXPECT_EQ(automatic, takes_hopper ? hopper : portable);
  }
}

// dQ, dK, dV and d(pair_bias) of one backward under `family` on `in` and its forward's O and
// LSE, outputs poisoned first.
std::vector<std::vector<double>> backward(const std::string& family, const Tensor& d_o, const Inputs& in) {
  const ScopedEnv env("EVOATTN_KERNEL_FAMILY", family);
  const Tensor &q = in.q, &k = in.k, &v = in.v, &o = in.o, &lse = in.lse, &mb = in.mb, &pb = in.pb;
  Tensor dq = Tensor::empty(q.sizes(), EVOATTN_BFLOAT16, EVOATTN_DEVICE_CUDA);
  Tensor dk = Tensor::empty(k.sizes(), EVOATTN_BFLOAT16, EVOATTN_DEVICE_CUDA);
  Tensor dv = Tensor::empty(v.sizes(), EVOATTN_BFLOAT16, EVOATTN_DEVICE_CUDA);
  Tensor dpb = Tensor::empty(pb.sizes(), EVOATTN_BFLOAT16, EVOATTN_DEVICE_CUDA);
  for (Tensor* t : {&dq, &dk, &dv, &dpb}) {
    EXPECT_EQ(cudaMemset(t->buffer.data(), 0xff, t->buffer.bytes()), cudaSuccess);  // NaN poison
  }
  size_t bytes = 0;
  EXPECT_EQ(evoattn_backward_workspace_size(q.ptr(), k.ptr(), v.ptr(), mb.ptr(), pb.ptr(), nullptr, nullptr,
                                            dpb.ptr(), nullptr, &bytes),
            EVOATTN_SUCCESS)
      << evoattn_last_error();
  util::Buffer workspace(bytes, EVOATTN_DEVICE_CUDA);
  EXPECT_EQ(evoattn_backward(d_o.ptr(), q.ptr(), k.ptr(), v.ptr(), o.ptr(), lse.ptr(), mb.ptr(), pb.ptr(), nullptr,
                             dq.ptr(), dk.ptr(), dv.ptr(), nullptr, dpb.ptr(), workspace.data(), bytes, nullptr,
                             nullptr),
            EVOATTN_SUCCESS)
      << evoattn_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<std::vector<double>> out;
  for (Tensor* t : {&dq, &dk, &dv, &dpb}) out.push_back(util::to_doubles(t->to(EVOATTN_DEVICE_CPU).view));
  return out;
}

// The largest gap of two bfloat16 results in rounding steps of the larger value of each pair
// (2^-7 of its power of two), where gaps below 1e-5 of the largest value count as none.
double bf16_roundings_apart(const std::vector<double>& a, const std::vector<double>& b) {
  double largest = 0.0, worst = 0.0;
  for (size_t e = 0; e < a.size(); ++e) largest = std::max({largest, std::fabs(a[e]), std::fabs(b[e])});
  for (size_t e = 0; e < a.size(); ++e) {
    const double gap = std::fabs(a[e] - b[e]);
    if (std::isnan(gap)) return gap;  // fails the caller's <=
    if (gap <= 1e-5 * largest) continue;
    const double step = std::ldexp(1.0, std::ilogb(std::max(std::fabs(a[e]), std::fabs(b[e]))) - 7);
    worst = std::max(worst, gap / step);
  }
  return worst;
}

// Largest |a - b| over the largest |b|, at least 1.
double relative_gap(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0, largest = 0.0;
  for (size_t e = 0; e < a.size(); ++e) {
    worst = std::max(worst, std::fabs(a[e] - b[e]));
    largest = std::max(largest, std::fabs(b[e]));
  }
  return worst / std::max(1.0, largest);
}

// The Hopper backward (head-dim buckets 16, 32 and 64, D >= 8) against the portable one on the
// same inputs, and what the automatic choice takes: the Hopper dK/dV/dQ kernel where
// bwd_auto_prefers_hopper says it is faster (640 (b, n, h) on 132 SMs; Lq = 384, or 256 at bucket
// 64), bit for bit the forced one, and one of the two pair-bias gradients; the portable kernels at
// head dims 4 (Delta from the portable kernels' own P and dP) and 128, which the switch leaves to
// them.
TEST(KernelFamily, HopperBackwardAgreesWithThePortableOneAndAutoTakesItWhereFaster) {
  if (!hopper_gpu()) GTEST_SKIP() << "needs a GPU of compute capability 9.x";
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  std::mt19937_64 rng(131);
  for (const int64_t D : {32, 24, 16, 8, 4, 64, 48, 128}) {
    SCOPED_TRACE("D" + std::to_string(D));
    // Bucket 64's running dQ fits Lq up to 320.
    const int64_t B = 1, N = 160, L = D > 32 ? 256 : 384, H = 4;
    Inputs in(rng, B, N, L, H, D);
    const Tensor d_o = random_bf16(rng, {B, N, L, H, D}, -1, 1);
    in.forward("portable");
    const auto automatic = backward("auto", d_o, in);
    const auto hopper = backward("hopper", d_o, in);
    const auto portable = backward("portable", d_o, in);
    if (D < 8 || D > 64) {
      EXPECT_EQ(automatic, portable);
      EXPECT_EQ(hopper, portable) << "no Hopper backward at this head dim: the switch keeps the portable one";
      continue;
    }
    // At bucket 64 the Hopper kernel sums as the portable key-pair one does (128 keys a block,
    // 64-query tiles, the running dQ in key order): dQ comes out bit for bit the same, so the
    // test below asks the dispatch itself.
    if (D <= 32) {
      EXPECT_NE(hopper[0], portable[0]) << "the switch did not change the backward";
    }
    const char* names[] = {"dq", "dk", "dv", "d(pair_bias)"};
    for (int i = 0; i < 4; ++i) {
      // Both round P and dS to bfloat16 before their products (the pair-bias gradients keep
      // float32), in different orders of sums.
      EXPECT_LE(relative_gap(hopper[i], portable[i]), 2e-2) << names[i];
    }
    const int bucket = cuda::head_dim_bucket(static_cast<int>(D));
    const bool hopper_dkdv = cuda::hopper::bwd_auto_prefers_hopper(bucket, B * N * H, L, sms);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(automatic[i], hopper_dkdv ? hopper[i] : portable[i]) << names[i];
    // The switch takes the Hopper pair-bias gradient at D = 32 (the pieces of 85 workers fit
    // the workspace; at 24 and below the running dQ leaves too little room); auto, at 36 tiles
    // (pair_bias_auto_prefers_hopper), one of the two, bit for bit.
    EXPECT_TRUE(automatic[3] == hopper[3] || automatic[3] == portable[3]) << "auto's pair-bias gradient";
  }
}

// The descriptors of a contiguous bfloat16 call, B N L H D (Lq = Lk = L), with a pair bias
// [B, 1, H, L, L] (score strides b, n, h, q, k; 0 where the size is 1), for the planners: their
// pointers are one aligned dummy.
BwdParams pair_biased_bf16_params(int64_t B, int64_t N, int64_t L, int64_t H, int64_t D) {
  alignas(16) static char data[16];
  BwdParams p{};
  p.B = B, p.N = N, p.H = H, p.Lq = p.Lk = L, p.D = D, p.dtype = DType::kBF16;
  p.q = p.k = p.v = p.d_o = p.o = data;
  const SeqStrides seq{N * L * H * D, L * H * D, H * D, D, 1};
  p.q_stride = p.k_stride = p.v_stride = p.o_stride = p.do_stride = seq;
  p.lse_stride_q = 1, p.lse_stride_h = L, p.lse_stride_n = H * L, p.lse_stride_b = N * H * L;
  p.bias[1] = BiasParams{data, DType::kBF16, {B > 1 ? H * L * L : 0, 0, H > 1 ? L * L : 0, L, 1}};
  return p;
}

// The automatic backward where (b, n, h) are few (bwd_auto_prefers_hopper), on this GPU's SM
// count: the planner takes the Hopper dK/dV/dQ kernel at 32 (b, n, h) with Lq 256 and 88 with Lq
// 768, the portable kernels at 16 with Lq 256 and 44 with Lq 768 (below Lq / 16); and the
// gradients under auto are bit for bit those of the family the rule names. At Lq 256 the two
// families may give the same bits (both sum in 64-key tiles in key order): the outputs must
// differ on one shape at least, so the switch is seen to act.
TEST(KernelFamily, AutoTakesTheHopperBackwardAtFewItemsWhereItMeasuredFaster) {
  if (!hopper_gpu()) GTEST_SKIP() << "needs a GPU of compute capability 9.x";
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  std::mt19937_64 rng(151);
  struct Shape {
    int64_t N, L;
  };
  bool switch_seen = false;
  for (const Shape& shape : {Shape{8, 256}, Shape{4, 256}, Shape{22, 768}, Shape{11, 768}}) {
    SCOPED_TRACE("N" + std::to_string(shape.N) + " L" + std::to_string(shape.L));
    const int64_t H = 4, D = 32;
    const int bucket = cuda::head_dim_bucket(static_cast<int>(D));
    const bool hopper_dkdv = cuda::hopper::bwd_auto_prefers_hopper(bucket, shape.N * H, shape.L, sms);
    {
      const BwdParams p = pair_biased_bf16_params(1, shape.N, shape.L, H, D);
      const ScopedEnv env("EVOATTN_KERNEL_FAMILY", "auto");
      EXPECT_EQ(cuda::hopper::bwd_usable(p, cuda::make_launch_plan(p, cuda::kTile, cuda::kTile)), hopper_dkdv);
    }
    Inputs in(rng, 1, shape.N, shape.L, H, D);
    const Tensor d_o = random_bf16(rng, {1, shape.N, shape.L, H, D}, -1, 1);
    in.forward("portable");
    const auto automatic = backward("auto", d_o, in);
    const auto hopper = backward("hopper", d_o, in);
    const auto portable = backward("portable", d_o, in);
    const char* names[] = {"dq", "dk", "dv", "d(pair_bias)"};
    for (int i = 0; i < 4; ++i) {
      EXPECT_LE(relative_gap(hopper[i], portable[i]), 2e-2) << names[i];
      switch_seen = switch_seen || hopper[i] != portable[i];
    }
    for (int i = 0; i < 3; ++i) EXPECT_EQ(automatic[i], hopper_dkdv ? hopper[i] : portable[i]) << names[i];
  }
  EXPECT_TRUE(switch_seen) << "the switch did not change the backward on any shape";
}

// Which calls the Hopper backward takes at head-dim bucket 64 under the switch, on this GPU: Lq up
// to 320 (one K/V stage and the running dQ in 227 KB), D = 33..64, with a pair bias shared over
// n. (The family test above cannot tell from the outputs.)
TEST(KernelFamily, HopperBackwardTakesHeadDimBucket64WhereItFits) {
  if (!hopper_gpu()) GTEST_SKIP() << "needs a GPU of compute capability 9.x";
  auto usable = [&](int64_t D, int64_t L) {
    const BwdParams p = pair_biased_bf16_params(1, 256, L, 8, D);
    const ScopedEnv env("EVOATTN_KERNEL_FAMILY", "hopper");
    return cuda::hopper::bwd_usable(p, cuda::make_launch_plan(p, cuda::kTile, cuda::kTile));
  };
  EXPECT_TRUE(usable(64, 256));  // tri256d64
  EXPECT_TRUE(usable(48, 256));
  EXPECT_TRUE(usable(64, 320));
  EXPECT_FALSE(usable(64, 384));  // the running dQ does not fit
  EXPECT_TRUE(usable(32, 768));   // tri768's bucket, as before
  EXPECT_FALSE(usable(128, 256));
}

TEST_P(HopperBackwardRunningDq, InTheWorkspace) {
  if (!hopper_gpu()) GTEST_SKIP() << "needs a GPU of compute capability 9.x";
  const DqPoolCase& c = GetParam();
  std::mt19937_64 rng(733 + c.N + c.Lq + c.Lk + c.D);
  const int64_t B = 1, H = 4;
  Inputs in(rng, B, c.N, c.Lq, H, c.D, c.Lk);
  const Tensor d_o = random_bf16(rng, {B, c.N, c.Lq, H, c.D}, -1, 1);
  in.forward("portable");
  std::vector<std::vector<double>> in_smem;  // the shared-memory dQ (=0), where the pool is asked for
  if (c.asked) {
    const ScopedEnv keep("EVOATTN_EXP_BWD_DQ_GLOBAL", "0");
    in_smem = backward("hopper", d_o, in);
  }
  const ScopedEnv ask("EVOATTN_EXP_BWD_DQ_GLOBAL", c.asked ? "1" : "");
  const auto hopper = backward("hopper", d_o, in);
  const auto portable = backward("portable", d_o, in);
  EXPECT_NE(hopper[0], portable[0]) << "the switch did not change the backward";
  const char* names[] = {"dq", "dk", "dv", "d(pair_bias)"};
  for (int i = 0; i < 4; ++i) EXPECT_LE(relative_gap(hopper[i], portable[i]), 2e-2) << names[i];
  if (c.asked) {
    for (int i = 0; i < 3; ++i) EXPECT_EQ(hopper[i], in_smem[i]) << names[i] << ": the pool against shared memory";
  }
}

// Bytes of pieces the Hopper pair-bias kernel may take under the switch, for the pair bias's
// gradient of pair_biased_bf16_params's call with a mask bias [B, N, 1, 1, L] too
// (hopper::pair_bias_partial_bytes: 0 where it cannot run).
size_t hopper_pair_bias_piece_bytes(int64_t B, int64_t N, int64_t L, int64_t H, int64_t D) {
  alignas(16) static char data[16];
  BwdParams p = pair_biased_bf16_params(B, N, L, H, D);
  p.bias[0] = BiasParams{data, DType::kBF16, {B > 1 ? N * L : 0, N > 1 ? L : 0, 0, 0, 1}};
  p.dbias[1] = BiasGradParams{true, data, DType::kBF16, p.bias[1].stride, false, N > 1, false, false, false};
  const ScopedEnv env("EVOATTN_KERNEL_FAMILY", "hopper");
  const cuda::LaunchPlan plan = cuda::make_launch_plan(p, cuda::kTile, cuda::kTile);
  return cuda::hopper::pair_bias_partial_bytes(p, plan, cuda::make_rows_task(p, plan, 1, nullptr));
}

// The Hopper pair-bias gradient over its work split (hopper::PairBiasSplit: 128 x 128 tiles, units
// (tile, n) in contiguous ranges, one a block): tiles one block holds whole, tiles two or three
// blocks share, fewer tiles than blocks split among a whole number of blocks each (split_units:
// 8 tiles among sixteen each, long n; template's 64 tiles, B4 H4 L256, between two each), ragged
// tile edges and head dims 8 to 64 (bucket 64's two-stage ring: ragged L 264 at D 64, stream-K;
// 32 tiles among four blocks each at D 48, where N = 128 leaves the pieces room beside the running
// dQ's 400 slots); and rows whose exponent takes the general form (a row max
// beyond 64 in the log2 domain: query rows 64-79 of every head biased by +120, and every row of
// n = 1 masked by -1e9), beside warps that take the factored one, and rows 16-23 biased by +50
// (the general form where the sums are not over the tile's 2^(T - ref), the factored one where
// they are). Against the portable kernels, and bit for bit the same on a second run; the sums over
// 2^(T - ref) (TileSums) against the kernel's sums without them (EVOATTN_EXP_PAIR_BIAS_OVER_TILE=0)
// within one bfloat16 rounding of each value (the float32 sums differ by about 1e-6 of the
// largest: docs/perf/pair-bias-over-tile-model.py). (Shapes whose workspace holds the
// pieces of 66 workers or more: the kernel runs only there;
// HopperPlan.PairBiasFamilyCasesLeaveTheKernelRoom checks it on the host.)
TEST_P(HopperPairBiasGradient, AgreesWithThePortableOneOverItsSplits) {
  if (!hopper_gpu()) GTEST_SKIP() << "needs a GPU of compute capability 9.x";
  const PairBiasCase& c = GetParam();
  std::mt19937_64 rng(137 + c.B + c.N + c.L + c.H + c.D + c.extreme_rows);
  Inputs in(rng, c.B, c.N, c.L, c.H, c.D);
  if (c.extreme_rows) {
    std::vector<double> pb = util::to_doubles(in.pb.to(EVOATTN_DEVICE_CPU).view);  // [B, 1, H, L, L]
    for (size_t e = 0; e < pb.size(); ++e) {
      const int64_t i = static_cast<int64_t>(e / c.L) % c.L;
      if (i >= 64 && i < 80) pb[e] += 120.0;
      if (i >= 16 && i < 24) pb[e] += 50.0;
    }
    std::vector<double> mb = util::to_doubles(in.mb.to(EVOATTN_DEVICE_CPU).view);  // [B, N, 1, 1, L]
    for (int64_t k = 0; k < c.L; ++k) mb[static_cast<size_t>(c.L + k)] = -1e9;  // b = 0, n = 1
    Tensor pb_host = in.pb.to(EVOATTN_DEVICE_CPU), mb_host = in.mb.to(EVOATTN_DEVICE_CPU);
    util::from_doubles(pb_host.view, pb);
    util::from_doubles(mb_host.view, mb);
    in.pb = pb_host.to(EVOATTN_DEVICE_CUDA);
    in.mb = mb_host.to(EVOATTN_DEVICE_CUDA);
  }
  const Tensor d_o = random_bf16(rng, {c.B, c.N, c.L, c.H, c.D}, -1, 1);
  in.forward("portable");
  const auto hopper = backward("hopper", d_o, in);
  const auto again = backward("hopper", d_o, in);
  const auto portable = backward("portable", d_o, in);
  const auto automatic = backward("auto", d_o, in);
  std::vector<std::vector<double>> not_over_tile;
  {
    const ScopedEnv env("EVOATTN_EXP_PAIR_BIAS_OVER_TILE", "0");
    not_over_tile = backward("hopper", d_o, in);
  }
  EXPECT_NE(hopper[3], portable[3]) << "the switch did not change the pair-bias gradient";
  EXPECT_LE(relative_gap(hopper[3], portable[3]), 2e-2);
  EXPECT_EQ(hopper, again) << "not deterministic";
  EXPECT_LE(bf16_roundings_apart(hopper[3], not_over_tile[3]), 1.0) << "the sums over 2^(T - ref)";
  // Auto: one of the two, bit for bit; the portable one below 32 tiles.
  const int64_t tiles = c.B * c.H * ((c.L + 127) / 128) * ((c.L + 127) / 128);
  if (cuda::hopper::pair_bias_auto_prefers_hopper(tiles)) {
    EXPECT_TRUE(automatic[3] == hopper[3] || automatic[3] == portable[3]);
  } else {
    EXPECT_EQ(automatic[3], portable[3]);
  }
}

// Host-only: the workspace of every case of the family test above holds the pieces of 66 blocks
// or more, so the kernel runs in each (at B1 N40 L256 H8 D48 it would not: the running dQ's 299
// slots leave room for the pieces of 16, and the kernel, correct or not, would go unchecked there).
TEST(HopperPlan, PairBiasFamilyCasesLeaveTheKernelRoom) {
  for (const PairBiasCase& c : kPairBiasCases) {
    EXPECT_GT(hopper_pair_bias_piece_bytes(c.B, c.N, c.L, c.H, c.D), 0u)
        << "B" << c.B << " N" << c.N << " L" << c.L << " H" << c.H << " D" << c.D;
  }
  EXPECT_EQ(hopper_pair_bias_piece_bytes(1, 40, 256, 8, 48), 0u);
}

#else

TEST(HopperPlan, PairBiasFamilyCasesLeaveTheKernelRoom) {
  GTEST_SKIP() << "needs the CUDA backend with the Hopper family (CMAKE_CUDA_ARCHITECTURES with 90)";
}
TEST_P(HopperPairBiasGradient, AgreesWithThePortableOneOverItsSplits) {
  GTEST_SKIP() << "needs the CUDA backend with the Hopper family (CMAKE_CUDA_ARCHITECTURES with 90)";
}
TEST(KernelFamily, HopperBackwardAgreesWithThePortableOneAndAutoTakesItWhereFaster) {
  GTEST_SKIP() << "needs the CUDA backend with the Hopper family (CMAKE_CUDA_ARCHITECTURES with 90)";
}
TEST(KernelFamily, HopperBackwardTakesHeadDimBucket64WhereItFits) {
  GTEST_SKIP() << "needs the CUDA backend with the Hopper family (CMAKE_CUDA_ARCHITECTURES with 90)";
}
TEST_P(HopperBackwardRunningDq, InTheWorkspace) {
  GTEST_SKIP() << "needs the CUDA backend with the Hopper family (CMAKE_CUDA_ARCHITECTURES with 90)";
}
TEST(KernelFamily, HopperSwitchTakesAnotherForwardThatAgreesWithThePortableOne) {
  GTEST_SKIP() << "needs the CUDA backend with the Hopper family (CMAKE_CUDA_ARCHITECTURES with 90)";
}
TEST(KernelFamily, AutoTakesTheHopperForwardWhereItMeasuredFaster) {
  GTEST_SKIP() << "needs the CUDA backend with the Hopper family (CMAKE_CUDA_ARCHITECTURES with 90)";
}
TEST(KernelFamily, AutoTakesTheHopperBackwardAtFewItemsWhereItMeasuredFaster) {
  GTEST_SKIP() << "needs the CUDA backend with the Hopper family (CMAKE_CUDA_ARCHITECTURES with 90)";
}

#endif

#ifdef EVOATTN_WITH_CUDA
// The Hopper forward's host-side choices, checked without a GPU: three or four consumer
// warpgroups only where an instantiation has them and their blocks cover Lq within 15% of the
// fewest rows, two (two blocks an SM) in three's place where they cover Lq as well; every (bucket, consumers) layout fits the 227 KB an sm_90 block may take.
TEST(HopperPlan, ConsumerCountFollowsLqAndTheInstantiations) {
  using cuda::hopper::fwd_consumers_for;
  using cuda::hopper::fwd_two_n_for;
  // Four consumers on two n an item where 128-row items cover Lq with an odd count past the first.
  EXPECT_EQ(cuda::hopper::fwd_item_rows(4, 2), 128);
  EXPECT_EQ(cuda::hopper::fwd_item_rows(4, 1), 256);
  for (int64_t lq : {257, 300, 384, 513, 576, 640, 769, 896}) EXPECT_TRUE(fwd_two_n_for(32, lq, true)) << lq;
  for (int64_t lq : {1, 64, 128, 129, 192, 256, 385, 512, 641, 768}) EXPECT_FALSE(fwd_two_n_for(32, lq, true)) << lq;
  EXPECT_TRUE(fwd_two_n_for(16, 384, true));
  EXPECT_FALSE(fwd_two_n_for(32, 384, false));  // odd N below 15, or a tile bias varying along n
  EXPECT_FALSE(fwd_two_n_for(64, 384, true));   // no instantiation at bucket 64
  EXPECT_EQ(fwd_consumers_for(32, 768), 4);  // 3 blocks of 256 rows, as many as 4 of 192 or 6 of 128
  EXPECT_EQ(fwd_consumers_for(32, 384), 2);  // 512 rows with four; two blocks of two an SM, not three
  EXPECT_EQ(fwd_consumers_for(32, 300), 2);  // 384 rows with two or three
  EXPECT_EQ(fwd_consumers_for(32, 192), 3);  // 256 rows with two or four
  EXPECT_EQ(fwd_consumers_for(32, 576), 3);  // 640 rows with two
  EXPECT_EQ(fwd_consumers_for(32, 512), 4);
  EXPECT_EQ(fwd_consumers_for(32, 256), 4);  // 384 rows with three
  EXPECT_EQ(fwd_consumers_for(64, 256), 2);  // no four-consumer instantiation at 64; 384 rows with three
  EXPECT_EQ(fwd_consumers_for(64, 64), 2);
  EXPECT_EQ(fwd_consumers_for(16, 192), 3);  // 192 rows, against 256 with two or four
  EXPECT_EQ(fwd_consumers_for(16, 256), 4);
  EXPECT_EQ(fwd_consumers_for(16, 384), 2);  // 512 rows with four; two blocks of two an SM, not three
  EXPECT_EQ(fwd_consumers_for(64, 384), 3);  // one block an SM at 64
  EXPECT_EQ(fwd_consumers_for(16, 768), 4);
  EXPECT_EQ(fwd_consumers_for(128, 768), 2);  // no three-consumer instantiation at 128
  // The automatic choice: the Hopper forward from more work items than half the SMs (132 SMs).
  using cuda::hopper::fwd_auto_prefers_hopper;
  EXPECT_TRUE(fwd_auto_prefers_hopper(768 * 4 * 4, 132));      // tri768
  EXPECT_TRUE(fwd_auto_prefers_hopper(256 * 8 * 2, 132));      // tri256d64 (two consumers)
  EXPECT_TRUE(fwd_auto_prefers_hopper(1 * 24 * 3, 132));       // apb768 at 24 heads: 72 items
  EXPECT_TRUE(fwd_auto_prefers_hopper(67, 132));
  EXPECT_FALSE(fwd_auto_prefers_hopper(66, 132));
  EXPECT_FALSE(fwd_auto_prefers_hopper(1 * 16 * 4, 132));      // apb768 at Lq 1024: 64 items
  EXPECT_FALSE(fwd_auto_prefers_hopper(1 * 16 * 3, 132));      // apb768: 48 items
  // The backward: the Hopper dK/dV/dQ kernel from four (b, n, h) an SM (132 SMs), and from 32
  // and Lq / 16 up to one an SM; one an SM at head-dim bucket 64.
  using cuda::hopper::bwd_auto_prefers_hopper;
  EXPECT_TRUE(bwd_auto_prefers_hopper(32, 768 * 4, 768, 132));      // tri768
  EXPECT_TRUE(bwd_auto_prefers_hopper(16, 4 * 256 * 4, 256, 132));  // template
  EXPECT_TRUE(bwd_auto_prefers_hopper(32, 528, 256, 132));
  EXPECT_FALSE(bwd_auto_prefers_hopper(32, 527, 256, 132));
  EXPECT_FALSE(bwd_auto_prefers_hopper(32, 133, 256, 132));
  EXPECT_TRUE(bwd_auto_prefers_hopper(32, 132, 256, 132));
  EXPECT_TRUE(bwd_auto_prefers_hopper(16, 32, 256, 132));
  EXPECT_FALSE(bwd_auto_prefers_hopper(32, 31, 256, 132));
  EXPECT_TRUE(bwd_auto_prefers_hopper(32, 88, 768, 132));
  EXPECT_FALSE(bwd_auto_prefers_hopper(32, 44, 768, 132));          // 44 < 768 / 16
  EXPECT_FALSE(bwd_auto_prefers_hopper(32, 16, 768, 132));          // apb768: 16 (b, n, h)
  EXPECT_TRUE(bwd_auto_prefers_hopper(64, 256 * 8, 256, 132));      // tri256d64
  EXPECT_TRUE(bwd_auto_prefers_hopper(64, 132, 256, 132));
  EXPECT_FALSE(bwd_auto_prefers_hopper(64, 131, 256, 132));
  // The pair-bias gradient by tiles (B H ceil(Lq / 128) ceil(Lk / 128)).
  using cuda::hopper::pair_bias_auto_prefers_hopper;
  EXPECT_TRUE(pair_bias_auto_prefers_hopper(4 * 6 * 6));       // tri768
  EXPECT_TRUE(pair_bias_auto_prefers_hopper(4 * 4 * 3 * 3));   // b4tri384
  EXPECT_TRUE(pair_bias_auto_prefers_hopper(8 * 3 * 3));       // extramsa
  EXPECT_TRUE(pair_bias_auto_prefers_hopper(4 * 4 * 2 * 2));   // template
  EXPECT_TRUE(pair_bias_auto_prefers_hopper(8 * 2 * 2));       // msarow
  EXPECT_TRUE(pair_bias_auto_prefers_hopper(4 * 2 * 2));       // tri256
  EXPECT_FALSE(pair_bias_auto_prefers_hopper(2 * 2 * 2));      // not measured
  using cuda::hopper::bwd_smem_bytes;
  EXPECT_LE(bwd_smem_bytes(32, 2, 13), size_t{227} * 1024);
  EXPECT_GT(bwd_smem_bytes(32, 2, 14), size_t{227} * 1024);
  EXPECT_LE(bwd_smem_bytes(16, 2, 33), size_t{227} * 1024);
  EXPECT_GT(bwd_smem_bytes(16, 2, 34), size_t{227} * 1024);
  // Bucket 64 (one K/V stage): Lq up to 320, tri256d64's 256 among them.
  EXPECT_LE(bwd_smem_bytes(64, 2, 5), size_t{227} * 1024);
  EXPECT_GT(bwd_smem_bytes(64, 2, 6), size_t{227} * 1024);
  // Three consumers where their running dQ fits (Lq up to 448 at bucket 32, 1472 at 16) and
  // 192-key blocks pad Lk no further than 128-key ones.
  using cuda::hopper::bwd_consumers_for;
  EXPECT_EQ(bwd_consumers_for(32, 6, 384), 3);   // b4tri384
  EXPECT_EQ(bwd_consumers_for(32, 4, 256), 2);   // tri256, msarow: 384 keys against 256
  EXPECT_EQ(bwd_consumers_for(32, 7, 448), 2);   // 576 keys against 512
  EXPECT_EQ(bwd_consumers_for(32, 7, 384), 3);   // Lq 448: the running dQ still fits
  EXPECT_EQ(bwd_consumers_for(32, 8, 512), 2);   // msacol: the running dQ does not fit
  EXPECT_EQ(bwd_consumers_for(32, 12, 768), 2);  // tri768
  // With the running dQ in the workspace (hopper_dq_pool), a staging tile a consumer in its place:
  // three consumers would fit at tri768 (the pool is taken there only when asked for: two in
  // shared memory are faster, docs/perf/log.md v79), and any Lq fits.
  EXPECT_LE(bwd_smem_bytes(32, 3, 12, true), size_t{227} * 1024);
  EXPECT_LE(bwd_smem_bytes(32, 2, 1000, true), size_t{227} * 1024);
  EXPECT_EQ(bwd_consumers_for(32, 12, 768, true), 3);
  EXPECT_EQ(bwd_consumers_for(32, 14, 896, true), 2);  // 960 keys against 896
  EXPECT_EQ(bwd_consumers_for(16, 6, 384), 3);   // extramsa
  EXPECT_EQ(bwd_consumers_for(16, 4, 256), 2);   // template
  EXPECT_EQ(bwd_consumers_for(16, 23, 1152), 3);
  EXPECT_EQ(bwd_consumers_for(16, 24, 1536), 2);
  EXPECT_EQ(bwd_consumers_for(64, 4, 256), 2);   // tri256d64: two at bucket 64
  EXPECT_EQ(bwd_consumers_for(64, 1, 64), 2);
  for (int bucket : {16, 32, 64}) {
    for (int64_t q_tiles : {1, 4, 7, 8, 13, 23, 33}) {
      for (int64_t lk : {1, 64, 129, 192, 256, 384, 1000}) {
        const int c = bwd_consumers_for(bucket, q_tiles, lk);
        EXPECT_TRUE(cuda::variants::hopper_bwd_consumers(bucket, c)) << "bucket " << bucket << " tiles " << q_tiles;
      }
    }
  }
  for (int bucket : {16, 32, 64, 128}) {
    for (int64_t lq : {1, 17, 64, 65, 128, 192, 257, 384, 1000, 5120}) {
      const int c = fwd_consumers_for(bucket, lq);
      EXPECT_TRUE(cuda::variants::hopper_fwd_consumers(bucket, c)) << "bucket " << bucket << " Lq " << lq;
      EXPECT_LE(cuda::hopper::fwd_smem_bytes(bucket, c), size_t{227} * 1024) << "bucket " << bucket;
      if (cuda::hopper::fwd_two_n_for(bucket, lq, true)) {
        EXPECT_TRUE(cuda::variants::hopper_fwd_two_n(bucket)) << "bucket " << bucket << " Lq " << lq;
        EXPECT_LE(cuda::hopper::fwd_smem_bytes(bucket, 4, 2), size_t{227} * 1024) << "bucket " << bucket;
      }
    }
  }
  // Two blocks of two consumers share an SM at buckets 16 and 32: their shared memory and the 1 KB
  // the GPU reserves a block fit its 228 KB.
  for (int bucket : {16, 32}) {
    ASSERT_EQ(cuda::hopper::fwd_blocks_per_sm(bucket, 2), 2);
    EXPECT_LE(2 * (cuda::hopper::fwd_smem_bytes(bucket, 2) + 1024), size_t{228} * 1024) << "bucket " << bucket;
  }
  EXPECT_EQ(cuda::hopper::fwd_blocks_per_sm(32, 4), 1);
  EXPECT_EQ(cuda::hopper::fwd_blocks_per_sm(64, 2), 1);
}

// The pair-bias gradient's split, checked without a GPU: the ranges tile the units in order,
// worker_of finds the range of every unit, and the pieces of a tile two or more workers share go
// to distinct workspace slots, at most two a worker (first and last), or one where the split
// gives every worker a range inside one tile (split_units, fewer tiles than workers).
TEST(HopperPlan, PairBiasSplitCoversEveryUnitAndNOnceAndItsPiecesTheirOwnSlots) {
  using cuda::hopper::PairBiasSplit;
  for (const int tiles : {1, 3, 8, 16, 32, 64, 100, 144, 720}) {
    for (const int n : {2, 3, 40, 768}) {
      for (const int most : {1, 7, 114, 132}) {
        const PairBiasSplit s = cuda::hopper::split_units(tiles, n, most);
        SCOPED_TRACE("tiles " + std::to_string(tiles) + " n " + std::to_string(n) + " workers " +
                     std::to_string(s.workers) + " slots " + std::to_string(s.slots));
        ASSERT_LE(s.workers, std::min(tiles * n, most));
        // Stream-K over every worker, or a whole number a tile idling at most one in eight.
        if (s.slots == 2) {
          ASSERT_EQ(s.workers, std::min(tiles * n, most));
        } else {
          ASSERT_EQ(s.workers % tiles, 0);
          ASSERT_GE(8 * s.workers, 7 * std::min(tiles * n, most));
        }
        ASSERT_EQ(s.begin(0), 0);
        ASSERT_EQ(s.begin(s.workers), s.units);
        for (int g = 0; g < s.workers; ++g) {
          ASSERT_LT(s.begin(g), s.begin(g + 1));
          ASSERT_EQ(s.worker_of(s.begin(g)), g);
          ASSERT_EQ(s.worker_of(s.begin(g + 1) - 1), g);
        }
        std::vector<int> used(static_cast<size_t>(s.pieces()), 0);
        for (int t = 0; t < tiles; ++t) {
          const int first = s.worker_of(t * n), last = s.worker_of((t + 1) * n - 1);
          if (first == last) continue;  // whole in one range: written directly
          for (int g = first; g <= last; ++g) {
            const int slot = s.piece_slot(g, t);
            ASSERT_TRUE(slot >= 0 && slot < s.pieces()) << "slot " << slot;
            ++used[static_cast<size_t>(slot)];
          }
        }
        // With one piece a worker, every range lies in one tile.
        if (s.slots == 1) {
          for (int g = 0; g < s.workers; ++g) ASSERT_EQ(s.begin(g) / n, (s.begin(g + 1) - 1) / n) << "worker " << g;
        }
        // Each tile's units take every n once; the block holding a tile's last unit is at n = its
        // step mod N there.
        for (int t = 0; t < tiles; ++t) {
          std::vector<int> seen(static_cast<size_t>(n), 0);
          for (int u = t * n; u < (t + 1) * n; ++u) ++seen[static_cast<size_t>(s.n_of(u))];
          ASSERT_EQ(std::count(seen.begin(), seen.end(), 1), n) << "tile " << t;
          const int g = s.worker_of((t + 1) * n - 1);
          for (int u = std::max(t * n, s.begin(g)); u < (t + 1) * n; ++u) ASSERT_EQ(s.n_of(u), (u - s.begin(g)) % n);
        }
        for (size_t slot = 0; slot < used.size(); ++slot) ASSERT_LE(used[slot], 1) << "slot " << slot;
      }
    }
  }
}
#else
TEST(HopperPlan, ConsumerCountFollowsLqAndTheInstantiations) {
  GTEST_SKIP() << "needs the CUDA backend's planner";
}
TEST(HopperPlan, PairBiasSplitCoversEveryUnitAndNOnceAndItsPiecesTheirOwnSlots) {
  GTEST_SKIP() << "needs the CUDA backend's planner";
}
#endif

}  // namespace
}  // namespace evoattn::test
