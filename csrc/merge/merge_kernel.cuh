// The merge kernel of a planned call, and of an unplanned one whose requests were cut into more
// than kFewSplitsMax splits.
#pragma once

#include "common/params.h"
#include "common/ptx.cuh"
#include "merge/merge_block.cuh"
#include "merge/merge_common.cuh"
#include "merge/merge_few.cuh"
#include "merge/merge_traits.h"
#include "merge/merge_warp.cuh"

namespace mla {

// Without a plan: one block per (row, request, slice) of a call whose every request was split.
// With one, a fixed grid (how many requests the plan cut is known only on the GPU): its warps take, in
// turn, the (request, row, slice) units of the requests cut into 9 to MergeTraits::kWarpMaxSplits splits and the
// rows of the requests cut into fewer (merge_row_few), one a warp; then its blocks the units of the
// requests cut into more, one a block.
template <bool HALF_PARTIALS>
__global__ void __launch_bounds__(kMergeThreads, MergeTraits::kMinBlocks)
    mla_merge_splits_kernel(const __grid_constant__ DecodeParams p) {
  __shared__ MergeShared sh;
  pdl_wait();
  if (p.plan == nullptr) {
    const int b = blockIdx.y;
    merge_slice<HALF_PARTIALS>(p, sh, b, blockIdx.x, blockIdx.z, b * p.num_splits, p.num_splits);
    return;
  }
  const PlanLayout layout{p.batch, p.plan_pieces};
  const int many_at = layout.merged() + layout.max_merged() - 1;  // that list runs backwards
  const int many = p.plan[2];
  // int: at most max_merged (half the plan's partials) x 128 rows x 4 slices.
  const int units = many * p.rows * kMergeSlices;
  // Request i of the many-split list: (request, first partial, count).
  auto many_request = [&](int i) {
    const int b = p.plan[many_at - i];
    return make_int4(b, p.plan[layout.first_partial() + b], p.plan[layout.count() + b], 0);
  };
  struct Unit {
    int b, row, slice, first_partial, count;
  };
  auto unit_at = [&](int unit) {
    const int4 r = many_request(unit / (kMergeSlices * p.rows));
    return Unit{r.x, unit / kMergeSlices % p.rows, unit % kMergeSlices, r.y, r.z};
  };
  // The requests that take a block per unit (more than MergeTraits::kWarpMaxSplits splits) are listed in shared
  // memory, kMergeThreads of the many-split list at a time, a request a thread: the block loop below
  // then takes only their units: walking every unit and looking its request up in turn (two dependent
  // reads a unit) only to skip the warp units took a quarter of the merge at 16 heads x 32 x 16k. The
  // first lookups are issued before the warp-level work, so that it hides them.
  __shared__ int4 block_requests[kMergeThreads];  // (request, first partial, count)
  __shared__ int listed_before[kMergeGroups];
  auto lookup = [&](int i) { return i < many ? many_request(i) : make_int4(0, 0, 0, 0); };
  int4 mine = lookup(threadIdx.x);
  // Warp-level work as one list: the units of requests cut into up to MergeTraits::kWarpMaxSplits splits (one
  // a warp), then the rows of requests cut into at most kFewSplitsMax (one a warp, merge_row_few), so
  // that a warp without a unit takes a row at once rather than after its block's units: where a batch
  // has requests of each kind, a block's warps no longer wait out the three kinds one after another.
  const int warp = threadIdx.x >> 5;
  // int: at most the batch (< 2^16) x 1024 rows past the units.
  const int work = units + p.plan[1] * p.rows;
  for (int w = blockIdx.x * kMergeGroups + warp; w < work; w += gridDim.x * kMergeGroups) {
    if (w < units) {
      const Unit u = unit_at(w);
      if (u.count <= MergeTraits::kWarpMaxSplits)
        merge_slice_warp<HALF_PARTIALS>(p, u.b, u.row, u.slice, u.first_partial, u.count);
    } else {
      const int r = w - units;
      const int b = p.plan[layout.merged() + r / p.rows];
      merge_row_few<HALF_PARTIALS>(p, b, r % p.rows, p.plan[layout.first_partial() + b], p.plan[layout.count() + b]);
    }
  }
  // The units of longer requests: one a block, so that even one request's units spread over the GPU.
  const int lane = threadIdx.x & 31;
  for (int base = 0; base < many; base += kMergeThreads) {
    if (base > 0) mine = lookup(base + static_cast<int>(threadIdx.x));
    const bool takes_block = mine.z > MergeTraits::kWarpMaxSplits;
    const unsigned ballot = __ballot_sync(0xffffffffu, takes_block);
    if (lane == 0) listed_before[warp] = __popc(ballot);
    __syncthreads();  // also: the last chunk's units are done with block_requests
    int at = __popc(ballot & ((1u << lane) - 1)), listed = 0;
    for (int w = 0; w < kMergeGroups; ++w) {
      at += w < warp ? listed_before[w] : 0;
      listed += listed_before[w];
    }
    if (takes_block) block_requests[at] = mine;
    __syncthreads();
    // int: at most kMergeThreads requests x 128 rows x 4 slices.
    for (int unit = blockIdx.x; unit < listed * p.rows * kMergeSlices; unit += gridDim.x) {
      const int4 r = block_requests[unit / (kMergeSlices * p.rows)];
      merge_slice<HALF_PARTIALS>(p, sh, r.x, unit / kMergeSlices % p.rows, unit % kMergeSlices, r.y, r.z);
      __syncthreads();  // the next unit reuses the shared memory
    }
  }
}

}  // namespace mla
