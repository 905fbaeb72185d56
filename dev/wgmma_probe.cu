// Hopper's wgmma on the MLA decode tile, as a standalone probe (sm_90a): does a 64-row tile's QK^T
// (Q and K K-major in 128-byte-swizzled shared memory) and P.V (P K-major, V read in place from the K
// tile as an MN-major operand) give the float64 answer, and at what rate do they run from shared
// memory? It answers whether the Hopper path that performance.md names ("What limits the kernel")
// can read K and V once per 64 rows from the cache tile's one layout. No global-memory pipeline: the
// timed loop re-reads the same tiles.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o wgmma_probe dev/wgmma_probe.cu
//   ./wgmma_probe            (check, then the rate)   ./wgmma_probe --corrupt   (the check must fail)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#define CHECK(call)                                                                           \
  do {                                                                                        \
    cudaError_t err_ = (call);                                                                \
    if (err_ != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      exit(2);                                                                                \
    }                                                                                         \
  } while (0)

constexpr int kRows = 64;      // heads x q_len of one CTA: wgmma's M
constexpr int kTokens = 64;    // KV tokens a tile
constexpr int kHeadDim = 576;  // 512 latent + 64 rope
constexpr int kDimV = 512;
constexpr int kAtomCols = 64;  // bf16 columns of a 128-byte swizzle atom row
constexpr int kAtoms = kHeadDim / kAtomCols;
constexpr int kAtomBytes = 64 * 128;  // one atom column of a 64-row operand
constexpr int kTileBytes = kAtoms * kAtomBytes;
constexpr int kThreads = 256;                                   // two warpgroups: each owns 256 of the 512 output dims
constexpr int kSmemBytes = 2 * kTileBytes + kAtomBytes + 1024;  // Q, K, P and the 1024-byte alignment

// Byte offset of (row, col) of a [64][cols] bf16 operand stored as 64-column atoms of 128-byte rows,
// the 16-byte chunks of row r XOR-ed with r % 8 (wgmma's 128-byte swizzle; atoms 1024-byte aligned).
__host__ __device__ inline int swizzled(int row, int col) {
  const int atom = col / kAtomCols, byte = (col % kAtomCols) * 2;
  return atom * kAtomBytes + row * 128 + (((byte >> 4) ^ (row & 7)) << 4) + (byte & 15);
}

// A shared-memory matrix descriptor with the 128-byte swizzle: start, leading and stride byte offsets.
__device__ inline uint64_t descriptor(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)(leading_bytes >> 4) << 16) |
         ((uint64_t)(stride_bytes >> 4) << 32) | (1ull << 62);
}

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Generic-proxy shared-memory stores made visible to wgmma's (async proxy) reads.
__device__ inline void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ inline void warpgroup_sync(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id)); }

// D (64 x N fp32, N / 2 registers a thread) = A.B (+ D where accumulate): both operands in shared
// memory; B K-major (QK^T: K rows) or MN-major (P.V: V rows read in place), the last immediate.
__device__ __forceinline__ void wgmma_m64n64_ss_kmajor(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                       int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%"
      "30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_m64n256_ss_bmn(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                     int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%"
      "30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%"
      "58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%"
      "86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%"
      "111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, "
      "1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
        "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

__device__ inline uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

enum Mode { kBoth = 0, kQkOnly = 1, kPvOnly = 2 };

// One CTA: S = Q.K^T (64 x 64) by warpgroup 0, P = bf16(S) into shared memory, then O += P.V by both
// warpgroups, 256 dims each, `iters` times over the same tiles. Modes kQkOnly / kPvOnly time one part
// (both warpgroups on it); their outputs are not checked.
__global__ void __launch_bounds__(kThreads, 1)
    probe_kernel(const __nv_bfloat16* q, const __nv_bfloat16* k, float* s_out, float* o_out, int iters, int mode) {
  extern __shared__ uint8_t raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sq = base;
  uint8_t* sk = base + kTileBytes;
  uint8_t* sp = base + 2 * kTileBytes;
  for (int c = threadIdx.x; c < kRows * kHeadDim / 8; c += kThreads) {
    const int row = c / (kHeadDim / 8), col = c % (kHeadDim / 8) * 8;
    *reinterpret_cast<uint4*>(sq + swizzled(row, col)) = *reinterpret_cast<const uint4*>(q + row * kHeadDim + col);
    *reinterpret_cast<uint4*>(sk + swizzled(row, col)) = *reinterpret_cast<const uint4*>(k + row * kHeadDim + col);
  }
  fence_async_shared();
  __syncthreads();
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  const int row0 = 16 * (t / 32) + (t % 32) / 4, col0 = 2 * (t % 4);  // accumulator fragment origin
  const uint32_t q_addr = smem_u32(sq), k_addr = smem_u32(sk), p_addr = smem_u32(sp);
  float s[32], o[128];
  for (int i = 0; i < 32; ++i) s[i] = 0.f;
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  for (int it = 0; it < iters; ++it) {
    if (mode != kPvOnly && (wg == 0 || mode == kQkOnly)) {
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {  // 16 columns (32 bytes) a step, four steps an atom
        const int off = ks / 4 * kAtomBytes + ks % 4 * 32;
        wgmma_m64n64_ss_kmajor(s, descriptor(q_addr + off, 16, 1024), descriptor(k_addr + off, 16, 1024), ks > 0);
      }
      wgmma_commit();
      wgmma_wait_all();
      if (mode == kBoth) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          *reinterpret_cast<__nv_bfloat162*>(sp + swizzled(row0, 8 * j + col0)) =
              __floats2bfloat162_rn(s[4 * j], s[4 * j + 1]);
          *reinterpret_cast<__nv_bfloat162*>(sp + swizzled(row0 + 8, 8 * j + col0)) =
              __floats2bfloat162_rn(s[4 * j + 2], s[4 * j + 3]);
        }
        fence_async_shared();
      }
    }
    if (mode == kBoth) __syncthreads();  // P is in shared memory
    if (mode != kQkOnly) {
      wgmma_fence();
#pragma unroll
      for (int kt = 0; kt < kTokens / 16; ++kt) {
        // A: P, K-major, one atom; B: V = K's first 512 columns in place, MN-major: 8 token rows of 128
        // bytes a core matrix (stride byte offset 1024 to the next 8 tokens), the next 64 dims one atom
        // further on (leading byte offset).
        const uint64_t a = descriptor(p_addr + kt * 32, 16, 1024);
        const uint64_t b = descriptor(k_addr + 4 * wg * kAtomBytes + kt * 16 * 128, kAtomBytes, 1024);
        wgmma_m64n256_ss_bmn(o, a, b, 1);
      }
      wgmma_commit();
      wgmma_wait_all();
    }
    if (mode == kBoth) __syncthreads();  // P read before the next iteration writes it
  }
  if (blockIdx.x != 0) return;
  if (wg == 0)
    for (int j = 0; j < 8; ++j)
      for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e) s_out[(row0 + 8 * h) * kTokens + 8 * j + col0 + e] = s[4 * j + 2 * h + e];
  for (int j = 0; j < 32; ++j)
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e) o_out[(row0 + 8 * h) * kDimV + 256 * wg + 8 * j + col0 + e] = o[4 * j + 2 * h + e];
}

static double relative_l2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::isfinite(got[i]) ? got[i] - want[i] : 1e300;
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

int main(int argc, char** argv) {
  const bool corrupt = argc > 1 && strcmp(argv[1], "--corrupt") == 0;
  std::mt19937 rng(20261127);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<__nv_bfloat16> hq(kRows * kHeadDim), hk(kTokens * kHeadDim);
  for (auto& x : hq) x = __float2bfloat16(uniform(rng));
  for (auto& x : hk) x = __float2bfloat16(uniform(rng));
  // float64 reference on the bf16 inputs: S = Q.K^T; O = bf16(S).V (P is rounded to bf16 as the kernel does)
  std::vector<double> s_ref(kRows * kTokens), o_ref(kRows * kDimV, 0.0);
  for (int r = 0; r < kRows; ++r)
    for (int n = 0; n < kTokens; ++n) {
      double acc = 0;
      for (int d = 0; d < kHeadDim; ++d)
        acc += (double)__bfloat162float(hq[r * kHeadDim + d]) * (double)__bfloat162float(hk[n * kHeadDim + d]);
      s_ref[r * kTokens + n] = acc;
    }
  for (int r = 0; r < kRows; ++r)
    for (int n = 0; n < kTokens; ++n) {
      const double p = __bfloat162float(__float2bfloat16((float)s_ref[r * kTokens + n]));
      for (int d = 0; d < kDimV; ++d) o_ref[r * kDimV + d] += p * (double)__bfloat162float(hk[n * kHeadDim + d]);
    }
  if (corrupt) hk[5 * kHeadDim + 300] = __float2bfloat16(__bfloat162float(hk[5 * kHeadDim + 300]) + 4.f);

  __nv_bfloat16 *dq, *dk;
  float *ds, *dout;
  CHECK(cudaMalloc(&dq, hq.size() * 2));
  CHECK(cudaMalloc(&dk, hk.size() * 2));
  CHECK(cudaMalloc(&ds, s_ref.size() * 4));
  CHECK(cudaMalloc(&dout, o_ref.size() * 4));
  CHECK(cudaMemcpy(dq, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dk, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(ds, 0xFF, s_ref.size() * 4));  // NaN: a value the kernel leaves unwritten fails
  CHECK(cudaMemset(dout, 0xFF, o_ref.size() * 4));
  CHECK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  probe_kernel<<<1, kThreads, kSmemBytes>>>(dq, dk, ds, dout, 1, kBoth);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> s(s_ref.size()), o(o_ref.size());
  CHECK(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost));
  const double s_err = relative_l2(s, s_ref), o_err = relative_l2(o, o_ref);
  // fp32 sums of bf16 products: S to ~1e-6; O to ~1e-6 but where an fp32 S rounds to the other bf16
  // neighbour of the float64 one's (rare ties)
  const bool ok = s_err < 1e-5 && o_err < 1e-4;
  printf("check: S = Q.K^T rel L2 %.2e, O = P.V rel L2 %.2e vs float64: %s\n", s_err, o_err, ok ? "PASS" : "FAIL");
  if (corrupt) return ok ? 1 : 0;  // --corrupt: succeeds only if the check failed
  if (!ok) return 1;

  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int iters = 4000;
  const double flops_qk = 2.0 * kRows * kTokens * kHeadDim, flops_pv = 2.0 * kRows * kTokens * kDimV;
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  const char* names[] = {"QK^T + P.V, one after the other", "QK^T only (both warpgroups)", "P.V only"};
  const double flops[] = {flops_qk + flops_pv, 2 * flops_qk, flops_pv};
  for (int mode = 0; mode < 3; ++mode) {
    std::vector<float> ms;
    for (int rep = 0; rep < 7; ++rep) {
      CHECK(cudaEventRecord(start));
      probe_kernel<<<sms, kThreads, kSmemBytes>>>(dq, dk, ds, dout, iters, mode);
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(stop));
      CHECK(cudaEventSynchronize(stop));
      float t = 0;
      CHECK(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    printf("%-34s %8.3f ms  %6.1f TFLOP/s  (%d CTAs x %d tiles, median of 7)\n", names[mode], median,
           flops[mode] * sms * iters / (median * 1e-3) / 1e12, sms, iters);
  }
  return 0;
}
