// The two matrix products of a KV tile, one warp step at a time, so the main loop can interleave
// the QK^T of one tile with the P.V of the previous one.
//   QK^T: each warp multiplies its rows by a quarter of the 576 dims (partial scores, summed across
//         the four warps in softmax.cuh). FP8 uses m16n8k32 e4m3 (QMMA), BF16 m16n8k16. Where e4m3
//         mma.sync is emulated (sm_90), Q is widened to f16 once and K per step (kQkF16).
//   P.V:  P arrives as A fragments (ldmatrix). BF16 V feeds m16n8k16 bf16 via ldmatrix.trans. FP8 V
//         is widened exactly to f16 (ldmatrix.trans on byte pairs + prmt + cvt.f16x2.e4m3x2) and
//         multiplied with f16 P: P in e4m3 would cost ~4% relative error. With kPvF16Acc each
//         16-token k-step sums in f16 (P stored scaled down by kPvF16Scale) before it joins the fp32 O.
#pragma once

#include <stdint.h>

#include "common/ptx.cuh"
#include "decode/load_kv_ds_mla.cuh"
#include "decode/tile_config.h"

namespace mla {

// Accumulator arrays (O and the scores) start at zero.
template <int A, int B, int N>
__device__ __forceinline__ void zero_fill(float (&x)[A][B][N]) {
#pragma unroll
  for (int a = 0; a < A; ++a)
#pragma unroll
    for (int i = 0; i < B; ++i)
#pragma unroll
      for (int n = 0; n < N; ++n) x[a][i][n] = 0.f;
}

// One k16 step of QK^T on K widened from e4m3 to f16 (byte `k_byte` of the K rows, 16 values) against
// f16 Q (byte `q_byte` of its rows, in QTileLoad's k order). One ldmatrix.x4 takes the step of all 32
// tokens (matrix j = tokens 8j..8j+7); register j holds bytes 4t..4t+3, whose two f16 pairs are B.
template <class C>
__device__ __forceinline__ void qk_f16_step(float (&sc)[C::kFragments][4][4], uint32_t stage, int k_byte,
                                            const WarpRole& w, uint32_t q_smem, int q_byte) {
  constexpr int RF = C::kFragments;
  uint32_t kb[4];
  ldmatrix_x4(kb, stage + w.lane * C::kSmemRowBytes + k_byte);
  uint32_t qa[RF][4];
#pragma unroll
  for (int f = 0; f < RF; ++f) ldmatrix_a<C>(qa[f], w, q_smem, C::kSmemQRowBytes, f, q_byte);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t lo, hi;
    e4m3x4_to_f16x4(kb[j], lo, hi);
#pragma unroll
    for (int f = 0; f < RF; ++f) mma_f16(sc[f][j], qa[f], lo, hi);
  }
}

// One k16 step of QK^T on bf16 K (byte `k_byte` of the K rows, 32 bytes) against Q's A fragments qa.
template <class C>
__device__ __forceinline__ void qk_bf16_step(float (&sc)[C::kFragments][4][4], uint32_t stage, int k_byte,
                                             const WarpRole& w, const uint32_t (&qa)[C::kFragments][4]) {
#pragma unroll
  for (int jp = 0; jp < 2; ++jp) {  // n-tile pairs (16 tokens)
    const int mi = w.lane >> 3;
    const int tok = 16 * jp + 8 * (mi >> 1) + (w.lane & 7);
    uint32_t kb[4];
    ldmatrix_x4(kb, stage + tok * C::kSmemRowBytes + k_byte + 16 * (mi & 1));
#pragma unroll
    for (int f = 0; f < C::kFragments; ++f) {
      mma_bf16(sc[f][2 * jp], qa[f], kb[0], kb[1]);
      mma_bf16(sc[f][2 * jp + 1], qa[f], kb[2], kb[3]);
    }
  }
}

// Step i of QK^T over this warp's dims: partial scores sc[f][n-tile] of its rows with the tile's 32
// tokens, K fragments via ldmatrix; Q from registers (qf) or shared memory (q_smem).
template <class C>
__device__ __forceinline__ void qk_step(float (&sc)[C::kFragments][4][4], uint32_t stage, int i, const WarpRole& w,
                                        uint32_t q_smem, const uint32_t (&qf)[C::kQRegFragments][C::kQRegChunks][4]) {
  constexpr int RF = C::kFragments;
  if constexpr (C::kRawDsMla) {
    // Raw fp8_ds_mla rows: 8 f16 steps over the warp's scale tile of e4m3 values, then its bf16 rope
    // chunk (cache bytes 528 + 32 wd) against the rope fragments held in registers.
    if (i < C::kLatentQkSteps) {
      const int k_byte = w.wd * (kDimV / 4) + 16 * i;
      qk_f16_step<C>(sc, stage, k_byte, w, q_smem, 2 * k_byte);
    } else {
      uint32_t qa[RF][4];
#pragma unroll
      for (int f = 0; f < RF; ++f)
#pragma unroll
        for (int r = 0; r < 4; ++r) qa[f][r] = qf[f][0][r];
      qk_bf16_step<C>(sc, stage, kDsMlaRopeOffset + 32 * w.wd, w, qa);
    }
  } else if constexpr (C::kQkF16) {
    // k16 steps of 16 bytes: 36 per row (latent and rope alike), 9 per warp.
    const int step = w.wd * C::kF16StepsPerWarp + i;
    qk_f16_step<C>(sc, stage, 16 * step, w, q_smem, 32 * step);
  } else {
    if (i == C::kNopeChunks && !(w.wd < C::kRopeChunks)) return;  // rope chunks: warps wd < kRopeChunks
    uint32_t qa[RF][4];
#pragma unroll
    for (int f = 0; f < RF; ++f) {
      if constexpr (C::kQInSmem)
        ldmatrix_a<C>(qa[f], w, q_smem, C::kSmemQRowBytes, f, qk_chunk_byte<C>(w.wd, i));
      else
#pragma unroll
        for (int r = 0; r < 4; ++r) qa[f][r] = qf[f][i][r];
    }
    if constexpr (C::kFp8) {
#pragma unroll
      for (int jp = 0; jp < 2; ++jp) {  // n-tile pairs (16 tokens)
        const int mi = w.lane >> 3;
        const int tok = 16 * jp + 8 * (mi >> 1) + (w.lane & 7);
        uint32_t kb[4];
        ldmatrix_x4(kb, stage + tok * C::kSmemRowBytes + qk_chunk_byte<C>(w.wd, i) + 16 * (mi & 1));
#pragma unroll
        for (int f = 0; f < RF; ++f) {
          mma_e4m3(sc[f][2 * jp], qa[f], kb[0], kb[1]);
          mma_e4m3(sc[f][2 * jp + 1], qa[f], kb[2], kb[3]);
        }
      }
    } else {
      qk_bf16_step<C>(sc, stage, qk_chunk_byte<C>(w.wd, i), w, qa);
    }
  }
}

// FP8 V of k-step kk (16 tokens) and dim group q (32 of this warp's dims), by x4.trans over byte pairs:
// register r holds tokens (2t, 2t+1) of dims (2g, 2g+1) of its 16-byte column.
template <class C>
__device__ __forceinline__ void load_fp8_v(uint32_t (&vr)[4], uint32_t stage, int kk, int q, const WarpRole& w) {
  const int mi = w.lane >> 3;
  const int tok = 16 * kk + 8 * (mi & 1) + (w.lane & 7);
  ldmatrix_x4_trans(vr, stage + tok * C::kSmemRowBytes + w.wd * 128 + q * 32 + 16 * (mi >> 1));
}

// Half `half` of load_fp8_v's registers (tokens 2t.. or 8 + 2t..) as the f16 B fragments of the even
// and of the odd dims: prmt splits them, cvt widens exactly.
__device__ __forceinline__ void widen_fp8_v(const uint32_t (&vr)[4], int half, uint32_t (&even)[2],
                                            uint32_t (&odd)[2]) {
  e4m3x4_to_f16x4(__byte_perm(vr[2 * half], 0, 0x3120), even[0], odd[0]);
  e4m3x4_to_f16x4(__byte_perm(vr[2 * half + 1], 0, 0x3120), even[1], odd[1]);
}

// Step i of O += P.V over this warp's 128 output dims. FP8 accumulators come in (even dims, odd
// dims) pairs of n-tiles (epilogue.cuh puts them back in order); BF16 ones are in dim order. Raw
// fp8_ds_mla rows: the widened V times its tokens' scales (v_scale_pairs of step i's k-step), in f16.
template <class C>
__device__ __forceinline__ void pv_step(float (&acc)[C::kFragments][16][4], const uint32_t (&pf)[C::kFragments][2][4],
                                        uint32_t stage, int i, const WarpRole& w, const VScales& vs) {
  constexpr int RF = C::kFragments;
  constexpr int kPerK = C::kPvSteps / 2;
  const int kk = i / kPerK, q = i % kPerK;
  if constexpr (C::kFp8) {
    uint32_t vr[4];
    load_fp8_v<C>(vr, stage, kk, q, w);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t even[2], odd[2];
      widen_fp8_v(vr, half, even, odd);
      if constexpr (C::kRawDsMla) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          even[r] = mul_f16x2(even[r], vs.pairs[r]);
          odd[r] = mul_f16x2(odd[r], vs.pairs[r]);
        }
      }
#pragma unroll
      for (int f = 0; f < RF; ++f) {
        if constexpr (C::kPvF16Acc) {
          mma_f16_acc16(acc[f][q * 4 + half * 2], pf[f][kk], even[0], even[1], C::kPvF16Scale);
          mma_f16_acc16(acc[f][q * 4 + half * 2 + 1], pf[f][kk], odd[0], odd[1], C::kPvF16Scale);
        } else {
          mma_f16(acc[f][q * 4 + half * 2], pf[f][kk], even[0], even[1]);
          mma_f16(acc[f][q * 4 + half * 2 + 1], pf[f][kk], odd[0], odd[1]);
        }
      }
    }
  } else {
    const int mi = w.lane >> 3;
    const int tok = 16 * kk + 8 * (mi & 1) + (w.lane & 7);
    uint32_t vr[4];
    ldmatrix_x4_trans(vr, stage + tok * C::kSmemRowBytes + (w.wd * 128 + q * 16 + 8 * (mi >> 1)) * 2);
#pragma unroll
    for (int f = 0; f < RF; ++f) {
      mma_bf16(acc[f][2 * q], pf[f][kk], vr[0], vr[1]);
      mma_bf16(acc[f][2 * q + 1], pf[f][kk], vr[2], vr[3]);
    }
  }
}

// FP8 P.V with f16 sums (kPvF16Acc) over a whole 32-token tile for dim group q (of kPvSteps / 2):
// both 16-token k-steps chained in f16 before one fp32 add, half the unpacking and adds of pv_step.
// 32 * 2^8 * 2^-6 * 448 = 57344 < 65504 (the bound of tile_config.h, over two k-steps).
template <class C>
__device__ __forceinline__ void pv_tile_f16(float (&acc)[C::kFragments][16][4],
                                            const uint32_t (&pf)[C::kFragments][2][4], uint32_t stage, int q,
                                            const WarpRole& w) {
  static_assert(C::kFp8 && C::kPvF16Acc, "f16 sums of FP8 P.V only");
  constexpr int RF = C::kFragments;
  uint32_t sums[RF][4][2] = {};  // per fragment: n-tiles (half, even | odd) of dim group q
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    uint32_t vr[4];
    load_fp8_v<C>(vr, stage, kk, q, w);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t even[2], odd[2];
      widen_fp8_v(vr, half, even, odd);
#pragma unroll
      for (int f = 0; f < RF; ++f) {
        mma_f16_chain(sums[f][half * 2], pf[f][kk], even[0], even[1]);
        mma_f16_chain(sums[f][half * 2 + 1], pf[f][kk], odd[0], odd[1]);
      }
    }
  }
#pragma unroll
  for (int f = 0; f < RF; ++f)
#pragma unroll
    for (int n = 0; n < 4; ++n) add_f16_sums(acc[f][q * 4 + n], sums[f][n], C::kPvF16Scale);
}

// Step i of a tile's P.V (i < kPvSteps): pv_step, or where FP8 P.V sums in f16 a whole tile of dim
// group i in pv_tile_f16 for i < kPvSteps / 2 (the later steps have nothing left to do).
template <class C>
__device__ __forceinline__ void pv_part(float (&acc)[C::kFragments][16][4], const uint32_t (&pf)[C::kFragments][2][4],
                                        uint32_t stage, int i, const WarpRole& w, const VScales& vs = {}) {
  if constexpr (C::kPvF16Acc) {
    if (i < C::kPvSteps / 2) pv_tile_f16<C>(acc, pf, stage, i, w);
  } else if (i < C::kPvSteps) {
    pv_step<C>(acc, pf, stage, i, w, vs);
  }
}

}  // namespace mla
