// The online softmax between QK^T and P.V. The four dim quarters' partial scores of a tile meet in
// shared memory (store_partial_scores); each warp then sums them for a quarter of its row group's
// rows and runs the softmax there, so it runs once per row, not four times. P (16-bit) and the
// per-row rescale factors go back through shared memory to every warp of the row group. Scores
// are in the log2 domain; a row's LSE and 1 / sum come out at the end (publish). Each row keeps two
// sums: of P as rounded for P.V (normalises O, so a dominant key's rounding cancels there; per lane,
// in registers) and of P before rounding (the LSE, which callers merge by: exact to fp32, not to P's
// 8 or 11 bits; per row, in shared memory, since the FP8 two-fragment kernel has no register left).
#pragma once

#include <stdint.h>

#include "common/params.h"
#include "common/ptx.cuh"
#include "decode/tile_config.h"

namespace mla {

// Growth of a row maximum absorbed without rescaling (log2): P <= 2^8 is still exact enough.
constexpr float kMaxGrowthLog2 = 8.f;

// Swizzle of the partial-score buffer: a row's 8-float groups are XOR-ed with row & 3, so that
// float2 stores from the MMA layout (rows g, columns 8j + 2t) and float4 loads along a row are both
// free of bank conflicts.
__device__ __forceinline__ int score_index(int row, int col) { return row * kBlockN + (col ^ ((row & 3) << 3)); }

// This warp's partial scores (its dim quarter) into its quarter of the score buffer.
template <class C>
__device__ __forceinline__ void store_partial_scores(float* scores, const float (&sc)[C::kFragments][4][4],
                                                     const WarpRole& w) {
  float* mine = scores + w.wd * C::kTileRows * kBlockN;
#pragma unroll
  for (int f = 0; f < C::kFragments; ++f)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        *reinterpret_cast<float2*>(mine + score_index(local_row<C>(w, f, h), 8 * j + 2 * w.t)) =
            make_float2(sc[f][j][2 * h], sc[f][j][2 * h + 1]);
}

// The sparse list (its row of ids) whose empty entries this tile's softmax masks, or nullptr: none
// for a dense call, nor for a tile that never reads sparse lists.
template <class C>
__device__ __forceinline__ const int* sparse_list(const DecodeParams& p, const int* bt_row) {
  return C::kReadsSparseLists && p.sparse ? bt_row : nullptr;
}

// Softmax state of the rows this lane reduces: tile-local row row0 + 4 i + lane / 8, whose 8 lanes
// hold 4 tokens each of a tile.
template <class C>
struct OnlineSoftmax {
  static constexpr int kRowsPerLane = C::kSoftRows / 4;
  // P as stored for P.V: scaled down where P.V sums in f16 (qk_pv.cuh scales it back up); exact.
  static constexpr float kPStoredScale = C::kPvF16Acc ? 1.f / C::kPvF16Scale : 1.f;
  const int row0;    // first tile-local row this lane's warp reduces
  float* exact_sum;  // [tile rows] in shared memory: each row's sum of P before rounding (the LSE),
                     // read and written only by the row's first lane
  float row_max[kRowsPerLane];
  float row_sum[kRowsPerLane];  // this lane's share of the row's sum of P as rounded for P.V

  __device__ __forceinline__ OnlineSoftmax(int first_row, float* exact_sum_smem, int lane)
      : row0(first_row), exact_sum(exact_sum_smem) {
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) {
      row_max[i] = -INFINITY;
      row_sum[i] = 0.f;
      if ((lane & 7) == 0) exact_sum[row0 + 4 * i + (lane >> 3)] = 0.f;
    }
  }

  // One tile: sum the partial scores, mask (causal over the q_len new tokens, seq_len, and a sparse
  // list's empty entries where sparse_ids is its row, else nullptr), update
  // the running maximum and sum, write P and each row's rescale factor to shared memory.
  // first_masked: the first position some row may not see (only tiles reaching it are masked).
  __device__ __forceinline__ void update(const float* scores, const DecodeParams& p, int tile, int first_masked,
                                         int seq_len, float scale_log2, uint32_t p_smem, float* corr_smem,
                                         const WarpRole& w, const int* sparse_ids) {
    const int lane = w.lane;
    const bool masked_tile = (tile + 1) * kBlockN > first_masked;
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) {
      const int row = row0 + 4 * i + (lane >> 3), tok0 = 4 * (lane & 7);
      float x[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 v = *reinterpret_cast<const float4*>(scores + q * C::kTileRows * kBlockN + score_index(row, tok0));
        x[0] += v.x;
        x[1] += v.y;
        x[2] += v.z;
        x[3] += v.w;
      }
      // The row's limit: causal, or seq_len for every row (log2 domain from here on).
      const int limit =
          masked_tile ? min(first_masked + token_of_row(p, blockIdx.x * C::kTileRows + row), seq_len) : seq_len;
      float mx = -INFINITY;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int pos = tile * kBlockN + tok0 + e;
        bool visible = pos < limit;
        // A sparse list's empty entries (ids outside the cache) are masked; the loader zero-filled them.
        if (sparse_ids != nullptr && visible) visible = checked_page(p, __ldg(sparse_ids + pos)) >= 0;
        x[e] = visible ? x[e] * scale_log2 : -INFINITY;
        mx = fmaxf(mx, x[e]);
      }
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      // The reference maximum stays stale until the row maximum outgrows it by 2^kMaxGrowthLog2:
      // P <= 2^8 is still exact enough in f16/bf16, the sum and the accumulators share the stale
      // reference (it cancels in O and the LSE), and the accumulators are rescaled only then. Until
      // a row sees a finite score its accumulators are zero and need no rescale either.
      const float old = row_max[i];
      const float new_max = fmaxf(old, mx);
      const bool rescale = old != -INFINITY && new_max > old + kMaxGrowthLog2;
      const float ref = old == -INFINITY || rescale ? new_max : old;
      const float base = ref == -INFINITY ? 0.f : ref;  // a row with nothing visible yet
      const float correction = rescale ? fast_exp2(old - ref) : 1.f;
      row_max[i] = ref;
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = fast_exp2(x[e] - base);
      float tile_sum = (x[0] + x[1]) + (x[2] + x[3]);
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, o);
      if ((lane & 7) == 0) exact_sum[row] = exact_sum[row] * correction + tile_sum;
      const uint32_t p01 = pack2<C::kFp8>(x[0] * kPStoredScale, x[1] * kPStoredScale);
      const uint32_t p23 = pack2<C::kFp8>(x[2] * kPStoredScale, x[3] * kPStoredScale);
      // O's sum is taken over P as rounded for P.V, so a dominant key's rounding cancels in O (with
      // a stale maximum its P is no longer exactly 1).
      const float2 r01 = unpack2<C::kFp8>(p01), r23 = unpack2<C::kFp8>(p23);
      row_sum[i] = row_sum[i] * correction + ((r01.x + r01.y) + (r23.x + r23.y)) / kPStoredScale;
      st_shared_v2(p_smem + row * C::kPRowBytes + tok0 * 2, p01, p23);
      if ((lane & 7) == 0) corr_smem[row] = correction;  // exactly 1 unless rescaled
    }
  }

  // After the last tile: (1 / rounded sum, LSE in log2 from the exact sum) of each row into
  // row_stats[tile-local row]; (0, -inf) for a row that saw no key.
  __device__ __forceinline__ void publish(float2* row_stats, const WarpRole& w) const {
    const int lane = w.lane;
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) {
      float total = row_sum[i];
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
      const int row = row0 + 4 * i + (lane >> 3);
      if ((lane & 7) == 0)
        row_stats[row] =
            total > 0.f ? make_float2(1.f / total, row_max[i] + log2f(exact_sum[row])) : make_float2(0.f, -INFINITY);
    }
  }
};

// Rescale this warp's accumulators where a row's reference maximum was raised this tile (skipped
// by the whole warp when none was, the common case).
template <class C>
__device__ __forceinline__ void rescale_accumulators(float (&acc)[C::kFragments][16][4], const float* corr_smem,
                                                     const WarpRole& w) {
  float corr[C::kFragments][2];
  bool rescale = false;
#pragma unroll
  for (int f = 0; f < C::kFragments; ++f)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      corr[f][h] = corr_smem[local_row<C>(w, f, h)];
      rescale |= corr[f][h] != 1.f;
    }
  if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
    for (int f = 0; f < C::kFragments; ++f)
#pragma unroll
      for (int n = 0; n < 16; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[f][n][i] *= corr[f][i >> 1];
  }
}

}  // namespace mla
