// KV tiles from the fp8_ds_mla cache (DeepSeek-V3.2, GLM-5): rows of 656 bytes, 512 e4m3 latent values,
// four fp32 scales (scale j multiplies values 128 j .. 128 j + 127), then 64 bf16 rope values. Two ways in:
//  - BF16 tiles (DsMlaTileLoad): widened on their way into shared memory into the BF16 tile layout,
//    unscaled (e4m3 is exact in bf16), each row's four scales in its 16-byte pad, so the BF16 kernel's
//    QK^T, softmax and P.V run on them with Q in bf16. A conversion sits between global and shared
//    memory, so the copies go through registers: fetch() issues a tile's loads and store() converts and
//    writes them one tile later, once they have landed; the tile's compute in between hides their latency.
//  - FP8 tiles (kDsMlaOnFp8Tiles, load_ds_mla_rows): the rows as they are, by cp.async; QK^T widens the
//    latent values to f16 per step (qk_pv.cuh), as it does plain FP8 rows there.
// Either way the scales join after the products: each warp's dim quarter is one scale tile, so its partial
// scores are scaled per token once its latent steps are done (exact to fp32 for any scale, where a scaled
// value would round: GLM's scales are not powers of two). For P.V the BF16 tiles scale P per token (one
// bf16 rounding of P x scale, as the plain path rounds P); the FP8 tiles scale V in f16 (P x scale could
// fall below f16's normal range, V x scale is the cache's own value).
#pragma once

#include <stdint.h>

#include "common/params.h"
#include "common/ptx.cuh"
#include "decode/tile_config.h"

namespace mla {

// Where a shared-memory row keeps its four scales: in place (raw rows), or in the widened row's pad.
template <class C>
constexpr int kScalesInRow = C::kRawDsMla ? kDsMlaScaleOffset : kHeadDim * 2;

// Scale tile `tile` of the token at row `tok` of a stage.
template <class C>
__device__ __forceinline__ float row_scale(uint32_t stage, int tok, int tile) {
  return ld_shared_f32(stage + tok * C::kSmemRowBytes + kScalesInRow<C> + 4 * tile);
}

// One tile of raw rows (FP8 tiles): the token's kThreadsPerToken threads copy its 41 16-byte chunks in
// turn; a token past the request or of an empty entry (page -1) is zero-filled, scales included.
template <class C>
__device__ __forceinline__ void load_ds_mla_rows(uint32_t stage, const DecodeParams& p, int tile, int page) {
  static_assert(C::kRawDsMla && C::kSmemRowBytes == kDsMlaRowBytes, "raw rows, unpadded");
  constexpr int kChunks = kDsMlaRowBytes / 16, kThreadsPerToken = C::kThreadsPerToken;
  const int tok = threadIdx.x / kThreadsPerToken, first = threadIdx.x % kThreadsPerToken;
  const int slot = (tile * kBlockN + tok) & ((1 << p.page_shift) - 1);
  const uint8_t* row = p.kv + static_cast<long long>(page >= 0 ? page : 0) * p.page_stride +
                       static_cast<long long>(slot) * p.token_stride;
  const uint32_t dst = stage + tok * C::kSmemRowBytes;
#pragma unroll
  for (int i = 0; i < (kChunks + kThreadsPerToken - 1) / kThreadsPerToken; ++i) {
    const int chunk = i * kThreadsPerToken + first;
    if (chunk < kChunks) cp_async_16(dst + chunk * 16, row + chunk * 16, page >= 0 ? 16 : 0);
  }
}

struct NoDsMlaLoad {};  // plain rows: cp.async (load_kv.cuh)

template <class C>
struct DsMlaTileLoad {
  static_assert(!C::kFp8, "fp8_ds_mla rows are dequantised into the BF16 tile layout");
  static constexpr int kThreadsPerToken = C::kThreadsPerToken;
  // 16-byte chunks of a row: 32 of e4m3 (each 32 bytes once bf16), 8 of bf16 rope. Chunk i * kThreadsPerToken
  // + first goes to a token's thread `first`, so a token's threads read adjacent chunks together.
  static constexpr int kLatentChunks = kDimV / 16 / kThreadsPerToken;
  static constexpr int kRopeChunks = kRopeDim * 2 / 16 / kThreadsPerToken;
  static_assert(kLatentChunks * kThreadsPerToken == kDimV / 16 && kRopeChunks * kThreadsPerToken == kRopeDim * 2 / 16,
                "a token's chunks spread evenly over its threads");
  uint4 latent[kLatentChunks];
  uint4 rope[kRopeChunks];
  float4 scales;

  // This thread's share of its token of `tile` (page id `page`, -1 past the request or for an empty
  // entry: zeros, no load).
  __device__ __forceinline__ void fetch(const DecodeParams& p, int tile, int page) {
    const int tok = threadIdx.x / kThreadsPerToken, first = threadIdx.x % kThreadsPerToken;
    if (page < 0) {
#pragma unroll
      for (int i = 0; i < kLatentChunks; ++i) latent[i] = make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int i = 0; i < kRopeChunks; ++i) rope[i] = make_uint4(0, 0, 0, 0);
      scales = make_float4(0.f, 0.f, 0.f, 0.f);
      return;
    }
    const int slot = (tile * kBlockN + tok) & ((1 << p.page_shift) - 1);
    const uint8_t* row =
        p.kv + static_cast<long long>(page) * p.page_stride + static_cast<long long>(slot) * p.token_stride;
#pragma unroll
    for (int i = 0; i < kLatentChunks; ++i)
      latent[i] = __ldg(reinterpret_cast<const uint4*>(row) + i * kThreadsPerToken + first);
    scales = __ldg(reinterpret_cast<const float4*>(row + kDsMlaScaleOffset));
#pragma unroll
    for (int i = 0; i < kRopeChunks; ++i)
      rope[i] = __ldg(reinterpret_cast<const uint4*>(row + kDsMlaRopeOffset) + i * kThreadsPerToken + first);
  }

  // The fetched share, widened to bf16 (unscaled), into its row of the stage; the first thread of a
  // token writes its scales into the row's pad.
  __device__ __forceinline__ void store(uint32_t stage) const {
    const int tok = threadIdx.x / kThreadsPerToken, first = threadIdx.x % kThreadsPerToken;
    const uint32_t dst = stage + tok * C::kSmemRowBytes;
#pragma unroll
    for (int i = 0; i < kLatentChunks; ++i) {
      const int chunk = i * kThreadsPerToken + first;
      const uint32_t words[4] = {latent[i].x, latent[i].y, latent[i].z, latent[i].w};
      uint32_t out[8];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t lo, hi;
        e4m3x4_to_f16x4(words[k], lo, hi);
        const float2 a = unpack2<true>(lo), b = unpack2<true>(hi);
        out[2 * k] = pack2<false>(a.x, a.y);
        out[2 * k + 1] = pack2<false>(b.x, b.y);
      }
      st_shared_v4(dst + chunk * 32, out[0], out[1], out[2], out[3]);
      st_shared_v4(dst + chunk * 32 + 16, out[4], out[5], out[6], out[7]);
    }
    if (first == 0)
      st_shared_v4(dst + kScalesInRow<C>, __float_as_uint(scales.x), __float_as_uint(scales.y),
                   __float_as_uint(scales.z), __float_as_uint(scales.w));
#pragma unroll
    for (int i = 0; i < kRopeChunks; ++i)
      st_shared_v4(dst + kDimV * 2 + (i * kThreadsPerToken + first) * 16, rope[i].x, rope[i].y, rope[i].z, rope[i].w);
  }
};

// This warp's latent partial scores (its dim quarter, scale tile wd), scaled per token: accumulator
// columns of n-tile j are tokens 8 j + 2 t and 8 j + 2 t + 1.
template <class C>
__device__ __forceinline__ void scale_latent_scores(float (&sc)[C::kFragments][4][4], uint32_t stage,
                                                    const WarpRole& w) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float s0 = row_scale<C>(stage, 8 * j + 2 * w.t, w.wd), s1 = row_scale<C>(stage, 8 * j + 2 * w.t + 1, w.wd);
#pragma unroll
    for (int f = 0; f < C::kFragments; ++f) {
      sc[f][j][0] *= s0;
      sc[f][j][1] *= s1;
      sc[f][j][2] *= s0;
      sc[f][j][3] *= s1;
    }
  }
}

// This warp's P fragments times its scale tile per token, for P.V on the unscaled values: in A
// fragment kk, registers 0-1 hold tokens 16 kk + 2 t, + 1 and registers 2-3 the same 8 tokens on.
template <class C>
__device__ __forceinline__ void scale_p_fragments(uint32_t (&pf)[C::kFragments][2][4], uint32_t stage,
                                                  const WarpRole& w) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int tok = 16 * kk + 8 * half + 2 * w.t;
      const float s0 = row_scale<C>(stage, tok, w.wd), s1 = row_scale<C>(stage, tok + 1, w.wd);
#pragma unroll
      for (int f = 0; f < C::kFragments; ++f)
#pragma unroll
        for (int r = 2 * half; r < 2 * half + 2; ++r) {
          const float2 v = unpack2<false>(pf[f][kk][r]);
          pf[f][kk][r] = pack2<false>(v.x * s0, v.y * s1);
        }
    }
}

// Raw rows (FP8 tiles): this warp's scale tile per token as the f16 pairs that multiply its widened V
// B fragments of 16-token k-step kk, pairs[h] holding tokens 16 kk + 8 h + 2 t and + 1 (unused elsewhere).
struct VScales {
  uint32_t pairs[2];
};

template <class C>
__device__ __forceinline__ VScales v_scale_pairs(uint32_t stage, int kk, const WarpRole& w) {
  VScales vs;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int tok = 16 * kk + 8 * h + 2 * w.t;
    vs.pairs[h] = pack2<true>(row_scale<C>(stage, tok, w.wd), row_scale<C>(stage, tok + 1, w.wd));
  }
  return vs;
}

}  // namespace mla
