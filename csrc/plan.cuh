// The split plan of one decode call, made on the GPU from the real seq_lens (so a CUDA graph replays
// it for whatever lengths the step holds): a target of KV tiles per split from the batch's total
// work over `plan_pieces` CTAs, then each request cut into as many splits as its own length needs.
// A long request among short ones then runs on many CTAs instead of the few that one split count for
// the whole batch, planned from its longest request, gives it. Layout: params.h's PlanLayout.
#pragma once

#include <stdint.h>

#include "merge_splits.cuh"
#include "params.h"
#include "ptx.cuh"

namespace mla {

constexpr int kPlanThreads = 1024;
constexpr int kMinTilesPerSplit = MLA_MIN_TILES_PER_SPLIT;
constexpr int kMaxPlanPieces = MLA_MAX_PLAN_PIECES;
constexpr int kSplitsPerMergeTile = MLA_SPLITS_PER_MERGE_TILE;

// Workspace bytes the plan takes, a multiple of 256 so that the partials after it stay aligned.
inline int64_t plan_workspace_bytes(const PlanLayout& layout) {
  return (static_cast<int64_t>(layout.ints()) * 4 + 255) / 256 * 256;
}

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

// The smallest t with t * t * kSplitsPerMergeTile >= longest: past that split length the longest
// request's merge costs more than its splits save (integer, so the host can say the same).
__device__ __forceinline__ int merge_bound(int longest) {
  int t = static_cast<int>(sqrtf(static_cast<float>(longest) / kSplitsPerMergeTile));
  while (static_cast<long long>(t) * t * kSplitsPerMergeTile < longest) ++t;
  while (t > 0 && static_cast<long long>(t - 1) * (t - 1) * kSplitsPerMergeTile >= longest) --t;
  return t;
}

__device__ __forceinline__ int request_tiles(const DecodeParams& p, int b) {
  return (request_len(p, b) + kBlockN - 1) / kBlockN;
}

// One block. Items go in request order, so a request's splits are consecutive items and its
// partials consecutive rows of the workspace.
__global__ void __launch_bounds__(kPlanThreads) mla_plan_kernel(const __grid_constant__ DecodeParams p) {
  __shared__ int warp_totals[kPlanThreads / 32];
  pdl_wait();
  pdl_launch_dependents();
  const PlanLayout layout{p.batch, p.plan_pieces};
  int tiles = 0, longest = 0;
  for (int b = threadIdx.x; b < p.batch; b += blockDim.x) {
    const int t = request_tiles(p, b);
    tiles += t;
    longest = max(longest, t);
  }
  int total = 0;
  block_exclusive_scan(tiles, warp_totals, total);
  longest = block_max(longest, warp_totals);
  // The target: the batch's total over the pieces (one wave), but at least kMinTilesPerSplit (shorter
  // splits cost more in merging than they save), and at least the length at which the longest
  // request's splits cost as much again in merging (t + (longest / t) / kSplitsPerMergeTile is
  // smallest at t = sqrt(longest / kSplitsPerMergeTile)). The bounds PlanLayout sizes the workspace
  // by follow from target >= total / pieces.
  const int target = max(max(kMinTilesPerSplit, merge_bound(longest)), (total + p.plan_pieces - 1) / p.plan_pieces);
  int items = 0, merged = 0, partials = 0;
  for (int base = 0; base < p.batch; base += blockDim.x) {
    const int b = base + threadIdx.x;
    const int splits = b < p.batch ? min(kMaxSplits, max(1, (request_tiles(p, b) + target - 1) / target)) : 0;
    const bool cut = splits > 1;
    int chunk_items = 0, chunk_merged = 0, chunk_partials = 0;
    const int first = items + block_exclusive_scan(splits, warp_totals, chunk_items);
    const int merge_at = merged + block_exclusive_scan(cut ? 1 : 0, warp_totals, chunk_merged);
    const int first_partial = partials + block_exclusive_scan(cut ? splits : 0, warp_totals, chunk_partials);
    if (b < p.batch) {
      p.plan[layout.first_item() + b] = first;
      p.plan[layout.count() + b] = splits;
      p.plan[layout.first_partial() + b] = first_partial;
      for (int s = 0; s < splits; ++s) p.plan[layout.items() + first + s] = b;
      if (cut) p.plan[layout.merged() + merge_at] = b;
    }
    items += chunk_items;
    merged += chunk_merged;
    partials += chunk_partials;
  }
  if (threadIdx.x == 0) {
    p.plan[0] = items;
    p.plan[1] = merged;
  }
}

}  // namespace mla
