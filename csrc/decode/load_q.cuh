// Q of the CTA's rows. With one 16-row fragment per warp (RF == 1), each thread keeps its A
// fragments of Q in registers for the whole KV range (load_q_fragments). With more, the
// accumulators need those registers, so Q goes to shared memory (QTileLoad) and QK^T fetches it
// by ldmatrix. Rows are token-major (row = query token * heads + head); rows past the problem read
// as zeros.
#pragma once

#include <stdint.h>

#include "common/params.h"
#include "common/ptx.cuh"
#include "decode/tile_config.h"

namespace mla {

// Start of Q row `row` of request b (query token row / heads, head row % heads): its latent part
// and its rope part (two tensors, or views of one).
struct QRow {
  const uint8_t* nope;
  const uint8_t* pe;
};

__device__ __forceinline__ QRow q_row(const DecodeParams& p, int b, int row) {
  const int token = token_of_row(p, row), head = row - token * p.heads;
  return {p.q_nope + b * p.q_nope_stride[0] + token * p.q_nope_stride[1] + head * p.q_nope_stride[2],
          p.q_pe + b * p.q_pe_stride[0] + token * p.q_pe_stride[1] + head * p.q_pe_stride[2]};
}
// Byte `byte` of the 576-element row: latent bytes first, then rope.
template <class C>
__device__ __forceinline__ const uint8_t* q_byte(const QRow& r, int byte) {
  constexpr int kNopeBytes = kDimV * C::kElem;
  return byte < kNopeBytes ? r.nope + byte : r.pe + (byte - kNopeBytes);
}

struct NoQTileLoad {};  // Q in registers

// Q of the CTA's rows into shared memory (FP8 tiles of 32 rows; rows past the problem are zero).
// Warp w takes rows 8w..8w+7: lane l loads the latent 16-byte chunk l of each of them and rope
// chunk l % 4 of row 8w + l / 4, so each row's address is worked out once per warp.
// As stored, Q is e4m3. Widened to f16, the 32 k of each e4m3 chunk are permuted so that ldmatrix
// hands every thread the k that F2FP unpacks from its K registers: bytes 4t..4t+3 of a 16-byte
// half become f16 positions (2t, 2t+1, 8+2t, 9+2t).
// Two phases, so that the global loads go out first, before the seq_len -> page id -> KV chain:
// issue() loads (cp.async: straight into shared memory; f16: into registers), finish() widens and
// stores (f16 only).
template <class C>
struct QTileLoad {
  static constexpr int kRows = 8, kNopeChunks16 = kDimV / 16, kRopeChunks16 = kRopeDim / 16;
  static_assert(C::kElem == 1 && C::kTileRows == kRows * C::kWarps, "QTileLoad maps 8 FP8 rows to a warp");
  static_assert(kNopeChunks16 == 32 && kRows * kRopeChunks16 == 32, "one latent chunk per lane and row");
  // Tile row and 16-byte column of this lane's chunks: kRows latent ones, then one rope.
  int row[kRows + 1], col[kRows + 1];
  uint4 raw[C::kQkF16 ? kRows + 1 : 1];

  __device__ __forceinline__ void issue(uint32_t q_smem, const DecodeParams& p, int b, int row0) {
    const int lane = threadIdx.x & 31, first = (threadIdx.x >> 5) * kRows;
    const uint8_t* src[kRows + 1];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row[r] = first + r;
      col[r] = lane;
      src[r] = row0 + row[r] < p.rows ? q_row(p, b, row0 + row[r]).nope + lane * 16 : nullptr;
    }
    row[kRows] = first + lane / kRopeChunks16;
    col[kRows] = kNopeChunks16 + lane % kRopeChunks16;
    src[kRows] = row0 + row[kRows] < p.rows ? q_row(p, b, row0 + row[kRows]).pe + lane % kRopeChunks16 * 16 : nullptr;
#pragma unroll
    for (int i = 0; i <= kRows; ++i) {
      if constexpr (C::kQkF16) {
        raw[i] = src[i] ? __ldg(reinterpret_cast<const uint4*>(src[i])) : make_uint4(0u, 0u, 0u, 0u);
      } else {
        cp_async_16(q_smem + row[i] * C::kSmemQRowBytes + col[i] * 16, src[i] ? src[i] : p.q_nope, src[i] ? 16 : 0);
      }
    }
  }

  // f16: a 16-byte chunk is one k16 half; its four words' low pairs fill the first 16 bytes of
  // the f16 half, high pairs the rest.
  __device__ __forceinline__ void finish(uint32_t q_smem) const {
    if constexpr (C::kQkF16) {
#pragma unroll
      for (int i = 0; i <= kRows; ++i) {
        const uint32_t dst = q_smem + row[i] * C::kSmemQRowBytes + col[i] * 32;
        const uint32_t w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) e4m3x4_to_f16x4(w[k], lo[k], hi[k]);
        st_shared_v4(dst, lo[0], lo[1], lo[2], lo[3]);
        st_shared_v4(dst + 16, hi[0], hi[1], hi[2], hi[3]);
      }
    }
  }
};

// Q of an FP8 tile over raw fp8_ds_mla rows (bf16 queries): the latent part widened to f16 into shared
// memory in QTileLoad's f16 k order (of each 16 values, f16 positions 2k, 2k + 1 take values 4k, 4k + 1,
// positions 8 + 2k, 9 + 2k take 4k + 2, 4k + 3), which matches the K registers QK^T widens; bf16 -> f16
// is exact within f16's range. Warp w takes rows 8w..8w+7, lane l values 16l..16l+15 of each. The rope
// part stays bf16, in registers (load_q_rope_fragments). issue() loads, finish() widens and stores.
template <class C>
struct DsMlaQTileLoad {
  static constexpr int kRows = 8;
  static_assert(C::kRawDsMla && C::kTileRows == kRows * C::kWarps && kDimV == 16 * 32, "16 values a lane and row");
  uint4 raw[kRows][2];

  __device__ __forceinline__ void issue(uint32_t /*q_smem*/, const DecodeParams& p, int b, int row0) {
    const int lane = threadIdx.x & 31, first = (threadIdx.x >> 5) * kRows;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const bool valid = row0 + first + r < p.rows;
      const uint4* src = reinterpret_cast<const uint4*>(q_row(p, b, row0 + first + r).nope + lane * 32);
#pragma unroll
      for (int h = 0; h < 2; ++h) raw[r][h] = valid ? __ldg(src + h) : make_uint4(0u, 0u, 0u, 0u);
    }
  }

  __device__ __forceinline__ void finish(uint32_t q_smem) const {
    const int lane = threadIdx.x & 31, first = (threadIdx.x >> 5) * kRows;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const uint32_t w[8] = {raw[r][0].x, raw[r][0].y, raw[r][0].z, raw[r][0].w,
                             raw[r][1].x, raw[r][1].y, raw[r][1].z, raw[r][1].w};
      uint32_t f16[8];  // word k of the bf16 values -> f16 word (k even: k / 2, k odd: 4 + k / 2)
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float2 v = unpack2<false>(w[k]);
        f16[(k & 1) * 4 + k / 2] = pack2<true>(v.x, v.y);
      }
      const uint32_t dst = q_smem + (first + r) * C::kSmemQRowBytes + lane * 32;
      st_shared_v4(dst, f16[0], f16[1], f16[2], f16[3]);
      st_shared_v4(dst + 16, f16[4], f16[5], f16[6], f16[7]);
    }
  }
};

// Raw fp8_ds_mla rows: this thread's bf16 A fragments of the rope chunk of its warp (dims 16 wd..16 wd
// + 15 of q_pe) for QK^T's last step of each tile, loaded once.
template <class C>
__device__ __forceinline__ void load_q_rope_fragments(uint32_t (&qf)[C::kQRegFragments][C::kQRegChunks][4],
                                                      const DecodeParams& p, int b, int warp_row0, const WarpRole& w) {
  static_assert(C::kRawDsMla && C::kQRegFragments == C::kFragments, "a rope fragment a 16-row fragment");
#pragma unroll
  for (int f = 0; f < C::kFragments; ++f)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row0 + 16 * f + 8 * h + w.g;
      const uint8_t* pe = q_row(p, b, row).pe + 32 * w.wd + 4 * w.t;
#pragma unroll
      for (int half = 0; half < 2; ++half)
        qf[f][0][2 * half + h] = row < p.rows ? __ldg(reinterpret_cast<const uint32_t*>(pe + 16 * half)) : 0u;
    }
}

// RF == 1: this thread's A fragments of Q (rows warp_row0 + 8 h + g, K bytes 4t.. of each 16-byte
// half of each of its QK^T chunks), loaded once.
template <class C>
__device__ __forceinline__ void load_q_fragments(uint32_t (&qf)[C::kQRegFragments][C::kQRegChunks][4],
                                                 const DecodeParams& p, int b, int warp_row0, const WarpRole& w) {
  const bool has_rope = w.wd < C::kRopeChunks;
#pragma unroll
  for (int f = 0; f < C::kFragments; ++f)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row0 + 16 * f + 8 * h + w.g;
      const QRow r = q_row(p, b, row);
#pragma unroll
      for (int s = 0; s < C::kQkChunks; ++s)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const bool valid = row < p.rows && (s < C::kNopeChunks || has_rope);
          const uint8_t* src = q_byte<C>(r, qk_chunk_byte<C>(w.wd, s) + 16 * half + 4 * w.t);
          qf[f][s][2 * half + h] = valid ? __ldg(reinterpret_cast<const uint32_t*>(src)) : 0u;
        }
    }
}

}  // namespace mla
