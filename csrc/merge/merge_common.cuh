// What the merge kernels share: combining a request's split partials by their LSE into the bf16 output
// and the LSE (natural log), after the decode kernel cut the request's KV across CTAs (split-KV). A
// merge unit is a (request, query row, slice of kMergeSliceDims dims).
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

#include "common/kernel_constants.h"
#include "common/params.h"
#include "common/ptx.cuh"

namespace mla {

constexpr int kMergeGroups = 8;  // warps of a merge block
constexpr int kMergeThreads = 32 * kMergeGroups;
constexpr int kMergeSliceDims = 128;
constexpr int kMergeSlices = kDimV / kMergeSliceDims;
static_assert(kMaxSplits <= kMergeThreads, "one thread per split in the block merge's LSE pass");

// 4 dims (from `dim`) of split s of a (request, row) whose first partial row is `first`.
template <bool HALF_PARTIALS>
__device__ __forceinline__ float4 load_partial4(const DecodeParams& p, long long first, int dim, int s) {
  const long long at = (first + (long long)s * p.rows) * kDimV + dim;
  if constexpr (HALF_PARTIALS) {
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __half*>(p.part_o) + at);
    const float2 lo = unpack2<true>(raw.x), hi = unpack2<true>(raw.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  } else {
    return *reinterpret_cast<const float4*>(static_cast<const float*>(p.part_o) + at);
  }
}

__device__ __forceinline__ void add_scaled(float4& acc, float w, const float4& v) {
  acc.x += w * v.x;
  acc.y += w * v.y;
  acc.z += w * v.z;
  acc.w += w * v.w;
}

// A lane's 4 merged dims of a (request b, row, slice) into the bf16 output, and the row's LSE (natural
// log) from its slice 0's lane 0. `best` is the largest split LSE (base 2), `weight_sum` the sum of
// the splits' weights relative to it.
__device__ __forceinline__ void store_merged4(const DecodeParams& p, int b, int row, int slice, int dim,
                                              const float4& acc, float best, float weight_sum) {
  const float scale = weight_sum > 0.f ? read_scale(p.bmm2_ptr, p.bmm2) / weight_sum : 0.f;
  const long long out_row = (long long)b * p.rows + row;
  const uint2 packed =
      make_uint2(pack2<false>(acc.x * scale, acc.y * scale), pack2<false>(acc.z * scale, acc.w * scale));
  *reinterpret_cast<uint2*>(p.out + out_row * kDimV + dim) = packed;
  if (slice == 0 && (threadIdx.x & 31) == 0 && p.lse != nullptr)
    p.lse[out_row] = weight_sum > 0.f ? (best + log2f(weight_sum)) * kLn2 : -INFINITY;
}

}  // namespace mla
