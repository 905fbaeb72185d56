// Thin wrappers over the PTX the kernels use: shared-memory addressing and stores, cp.async,
// ldmatrix, mma.sync (e4m3, bf16, f16), the exact e4m3 -> f16 widening, ex2, 16-bit packing, and
// programmatic dependent launch. Each maps to one instruction or a fixed short sequence.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace mla {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d));
}

__device__ __forceinline__ void st_shared_v2(uint32_t addr, uint32_t a, uint32_t b) {
  asm volatile("st.shared.v2.u32 [%0], {%1,%2};\n" ::"r"(addr), "r"(a), "r"(b));
}

__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
  return v;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D += A.B with fp32 accumulators; A row-major (4 regs), B column-major (2 regs). The wrappers
// differ only in the instruction: e4m3 16x8x32 (QMMA), bf16 and f16 16x8x16 (HMMA).
#define MLA_DEFINE_MMA(name, instruction)                                                                 \
  __device__ __forceinline__ void name(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { \
    asm volatile(instruction " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                   \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                         \
  }
MLA_DEFINE_MMA(mma_e4m3, "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32")
MLA_DEFINE_MMA(mma_bf16, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
MLA_DEFINE_MMA(mma_f16, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
#undef MLA_DEFINE_MMA

// D += scale * (A.B) where A.B (one 16-token k-step) is summed in f16 and only then added into the
// fp32 accumulators: HMMA with f16 accumulation runs at twice the f32-accumulate rate on GeForce
// Ada/Blackwell. The f16 D fragment (row g | row g+8, cols 2t, 2t+1) lines up with the f32 one.
__device__ __forceinline__ void mma_f16_acc16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                              float scale) {
  uint32_t c0, c1;
  asm("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%8,%8};\n"
      : "=r"(c0), "=r"(c1)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0u));
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&c0));
  const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&c1));
  d[0] = fmaf(lo.x, scale, d[0]);
  d[1] = fmaf(lo.y, scale, d[1]);
  d[2] = fmaf(hi.x, scale, d[2]);
  d[3] = fmaf(hi.y, scale, d[3]);
}

// D = A.B + C in f16 (C and D: two f16x2 registers): chains k-steps of a P.V sum in f16.
__device__ __forceinline__ void mma_f16_chain(uint32_t (&c)[2], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};\n"
      : "+r"(c[0]), "+r"(c[1])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += scale * (two f16x2 sums), in fp32.
__device__ __forceinline__ void add_f16_sums(float (&d)[4], const uint32_t (&c)[2], float scale) {
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&c[0]));
  const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&c[1]));
  d[0] = fmaf(lo.x, scale, d[0]);
  d[1] = fmaf(lo.y, scale, d[1]);
  d[2] = fmaf(hi.x, scale, d[2]);
  d[3] = fmaf(hi.y, scale, d[3]);
}

// Four e4m3 values (low byte first) -> two f16x2 (bytes 0-1, bytes 2-3), exact. Taking the halves
// apart in PTX lets F2FP read the upper half directly (R.H1) instead of after a shift.
__device__ __forceinline__ void e4m3x4_to_f16x4(uint32_t packed, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(packed));
}

// a * b, two f16 lanes at once (rounded to nearest).
__device__ __forceinline__ uint32_t mul_f16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <bool F16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (F16) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

template <bool F16>
__device__ __forceinline__ float2 unpack2(uint32_t packed) {
  if constexpr (F16) {
    return __half22float2(*reinterpret_cast<const __half2*>(&packed));
  } else {
    return make_float2(__uint_as_float(packed << 16), __uint_as_float(packed & 0xffff0000u));
  }
}

// Programmatic dependent launch: wait for the previous kernel's writes before the first global
// read, and let the next kernel start its prologue early.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

// Barriers between warp roles. A named barrier (ids 1..15; 0 is __syncthreads) joins only the warps of
// one role. An mbarrier in shared memory hands a buffer from one role to the other: the producer's
// threads arrive (release), the consumer waits for the phase to complete (acquire), parity-tracked.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void mbarrier_init(uint32_t bar, int arrivals) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// An arrival on the mbarrier once every cp.async this thread has issued so far has landed, counted
// as one of the phase's expected arrivals (.noinc).
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Registers a thread, traded by a whole warpgroup through the CTA's pool: only on the arch-specific
// targets (sm_90a, sm_100a, sm_120a, sm_121a; not sm_89), where MLA_TRADES_REGISTERS is defined.
#if defined(__CUDA_ARCH_SPECIFIC__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLA_TRADES_REGISTERS 1
#endif
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
// Returns once the phase with this parity has completed. try_wait suspends the thread in hardware
// (sm_90+); test_wait polls (sm_80+).
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\nmbarrier.try_wait.parity.shared.b64 done, [%0], %1;\n@!done bra WAIT;\n}\n" ::"r"(
          bar),
      "r"(parity)
      : "memory");
#else
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\nmbarrier.test_wait.parity.shared.b64 done, [%0], %1;\n@!done bra WAIT;\n}\n" ::"r"(
          bar),
      "r"(parity)
      : "memory");
#endif
}

}  // namespace mla
