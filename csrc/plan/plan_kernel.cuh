// The split plan of one decode call, made on the GPU from the real seq_lens (so a CUDA graph replays
// it for whatever lengths the step holds): a target of KV tiles per split, chosen by a cost model of
// the batch's work dealt to `plan_pieces` CTAs in waves (choose_target, on schedule/cost_model.h), then
// each request cut into as many splits as its own length needs.
// A long request among short ones then runs on many CTAs instead of the few that one split count for
// the whole batch, planned from its longest request, gives it. Layout: schedule/plan_layout.h.
#pragma once

#include <limits.h>
#include <stdint.h>

#include "common/kernel_constants.h"
#include "common/params.h"
#include "common/ptx.cuh"
#include "schedule/cost_model.h"
#include "schedule/plan_layout.h"

namespace mla {

constexpr int kPlanThreads = 1024;

// Exclusive prefix sum of v over the block; `total` gets the sum. warp_totals: blockDim / 32 ints.
__device__ __forceinline__ int block_exclusive_scan(int v, int* warp_totals, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int inclusive = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += n;
  }
  __syncthreads();  // an earlier scan's reads of warp_totals are done
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int t = lane < warps ? warp_totals[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t += n;
    }
    if (lane < warps) warp_totals[lane] = t;  // inclusive over warps
  }
  __syncthreads();
  total = warp_totals[warps - 1];
  return (warp > 0 ? warp_totals[warp - 1] : 0) + inclusive - v;
}

// The largest v over the block. scratch: blockDim / 32 ints.
__device__ __forceinline__ int block_max(int v, int* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // an earlier use's reads of scratch are done
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  int best = 0;
  for (int w = 0; w < warps; ++w) best = max(best, scratch[w]);
  return best;
}

// The split counts of the longest request the plan weighs: every count to 32, then steps of about a
// sixteenth (32, 34, ..., 48, 51, ...), to kMaxSplits.
__host__ __device__ constexpr int next_split_candidate(int k) { return k + (k / 16 > 1 ? k / 16 : 1); }

constexpr int count_split_candidates() {
  int n = 0;
  for (int k = 1; k <= kMaxSplits; k = next_split_candidate(k)) ++n;
  return n;
}
constexpr int kSplitCandidates = count_split_candidates();

// A request's tiles as the plan weighs them: its length within all the page ids of the call (a ragged
// request's own count bounds what the decode kernel reads; the plan only balances the splits).
__device__ __forceinline__ int request_tiles(const DecodeParams& p, int b) {
  return (request_len(p, b, p.max_pages) + kBlockN - 1) / kBlockN;
}

// Tiles a split of the longest request cut into k: at least one (a batch of empties has no tile).
__device__ __forceinline__ int split_length(int longest, int k) { return max(1, ceil_div(longest, k)); }

// The splits of a request of `tiles` tiles at `target` tiles a split.
__device__ __forceinline__ int request_splits(int tiles, int target) {
  return min(kMaxSplits, max(1, ceil_div(tiles, target)));
}

// The plan's cost of cutting the longest request into k splits, in twentieths of a tile's work: every
// request is cut into splits of at most T = ceil(longest / k) tiles (items), dealt to `pieces` CTAs in
// waves of cta_cost(T). The waves: enough for the work with every item's fixed cost, and one per
// pieces items longer than half a wave (two of those never share a CTA's wave). The longest request's
// merge adds its merge_cost. LLONG_MAX where the plan would not fit the
// bounds PlanLayout sizes the workspace by. One thread a candidate: `tiles` holds the first
// kPlanThreads requests' tiles (the rest are read again).
__device__ __forceinline__ long long split_cost(const DecodeParams& p, const int* tiles, int total, int longest,
                                                int k) {
  const int target = split_length(longest, k), size = cta_cost(target);
  int items = 0, long_items = 0, partials = 0;
  for (int b = 0; b < p.batch; ++b) {
    const int t = b < kPlanThreads ? tiles[b] : request_tiles(p, b);
    const int splits = request_splits(t, target);
    items += splits;
    long_items += splits > 1 || 2 * cta_cost(t) > size ? splits : 0;
    partials += splits > 1 ? splits : 0;
  }
  const PlanLayout layout{p.batch, p.plan_pieces};
  // Split requests hold two partials or more, so within max_partials they are within max_merged too.
  if (items > layout.max_items() || partials > layout.max_partials()) return LLONG_MAX;
  const long long wave = static_cast<long long>(p.plan_pieces) * size;
  const long long work_waves = ceil_div(total + static_cast<long long>(kFixedTilesPerCta) * items, wave);
  const long long waves = max(max(1LL, work_waves), static_cast<long long>(ceil_div(long_items, p.plan_pieces)));
  return waves * size * kSplitsPerMergeTile + merge_cost(k);
}

// The target of tiles per split: ceil(longest / k) for the candidate k of least cost (split_cost), the
// fewest splits within 2% of it. At least kMinTilesPerSplit tiles a split.
__device__ __forceinline__ int choose_target(const DecodeParams& p, const int* tiles, int total, int longest) {
  static_assert(kSplitCandidates <= 96 && kPlanThreads >= 96, "warp 0 weighs three candidates a lane");
  __shared__ long long costs[96];
  __shared__ int chosen;
  const int most = max(1, min(kMaxSplits, longest / kMinTilesPerSplit));
  if (threadIdx.x < 96) {
    int k = 1;
    for (int i = 0; i < static_cast<int>(threadIdx.x); ++i) k = next_split_candidate(k);
    costs[threadIdx.x] =
        threadIdx.x < kSplitCandidates && k <= most ? split_cost(p, tiles, total, longest, k) : LLONG_MAX;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    long long best = min(min(costs[lane], costs[lane + 32]), costs[lane + 64]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) best = min(best, __shfl_xor_sync(0xffffffffu, best, o));
    auto fits = [&](int i) { return costs[i] != LLONG_MAX && costs[i] * 50 <= best * 51; };
    int first = fits(lane) ? lane : fits(lane + 32) ? lane + 32 : fits(lane + 64) ? lane + 64 : 96;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
    if (lane == 0) {
      int k = 1;
      for (int i = 0; i < first; ++i) k = next_split_candidate(k);
      chosen = split_length(longest, k);
    }
  }
  __syncthreads();
  return chosen;
}

// One block. Items go in request order, so a request's splits are consecutive items and its
// partials consecutive rows of the workspace.
__global__ void __launch_bounds__(kPlanThreads) mla_plan_kernel(const __grid_constant__ DecodeParams p) {
  __shared__ int warp_totals[kPlanThreads / 32];
  __shared__ int first_tiles[kPlanThreads];  // the first kPlanThreads requests' tiles
  pdl_wait();
  pdl_launch_dependents();
  const PlanLayout layout{p.batch, p.plan_pieces};
  int tiles = 0, longest = 0;
  for (int b = threadIdx.x; b < p.batch; b += blockDim.x) {
    const int t = request_tiles(p, b);
    if (b < kPlanThreads) first_tiles[b] = t;
    tiles += t;
    longest = max(longest, t);
  }
  int total = 0;
  block_exclusive_scan(tiles, warp_totals, total);  // its barriers publish first_tiles
  longest = block_max(longest, warp_totals);
  const int target = choose_target(p, first_tiles, total, longest);
  int items = 0, few = 0, many = 0, partials = 0;
  for (int base = 0; base < p.batch; base += blockDim.x) {
    const int b = base + threadIdx.x;
    const int t = b < kPlanThreads ? first_tiles[b] : b < p.batch ? request_tiles(p, b) : 0;
    const int splits = b < p.batch ? request_splits(t, target) : 0;
    const bool cut = splits > 1, cut_few = cut && splits <= kFewSplitsMax;
    int chunk_items = 0, chunk_few = 0, chunk_many = 0, chunk_partials = 0;
    const int first = items + block_exclusive_scan(splits, warp_totals, chunk_items);
    const int few_at = few + block_exclusive_scan(cut_few ? 1 : 0, warp_totals, chunk_few);
    const int many_at = many + block_exclusive_scan(cut && !cut_few ? 1 : 0, warp_totals, chunk_many);
    const int first_partial = partials + block_exclusive_scan(cut ? splits : 0, warp_totals, chunk_partials);
    if (b < p.batch) {
      p.plan[layout.first_item() + b] = first;
      p.plan[layout.count() + b] = splits;
      p.plan[layout.first_partial() + b] = first_partial;
      for (int s = 0; s < splits; ++s) p.plan[layout.items() + first + s] = b;
      if (cut_few) p.plan[layout.merged() + few_at] = b;
      if (cut && !cut_few) p.plan[layout.merged() + layout.max_merged() - 1 - many_at] = b;
    }
    items += chunk_items;
    few += chunk_few;
    many += chunk_many;
    partials += chunk_partials;
  }
  if (threadIdx.x == 0) {
    p.plan[0] = items;
    p.plan[1] = few;
    p.plan[2] = many;
  }
}

}  // namespace mla
