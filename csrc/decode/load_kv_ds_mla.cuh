// KV tiles from the fp8_ds_mla cache (DeepSeek-V3.2, GLM-5): rows of 656 bytes, 512 e4m3 latent values,
// four fp32 scales (scale j multiplies values 128 j .. 128 j + 127), then 64 bf16 rope values. They are
// dequantised on their way into shared memory, into the BF16 tile layout, so the BF16 kernel's QK^T,
// softmax and P.V run on them unchanged and Q stays in bf16 (as the models' reference kernels compute).
// A conversion sits between global and shared memory, so the copies go through registers: fetch()
// issues a tile's loads and store() converts and writes them one tile later, once they have landed;
// the tile's compute in between hides their latency.
#pragma once

#include <stdint.h>

#include "common/params.h"
#include "common/ptx.cuh"
#include "decode/tile_config.h"

namespace mla {

constexpr int kDsMlaScaleOffset = kDimV;                  // bytes: after the 512 e4m3 values
constexpr int kDsMlaRopeOffset = kDsMlaScaleOffset + 16;  // after the four fp32 scales
constexpr int kDsMlaRowBytes = kDsMlaRopeOffset + kRopeDim * 2;
static_assert(kDsMlaRowBytes == 656, "fp8_ds_mla rows are 656 bytes");

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

  // The fetched share, dequantised to bf16, into its row of the stage.
  __device__ __forceinline__ void store(uint32_t stage) const {
    const int tok = threadIdx.x / kThreadsPerToken, first = threadIdx.x % kThreadsPerToken;
    const uint32_t dst = stage + tok * C::kSmemRowBytes;
    const float scale[4] = {scales.x, scales.y, scales.z, scales.w};
#pragma unroll
    for (int i = 0; i < kLatentChunks; ++i) {
      const int chunk = i * kThreadsPerToken + first;  // 16 values, all in scale tile chunk / 8
      const float s = scale[chunk / 8];
      const uint32_t words[4] = {latent[i].x, latent[i].y, latent[i].z, latent[i].w};
      uint32_t out[8];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t lo, hi;
        e4m3x4_to_f16x4(words[k], lo, hi);
        const float2 a = unpack2<true>(lo), b = unpack2<true>(hi);
        out[2 * k] = pack2<false>(a.x * s, a.y * s);
        out[2 * k + 1] = pack2<false>(b.x * s, b.y * s);
      }
      st_shared_v4(dst + chunk * 32, out[0], out[1], out[2], out[3]);
      st_shared_v4(dst + chunk * 32 + 16, out[4], out[5], out[6], out[7]);
    }
#pragma unroll
    for (int i = 0; i < kRopeChunks; ++i)
      st_shared_v4(dst + kDimV * 2 + (i * kThreadsPerToken + first) * 16, rope[i].x, rope[i].y, rope[i].z, rope[i].w);
  }
};

}  // namespace mla
