// The end of a CTA's work: each warp normalises its 128 output dims of its rows by the row's 1 / sum
// (from OnlineSoftmax::publish) and writes them: with one split, bf16 output scaled by bmm2 and the
// LSE (natural log); with several, the normalised split partial (f16 for FP8 KV, fp32 for BF16) and
// its LSE (log2) for the merge (merge/).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common/params.h"
#include "common/ptx.cuh"
#include "decode/tile_config.h"

namespace mla {

template <class C>
__device__ __forceinline__ void write_output(const float (&acc)[C::kFragments][16][4], const float2* row_stats,
                                             const DecodeParams& p, int warp_row0, const WarpRole& w) {
  constexpr bool FP8 = C::kFp8;
  const float bmm2 = read_scale(p.bmm2_ptr, p.bmm2);
  // Read again here rather than held in registers through the main loop (v1's FP8 32-row kernel has
  // none to spare on sm_100a).
  const WorkItem item = work_item(p);
  const bool single = item.splits == 1;
#pragma unroll
  for (int f = 0; f < C::kFragments; ++f)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row0 + 16 * f + 8 * h + w.g;
      if (row >= p.rows) continue;
      const float2 stats = row_stats[local_row<C>(w, f, h)];
      const float inv = stats.x, lse2 = stats.y;
      const float out_scale = single ? inv * bmm2 : inv;
      const long long out_row =
          single ? (long long)item.b * p.rows + row : ((long long)item.first + item.split) * p.rows + row;
#pragma unroll
      for (int q = 0; q < (FP8 ? 8 : 16); ++q) {
        // FP8 tiles pair up (even dims, odd dims) into 4 consecutive dims; BF16 tiles hold 2.
        float v[4];
        int dim;
        if constexpr (FP8) {
          const float* ev = acc[f][2 * q];
          const float* od = acc[f][2 * q + 1];
          v[0] = ev[2 * h];
          v[1] = od[2 * h];
          v[2] = ev[2 * h + 1];
          v[3] = od[2 * h + 1];
          dim = w.wd * 128 + q * 16 + 4 * w.t;
        } else {
          v[0] = acc[f][q][2 * h];
          v[1] = acc[f][q][2 * h + 1];
          dim = w.wd * 128 + q * 8 + 2 * w.t;
        }
        constexpr int kVec = FP8 ? 4 : 2;
        if (single) {
          __nv_bfloat16* dst = p.out + out_row * kDimV + dim;
          uint32_t packed[2];
#pragma unroll
          for (int i = 0; i < kVec / 2; ++i) packed[i] = pack2<false>(v[2 * i] * out_scale, v[2 * i + 1] * out_scale);
          if constexpr (kVec == 4)
            *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);
          else
            *reinterpret_cast<uint32_t*>(dst) = packed[0];
        } else if constexpr (C::kF16Partials) {  // half the merge traffic of fp32
          __half* dst = static_cast<__half*>(p.part_o) + out_row * kDimV + dim;
          *reinterpret_cast<uint2*>(dst) =
              make_uint2(pack2<true>(v[0] * inv, v[1] * inv), pack2<true>(v[2] * inv, v[3] * inv));
        } else {
          float* dst = static_cast<float*>(p.part_o) + out_row * kDimV + dim;
          if constexpr (kVec == 4)
            *reinterpret_cast<float4*>(dst) = make_float4(v[0] * inv, v[1] * inv, v[2] * inv, v[3] * inv);
          else
            *reinterpret_cast<float2*>(dst) = make_float2(v[0] * inv, v[1] * inv);
        }
      }
      if (w.wd == 0 && w.t == 0) {
        if (!single)
          p.part_lse[out_row] = lse2;
        else if (p.lse != nullptr)
          p.lse[out_row] = lse2 * kLn2;
      }
    }
}

}  // namespace mla
