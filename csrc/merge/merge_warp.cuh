// The warp merge: one warp a merge unit of up to MergeTraits::kWarpMaxSplits splits, with no shared
// memory or barriers, so that the eight warps of a block merge eight units at once. Where a plan cuts
// many requests into 9-16 splits (equal batches of 32-64 requests at 16 heads), a block a unit spent
// most of its time in merge_slice's barriers, unit after unit; with more splits a warp's own round
// trips cost more than the block's barriers.
//
// f16 partials (FP8 problems) are loaded all at once, 2 registers a split, so a unit waits one L2
// round trip for its partials. fp32 ones (4 registers a split) load MergeTraits::kWarpBatch splits a
// batch, the next batch in flight while one is summed.
#pragma once

#include "merge/merge_common.cuh"
#include "merge/merge_traits.h"

namespace mla {

// A warp's LSE pass over up to 32 splits of a (request, row) whose first partial row is `first`: split
// s's weight relative to the largest LSE (`best`, base 2) sits in lane s (`own`; empty splits and lanes
// past count: 0), and every lane holds their sum.
struct SplitWeights {
  float best, own, sum;
};
__device__ __forceinline__ SplitWeights warp_split_weights(const DecodeParams& p, long long first, int count,
                                                           int lane) {
  const float lse = lane < count ? p.part_lse[first + (long long)lane * p.rows] : -INFINITY;
  float best = lse;
  for (int o = 16; o > 0; o >>= 1) best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, o));
  const float base = best == -INFINITY ? 0.f : best;
  const float own = lane < count ? fast_exp2(lse - base) : 0.f;
  float sum = own;
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  return {best, own, sum};
}

template <bool HALF_PARTIALS>
__device__ __forceinline__ void merge_slice_warp(const DecodeParams& p, int b, int row, int slice, int first_partial,
                                                 int count) {
  const int lane = threadIdx.x & 31;
  const long long first = (long long)first_partial * p.rows + row;
  const int dim = slice * kMergeSliceDims + lane * 4;
  auto load_partial = [&](int s) {  // zeros past count
    return s < count ? load_partial4<HALF_PARTIALS>(p, first, dim, s) : make_float4(0.f, 0.f, 0.f, 0.f);
  };
  if constexpr (HALF_PARTIALS) {
    // Every split's 4 f16 dims (2 registers each) loaded at once with the LSEs: one round trip a unit.
    uint2 raw[MergeTraits::kWarpMaxSplits];
    const __half* part = static_cast<const __half*>(p.part_o);
#pragma unroll
    for (int s = 0; s < MergeTraits::kWarpMaxSplits; ++s)
      raw[s] = s < count ? *reinterpret_cast<const uint2*>(part + (first + (long long)s * p.rows) * kDimV + dim)
                         : make_uint2(0u, 0u);
    const SplitWeights weights = warp_split_weights(p, first, count, lane);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int s = 0; s < MergeTraits::kWarpMaxSplits; ++s) {
      const float2 lo = unpack2<true>(raw[s].x), hi = unpack2<true>(raw[s].y);
      add_scaled(acc, __shfl_sync(0xffffffffu, weights.own, s), make_float4(lo.x, lo.y, hi.x, hi.y));
    }
    store_merged4(p, b, row, slice, dim, acc, weights.best, weights.sum);
    return;
  }
  // The first batch of splits is loaded with the LSEs, so that both round trips overlap.
  constexpr int kBatch = MergeTraits::kWarpBatch;
  float4 v[kBatch];
#pragma unroll
  for (int i = 0; i < kBatch; ++i) v[i] = load_partial(i);
  const SplitWeights weights = warp_split_weights(p, first, count, lane);

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  // Not fully unrolled: that would load every split at once and double the registers.
#pragma unroll 1
  for (int s0 = 0; s0 < count; s0 += kBatch) {
    float4 next[kBatch];  // the next batch loads while this one is summed
#pragma unroll
    for (int i = 0; i < kBatch; ++i) next[i] = load_partial(s0 + kBatch + i);
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      add_scaled(acc, __shfl_sync(0xffffffffu, weights.own, s0 + i), v[i]);
      v[i] = next[i];
    }
  }
  store_merged4(p, b, row, slice, dim, acc, weights.best, weights.sum);
}

}  // namespace mla
