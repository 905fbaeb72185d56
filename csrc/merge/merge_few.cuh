// The row merge for few splits (large batches: the split plan gives each request a handful): one warp a
// query row, all 512 dims (16 per lane) and every split in registers, no shared memory or barriers. The
// block merge gives such a row four blocks of eight warps, mostly idle, and its barriers then dominate.
//
// The splits are loaded and summed one at a time: the warp waits one L2 round trip per split (sm_90a's
// SASS issues each split's loads only after the previous split's sums). Loading f16 splits two at a
// time gained nothing (docs/performance.md); more, or two fp32 ones, spill at the planned merge's 64
// registers a thread.
#pragma once

#include "merge/merge_common.cuh"

namespace mla {

constexpr int kFewSplitsRowsPerBlock = 8;
constexpr int kFewSplitsDimsPerLane = kDimV / 32;

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
  float acc[kFewSplitsDimsPerLane] = {};
  float weight_sum = 0.f;
#pragma unroll
  for (int s = 0; s < kFewSplitsMax; ++s) {
    if (s >= count) break;
    Partial16<HALF_PARTIALS> v;
    v.load(p, (first + s * p.rows) * kDimV + dim);
    const float w = fast_exp2(lse[s] - base);  // empty splits: LSE -inf, weight 0
    weight_sum += w;
    v.add_to(acc, w);
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

}  // namespace mla
