// Thin wrappers over the PTX the kernels use: cp.async (Ampere+), ldmatrix, mma.sync m16n8k16
// (16-bit) and m16n8k8 (16-bit and TF32), ex2.approx. Everything here exists on sm_80 and later,
// except griddepcontrol, mbarriers, TMA, stmatrix and clusters (sm_90), which compile to nothing
// before.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace evoattn::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The SM this thread runs on (a hint: the numbering may have gaps).
__device__ __forceinline__ uint32_t sm_id() {
  uint32_t id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// Programmatic dependent launch (sm_90 and later; no-ops before, and when the kernel was
// launched without it: kernel_launch.h). launch_dependents lets the stream's next kernel place
// its blocks once every block of this one has called it (or exited); wait_for_previous_grid
// blocks until the stream's previous kernel has completed and its writes are visible. A kernel
// calls wait_for_previous_grid before it touches memory that kernel may write or read.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// The start of most kernels: wait for the previous one, then let the next one place its blocks.
// In this order: the next kernel is then placed only once every kernel before this one has
// completed, which WaitForPreviousGridAtExit relies on.
__device__ __forceinline__ void start_after_previous_grid() {
  wait_for_previous_grid();
  launch_dependents();
}
// For a kernel that touches nothing its predecessor writes and writes nothing its predecessor
// reads (a bias gradient after the dK/dV pass; where that pass writes Delta,
// LaunchPlan::delta_in_dkdv, bwd_rows waits at its start too and the pair-bias kernel re-reads a
// Delta still pending, kDeltaPending): it waits only as it exits, so its completion
// still implies the predecessor's and the stream's order holds for whatever comes after it. What
// it reads from earlier kernels (the row statistics) is complete: its predecessor let it launch
// only after its own wait (start_after_previous_grid).
struct WaitForPreviousGridAtExit {
  __device__ __forceinline__ ~WaitForPreviousGridAtExit() { wait_for_previous_grid(); }
};

// A float another grid may still be writing (a pending Delta, kDeltaPending): read at GPU
// scope, never from a stale L1 line.
__device__ __forceinline__ float load_relaxed_gpu(const float* x) {
  float value;
  asm volatile("ld.relaxed.gpu.global.f32 %0, [%1];\n" : "=f"(value) : "l"(x) : "memory");
  return value;
}
// 16-byte global -> shared copy; `valid` = false writes 16 zero bytes instead (zero-fill).
// The memory clobbers keep the compiler from moving shared-memory accesses across the copy
// and the wait.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(src_bytes)
               : "memory");
}
// 4 bytes (cp.async.ca: through L1); zero-filled when !valid, as cp_async_16.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(src_bytes)
               : "memory");
}

// 8 bytes (cp.async.ca: through L1), always valid.
__device__ __forceinline__ void cp_async_8(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}

// An arrival on an mbarrier once this thread's cp.async copies so far have landed (.noinc: it is
// one of the arrivals the barrier was initialised to expect).
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
#endif
}

// Named barriers (ids 1..15; 0 is __syncthreads'): `threads` of the block, a multiple of 32, take
// part. arrive counts the calling warp in without waiting.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// mbarriers and the tensor memory accelerator (TMA; sm_90 and later, compiled to nothing
// before: the kernels that use them run only there). A TMA load copies a box of a tensor map
// into shared memory and counts its bytes on an mbarrier; a thread waits for a barrier's phase
// (its parity) to complete.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// One arrival that also expects `bytes` more of TMA traffic in the current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
#endif
}
// The same wait for a producer warp that may wait a whole tile: it sleeps until the phase completes
// (or the hint, in ns, runs out) instead of spinning, so its scheduler's issue slots stay with the
// warps that compute. (Consumers spin: their waits are short and the wake-up would cost them.)
__device__ __forceinline__ void mbarrier_wait_suspend(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1, %2;\n"
      "@!done bra wait;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity), "r"(0x989680)
      : "memory");
#endif
}
// The box at coordinates c (innermost first) of the tensor map at `map` (a __grid_constant__
// kernel parameter) into shared memory at `dst`, counted on `bar`.
template <int kRank>
__device__ __forceinline__ void tma_load(void* dst, const void* map, uint64_t* bar, const int (&c)[kRank]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint64_t desc = reinterpret_cast<uint64_t>(map);
  if constexpr (kRank == 4) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(
            smem_addr(dst)),
        "l"(desc), "r"(smem_addr(bar)), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3])
        : "memory");
  } else {
    static_assert(kRank == 5, "4-d and 5-d maps");
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(
            smem_addr(dst)),
        "l"(desc), "r"(smem_addr(bar)), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4])
        : "memory");
  }
#endif
}

// The box at coordinates c of the tensor map at `map` from shared memory at `src` (its
// writes by this thread's generic stores made visible first: fence_proxy_async), in this
// thread's bulk group; bulk_commit closes the group, bulk_wait_read<0> waits until every group
// has read its shared memory (it may then be overwritten), bulk_wait<0> until the writes are
// done.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void tma_store_5d(const void* map, const void* src, const int (&c)[5]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_addr(src)), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4])
      : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Four 8x8 b16 matrices from registers to shared memory (sm_90): lane l gives the row address
// of matrix l / 8, row l % 8; r[i] holds this thread's pair of matrix i in the mma C layout.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_address, const uint32_t (&r)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_address), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
#endif
}
__device__ __forceinline__ void stmatrix_x4(void* smem, const uint32_t (&r)[4]) { stmatrix_x4(smem_addr(smem), r); }
// Two floats to 8-byte aligned shared memory in one 64-bit store (the compiler may split a float2
// store into two 32-bit ones, whose pairs of lanes then share banks).
__device__ __forceinline__ void st_shared_v2(void* smem, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(smem_addr(smem)), "f"(x), "f"(y) : "memory");
}

// Thread block clusters (sm_90; nothing before, where no cluster is launched). cluster_sync:
// every thread of every block of the cluster arrives (release) and waits (acquire), so each
// block's shared-memory writes before it are visible to the others' reads after it.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
// 16 bytes at `smem` (this block's shared memory) in block `rank` of the cluster.
__device__ __forceinline__ float4 ld_shared_cluster_v4(const void* smem, uint32_t rank) {
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(smem)), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
#endif
  return v;
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 b16 matrices; lane l supplies the row address of matrix l/8, row l%8, as a
// shared-window address (e.g. a precomputed per-thread offset plus a tile's base) or a pointer.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) { ldmatrix_x4(r, smem_addr(smem)); }
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  ldmatrix_x4_trans(r, smem_addr(smem));
}
// An 8x8 b16 matrix held in the mma C layout (thread 4g + t: row g, columns 2t and 2t + 1),
// transposed in registers (sm_75 and later): the result is the transpose in the same layout.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(smem)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(smem)));
}

// D = A * B + C for one m16n8k16 tile, float accumulators, in place.
template <typename Element>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4],
                                                  const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// D = A * B + C for one m16n8k8 tile (head dims of 8 mod 16: the last half k-step). Its A is
// m16n8k16's a[0], a[1] and its B m16n8k16's b[0] for the same first eight k.
template <typename Element>
__device__ __forceinline__ void mma_1688(float (&c)[4], const uint32_t (&a)[2], uint32_t b);

template <>
__device__ __forceinline__ void mma_1688<__half>(float (&c)[4], const uint32_t (&a)[2], uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(b));
}

template <>
__device__ __forceinline__ void mma_1688<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[2],
                                                        uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(b));
}

// float32 -> TF32 (round to nearest, ties away), and the TF32 mma for the float32 opt-in path.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t y;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void mma_1688_tf32(float (&c)[4], const uint32_t (&a)[4],
                                              const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// 2^x on the special-function unit; ex2(-inf) = +0, which is how masked scores vanish.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 1/x and log2(x) on the special-function unit (about 1 ulp), for normal x: the forward's row
// sums. The IEEE forms add a refinement and a denormal branch per row.
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats -> one register of two 16-bit elements (low half = first).
template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Column tiles 2k and 2k + 1 of a 16-row float accumulator (C layout) -> the A fragment of the
// m16n8k16 product that takes them as its 16 x 16 left operand (the C layout of two column tiles
// is the A layout): P or dS straight from the S / dP accumulators.
template <typename Element>
__device__ __forceinline__ void accumulators_to_a(const float (&lo)[4], const float (&hi)[4], uint32_t (&a)[4]) {
  a[0] = pack2<Element>(lo[0], lo[1]);
  a[1] = pack2<Element>(lo[2], lo[3]);
  a[2] = pack2<Element>(hi[0], hi[1]);
  a[3] = pack2<Element>(hi[2], hi[3]);
}

// One k-step of the query-side backward's S = Q K^T and dP = dO V^T for the two 8-key column
// tiles of 16 keys: K and V rows (the B operands, not transposed) read by ldmatrix at `off`.
template <typename Element>
__device__ __forceinline__ void s_dp_key_pair(float (&s0)[4], float (&s1)[4], float (&dp0)[4], float (&dp1)[4],
                                              const uint32_t (&q)[4], const uint32_t (&d_o)[4], const Element* Ks,
                                              const Element* Vs, int off) {
  uint32_t kb[4], vb[4];
  ldmatrix_x4(kb, Ks + off);
  ldmatrix_x4(vb, Vs + off);
  mma_16816<Element>(s0, q, {kb[0], kb[1]});
  mma_16816<Element>(s1, q, {kb[2], kb[3]});
  mma_16816<Element>(dp0, d_o, {vb[0], vb[1]});
  mma_16816<Element>(dp1, d_o, {vb[2], vb[3]});
}

}  // namespace evoattn::cuda
