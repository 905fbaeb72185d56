// Combine the split partials of a request by their LSE into the bf16 output and the LSE (natural
// log). Runs after the decode kernel when a request's KV was split across CTAs (split-KV).
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

#include "params.h"
#include "ptx.cuh"

namespace mla {

// Combine split partials by their LSE. One block per (request, row, slice of 128 dims), so even
// one request's merge spreads over the GPU. Each warp takes every kMergeGroups-th split of the
// slice (4 dims per lane), so the loads of all splits are in flight at once; the LSE pass over
// the splits is shared by all threads of the block.
constexpr int kMergeGroups = 8;
constexpr int kMergeThreads = 32 * kMergeGroups;
// The wide merge's blocks an SM must hold at once: four on SM90, whose merge fits the 64 registers a
// thread that leaves; three elsewhere (SM120's build spills at 64). The launcher asks the occupancy
// (merge_blocks_per_sm) and sizes a planned call's merge grid to one wave.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
#define MLA_MERGE_MIN_BLOCKS 4
#else
#define MLA_MERGE_MIN_BLOCKS 3
#endif
constexpr int kMergeSliceDims = 128;
constexpr int kMergeSlices = kDimV / kMergeSliceDims;
constexpr int kMergeBatch = 8;  // splits per warp loaded ahead of the LSE pass
constexpr int kMaxSplits = MLA_MAX_KV_SPLITS;
static_assert(kMaxSplits <= kMergeThreads, "one thread per split in the LSE pass");

struct MergeShared {
  float weights[kMaxSplits];
  float reduce[kMergeThreads / 32];
  float4 partial[kMergeGroups - 1][32];
};

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

// One warp: the same (request, row, slice of 128 dims) as merge_slice, for up to kWarpMergeMaxSplits
// splits, with no shared memory or barriers, so that the eight warps of a block merge eight units at
// once. Where a plan cuts many requests into 9-16 splits (equal batches of 32-64 requests at 16
// heads), a block a unit spent most of its time in merge_slice's barriers, unit after unit; with
// more splits a warp's own round trips cost more than the block's barriers.
//
// f16 partials (FP8 problems) are loaded all at once, 2 registers a split, so a unit waits one L2
// round trip for its partials. fp32 ones (4 registers a split) load kWarpMergeBatch splits a batch,
// kWarpMergeBuffers batches in flight (2 x 2 by default), about one round trip per batch (4 x 2 and
// 8 x 1 spill at sm_90's 64 registers). Build settings for A/B runs: MLA_WARP_MERGE_BATCH,
// MLA_WARP_MERGE_BUFFERS, MLA_WARP_MERGE_MAX_SPLITS (a split's weight sits in lane s: at most 32).
#ifndef MLA_WARP_MERGE_MAX_SPLITS
#define MLA_WARP_MERGE_MAX_SPLITS 16
#endif
#ifndef MLA_WARP_MERGE_BATCH
#define MLA_WARP_MERGE_BATCH 2
#endif
#ifndef MLA_WARP_MERGE_BUFFERS
#define MLA_WARP_MERGE_BUFFERS 2
#endif
constexpr int kWarpMergeMaxSplits = MLA_WARP_MERGE_MAX_SPLITS;
constexpr int kWarpMergeBatch = MLA_WARP_MERGE_BATCH;
constexpr int kWarpMergeBuffers = MLA_WARP_MERGE_BUFFERS;
static_assert(kWarpMergeMaxSplits <= 32, "one lane holds each split's weight");
static_assert(kWarpMergeMaxSplits % kWarpMergeBatch == 0, "batches of whole splits");
static_assert(kWarpMergeBuffers == 1 || kWarpMergeBuffers == 2, "one batch in flight, or two");

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
    uint2 raw[kWarpMergeMaxSplits];
    const __half* part = static_cast<const __half*>(p.part_o);
#pragma unroll
    for (int s = 0; s < kWarpMergeMaxSplits; ++s)
      raw[s] = s < count ? *reinterpret_cast<const uint2*>(part + (first + (long long)s * p.rows) * kDimV + dim)
                         : make_uint2(0u, 0u);
    const SplitWeights weights = warp_split_weights(p, first, count, lane);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int s = 0; s < kWarpMergeMaxSplits; ++s) {
      const float2 lo = unpack2<true>(raw[s].x), hi = unpack2<true>(raw[s].y);
      add_scaled(acc, __shfl_sync(0xffffffffu, weights.own, s), make_float4(lo.x, lo.y, hi.x, hi.y));
    }
    store_merged4(p, b, row, slice, dim, acc, weights.best, weights.sum);
    return;
  }
  // The first batch of splits is loaded with the LSEs, so that both round trips overlap.
  float4 v[kWarpMergeBatch];
#pragma unroll
  for (int i = 0; i < kWarpMergeBatch; ++i) v[i] = load_partial(i);
  const SplitWeights weights = warp_split_weights(p, first, count, lane);

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  // Not fully unrolled: that would load every split at once and double the registers.
#pragma unroll 1
  for (int s0 = 0; s0 < count; s0 += kWarpMergeBatch) {
    float4 next[kWarpMergeBatch];
    if constexpr (kWarpMergeBuffers == 2) {  // the next batch loads while this one is summed
#pragma unroll
      for (int i = 0; i < kWarpMergeBatch; ++i) next[i] = load_partial(s0 + kWarpMergeBatch + i);
    }
#pragma unroll
    for (int i = 0; i < kWarpMergeBatch; ++i) {
      add_scaled(acc, __shfl_sync(0xffffffffu, weights.own, s0 + i), v[i]);
      if constexpr (kWarpMergeBuffers == 2) v[i] = next[i];
    }
    if constexpr (kWarpMergeBuffers == 1) {  // the next batch loads once this one is summed
#pragma unroll
      for (int i = 0; i < kWarpMergeBatch; ++i) v[i] = load_partial(s0 + kWarpMergeBatch + i);
    }
  }
  store_merged4(p, b, row, slice, dim, acc, weights.best, weights.sum);
}

// Few splits (large batches: the split plan gives each request a handful): one warp per row, all
// 512 dims (16 per lane) and every split in registers, no shared memory or barriers. The kernel
// above gives such a row four blocks of eight warps, mostly idle, and its barriers then dominate.
//
// The splits are loaded a batch at a time and summed after the batch is in: at a batch of one the
// warp waits one L2 round trip per split (sm_90a's SASS issues each split's loads only after the
// previous split's sums), at two it waits four for eight splits. f16 partials (FP8 problems) only,
// and at most two: the planned merge runs at 64 registers a thread, where four f16 splits a batch or
// two fp32 ones spill. A build setting for A/B runs, MLA_FEW_MERGE_BATCH.
constexpr int kFewSplitsMax = MLA_FEW_SPLITS_MAX;
constexpr int kFewSplitsRowsPerBlock = 8;
constexpr int kFewSplitsDimsPerLane = kDimV / 32;
#ifndef MLA_FEW_MERGE_BATCH
#define MLA_FEW_MERGE_BATCH 1
#endif
constexpr int kFewMergeBatch = MLA_FEW_MERGE_BATCH;
static_assert(kFewSplitsMax % kFewMergeBatch == 0, "batches of whole splits");
template <bool HALF_PARTIALS>
constexpr int kFewMergeBatchOf = HALF_PARTIALS ? kFewMergeBatch : 1;

// 16 dims of a split's partial row as loaded (f16 stays packed until it is summed: 8 registers).
template <bool HALF_PARTIALS>
struct Partial16 {
  static constexpr int kWords = HALF_PARTIALS ? 2 : 4;
  uint4 words[kWords];

  __device__ __forceinline__ void load(const DecodeParams& p, long long at) {
    const uint4* src = HALF_PARTIALS ? reinterpret_cast<const uint4*>(static_cast<const __half*>(p.part_o) + at)
                                     : reinterpret_cast<const uint4*>(static_cast<const float*>(p.part_o) + at);
#pragma unroll
    for (int c = 0; c < kWords; ++c) words[c] = src[c];
  }

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int c = 0; c < kWords; ++c) words[c] = make_uint4(0u, 0u, 0u, 0u);
  }

  // acc += w * these 16 dims.
  __device__ __forceinline__ void add_to(float (&acc)[kFewSplitsDimsPerLane], float w) const {
#pragma unroll
    for (int c = 0; c < kWords; ++c) {
      const uint32_t word[4] = {words[c].x, words[c].y, words[c].z, words[c].w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (HALF_PARTIALS) {
          const float2 pair = unpack2<true>(word[k]);
          acc[8 * c + 2 * k] += w * pair.x;
          acc[8 * c + 2 * k + 1] += w * pair.y;
        } else {
          acc[4 * c + k] += w * __uint_as_float(word[k]);
        }
      }
    }
  }
};

// One warp: row `row` of request b, `count` (<= kFewSplitsMax) partials from partial row block
// `first_partial` on.
template <bool HALF_PARTIALS>
__device__ __forceinline__ void merge_row_few(const DecodeParams& p, long long b, long long row,
                                              long long first_partial, int count) {
  const int lane = threadIdx.x & 31;
  const long long first = first_partial * p.rows + row;
  const int dim = lane * kFewSplitsDimsPerLane;

  float lse[kFewSplitsMax];
  float best = -INFINITY;
#pragma unroll
  for (int s = 0; s < kFewSplitsMax; ++s) {
    lse[s] = s < count ? p.part_lse[first + s * p.rows] : -INFINITY;
    best = fmaxf(best, lse[s]);
  }
  const float base = best == -INFINITY ? 0.f : best;
  constexpr int batch = kFewMergeBatchOf<HALF_PARTIALS>;
  float acc[kFewSplitsDimsPerLane] = {};
  float weight_sum = 0.f;
#pragma unroll
  for (int s0 = 0; s0 < kFewSplitsMax; s0 += batch) {
    if (s0 >= count) break;
    Partial16<HALF_PARTIALS> v[batch];
#pragma unroll
    for (int i = 0; i < batch; ++i) {  // the batch's loads first, then its sums
      if (s0 + i < count) {
        v[i].load(p, (first + (s0 + i) * p.rows) * kDimV + dim);
      } else {
        v[i].clear();
      }
    }
#pragma unroll
    for (int i = 0; i < batch; ++i) {
      const float w = fast_exp2(lse[s0 + i] - base);  // past count and empty splits: LSE -inf, weight 0
      weight_sum += w;
      v[i].add_to(acc, w);
    }
  }
  const float scale = weight_sum > 0.f ? read_scale(p.bmm2_ptr, p.bmm2) / weight_sum : 0.f;
  const long long out_row = b * p.rows + row;
  uint4* dst = reinterpret_cast<uint4*>(p.out + out_row * kDimV + dim);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const float* v = acc + 8 * c;
    dst[c] = make_uint4(pack2<false>(v[0] * scale, v[1] * scale), pack2<false>(v[2] * scale, v[3] * scale),
                        pack2<false>(v[4] * scale, v[5] * scale), pack2<false>(v[6] * scale, v[7] * scale));
  }
  if (lane == 0 && p.lse != nullptr) p.lse[out_row] = weight_sum > 0.f ? (best + log2f(weight_sum)) * kLn2 : -INFINITY;
}

template <bool HALF_PARTIALS>
__global__ void __launch_bounds__(32 * kFewSplitsRowsPerBlock)
    mla_merge_few_splits_kernel(const __grid_constant__ DecodeParams p) {
  pdl_wait();
  const long long problem_row = (long long)blockIdx.x * kFewSplitsRowsPerBlock + (threadIdx.x >> 5);
  if (problem_row >= (long long)p.batch * p.rows) return;
  const long long b = problem_row / p.rows;
  merge_row_few<HALF_PARTIALS>(p, b, problem_row % p.rows, b * p.num_splits, p.num_splits);
}

// Without a plan: one block per (row, request, slice) of a call whose every request was split.
// With one, a fixed grid (how many requests the plan cut is known only on the GPU): its warps take, in
// turn, the (request, row, slice) units of the requests cut into 9 to kWarpMergeMaxSplits splits and the
// rows of the requests cut into fewer (merge_row_few), one a warp; then its blocks the units of the
// requests cut into more, one a block.
template <bool HALF_PARTIALS>
__global__ void __launch_bounds__(kMergeThreads, MLA_MERGE_MIN_BLOCKS)
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
  // The requests that take a block per unit (more than kWarpMergeMaxSplits splits) are listed in shared
  // memory, kMergeThreads of the many-split list at a time, a request a thread: the block loop below
  // then takes only their units: walking every unit and looking its request up in turn (two dependent
  // reads a unit) only to skip the warp units took a quarter of the merge at 16 heads x 32 x 16k. The
  // first lookups are issued before the warp-level work, so that it hides them.
  __shared__ int4 block_requests[kMergeThreads];  // (request, first partial, count)
  __shared__ int listed_before[kMergeGroups];
  auto lookup = [&](int i) { return i < many ? many_request(i) : make_int4(0, 0, 0, 0); };
  int4 mine = lookup(threadIdx.x);
  // Warp-level work as one list: the units of requests cut into up to kWarpMergeMaxSplits splits (one
  // a warp), then the rows of requests cut into at most kFewSplitsMax (one a warp, merge_row_few), so
  // that a warp without a unit takes a row at once rather than after its block's units: where a batch
  // has requests of each kind, a block's warps no longer wait out the three kinds one after another.
  const int warp = threadIdx.x >> 5;
  // int: at most the batch (< 2^16) x 1024 rows past the units.
  const int work = units + p.plan[1] * p.rows;
  for (int w = blockIdx.x * kMergeGroups + warp; w < work; w += gridDim.x * kMergeGroups) {
    if (w < units) {
      const Unit u = unit_at(w);
      if (u.count <= kWarpMergeMaxSplits)
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
    const bool takes_block = mine.z > kWarpMergeMaxSplits;
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
