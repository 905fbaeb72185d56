// The block merge: one block of kMergeGroups warps a merge unit. Each warp takes every
// kMergeGroups-th split of the slice (4 dims per lane), so the loads of all splits are in flight at
// once; the LSE pass over the splits is shared by all threads of the block.
#pragma once

#include "merge/merge_common.cuh"

namespace mla {

constexpr int kMergeBatch = 8;  // splits per warp loaded ahead of the LSE pass

struct MergeShared {
  float weights[kMaxSplits];
  float reduce[kMergeThreads / 32];
  float4 partial[kMergeGroups - 1][32];
};

// One (request, row, slice of 128 dims): `count` partials from partial row block `first_partial` on.
template <bool HALF_PARTIALS>
__device__ __forceinline__ void merge_slice(const DecodeParams& p, MergeShared& sh, int b, int row, int slice,
                                            int first_partial, int count) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long first = (long long)first_partial * p.rows + row;
  const int dim = slice * kMergeSliceDims + lane * 4;
  auto load_partial = [&](int s) { return load_partial4<HALF_PARTIALS>(p, first, dim, s); };
  // The first kMergeBatch splits of this warp are loaded before the LSE pass, so that their L2
  // round trip overlaps the LSE one (empty splits wrote zeros).
  float4 early[kMergeBatch];
#pragma unroll
  for (int i = 0; i < kMergeBatch; ++i) {
    const int s = warp + i * kMergeGroups;
    early[i] = s < count ? load_partial(s) : make_float4(0.f, 0.f, 0.f, 0.f);
  }

  float lse = -INFINITY;
  if (threadIdx.x < count) lse = p.part_lse[first + (long long)threadIdx.x * p.rows];
  float best = lse;
  for (int o = 16; o > 0; o >>= 1) best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, o));
  if (lane == 0) sh.reduce[warp] = best;
  __syncthreads();
  best = -INFINITY;
  for (int w = 0; w < kMergeThreads / 32; ++w) best = fmaxf(best, sh.reduce[w]);
  const float base = best == -INFINITY ? 0.f : best;
  const float w_own = threadIdx.x < count ? fast_exp2(lse - base) : 0.f;
  if (threadIdx.x < count) sh.weights[threadIdx.x] = w_own;
  float sum = w_own;
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  __syncthreads();  // weights[] complete; reduce[] reads of the max are done
  if (lane == 0) sh.reduce[warp] = sum;
  __syncthreads();
  float weight_sum = 0.f;
  for (int w = 0; w < kMergeThreads / 32; ++w) weight_sum += sh.reduce[w];

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < kMergeBatch; ++i) {
    const int s = warp + i * kMergeGroups;
    if (s < count) add_scaled(acc, sh.weights[s], early[i]);
  }
#pragma unroll 4
  for (int s = warp + kMergeBatch * kMergeGroups; s < count; s += kMergeGroups)
    add_scaled(acc, sh.weights[s], load_partial(s));
  if (warp > 0) sh.partial[warp - 1][lane] = acc;
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int g = 0; g < kMergeGroups - 1; ++g) add_scaled(acc, 1.f, sh.partial[g][lane]);
    store_merged4(p, b, row, slice, dim, acc, best, weight_sum);
  }
}

}  // namespace mla
