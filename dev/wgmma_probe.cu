// Hopper's wgmma on the MLA decode tile, as a standalone probe (sm_90a): does a 64-row tile's QK^T
// (Q and K K-major in 128-byte-swizzled shared memory) and P.V (P K-major, V read in place from the K
// tile as an MN-major operand) give the float64 answer, and at what rate do they run from shared
// memory? It answers whether the Hopper path that performance.md names ("What limits the kernel")
// can read K and V once per 64 rows from the cache tile's one layout. No global-memory pipeline: the
// timed loop re-reads the same tiles.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o wgmma_probe dev/wgmma_probe.cu
//   ./wgmma_probe            (check, then the rate)   ./wgmma_probe --corrupt   (the check must fail)
#include <string.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "wgmma_tile.cuh"

constexpr int kSmemBytes = 2 * kTileBytes + kAtomBytes + 1024;  // Q, K, P and the 1024-byte alignment

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
