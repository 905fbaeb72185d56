// The split cost model, shared by the host's split count (schedule/host_schedule.h: one count for every
// request of a call, from its longest) and the GPU's split plan (plan/plan_kernel.cuh: a target of tiles
// a split, from the real lengths). Work is counted in KV tiles: a CTA costs its tiles plus
// kFixedTilesPerCta (pipeline fill, epilogue); CTAs run in waves of what the GPU holds at once; a
// request cut into more than one split costs its merge 1/kSplitsPerMergeTile of a tile a split.
#pragma once

#include "common/kernel_constants.h"

namespace mla {

template <class T>
__host__ __device__ __forceinline__ constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

// What a CTA of `tiles` KV tiles costs.
template <class T>
__host__ __device__ __forceinline__ constexpr T cta_cost(T tiles) {
  return tiles + kFixedTilesPerCta;
}

// What merging a request cut into `splits` costs, in 1/kSplitsPerMergeTile of a tile.
__host__ __device__ __forceinline__ constexpr int merge_cost(int splits) { return splits > 1 ? splits : 0; }

}  // namespace mla
