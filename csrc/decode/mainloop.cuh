// The decode kernel: paged MLA decode on warp-level mma.sync, one source for sm_120a (native FP8
// QMMA), sm_90a and sm_89. A CTA owns the rows of one tile of a request (tile_config.h) and one
// split of its KV tiles (split-KV: the host's split count or the GPU's plan; merge/ combines the splits).
//
//   prologue   Q (load_q.cuh) and the first pages go out before seq_len is known;
//   main loop  KV tiles of 32 tokens stream through a cp.async ring (load_kv.cuh); per tile: QK^T
//              (qk_pv.cuh), the online softmax (softmax.cuh), P.V (qk_pv.cuh). With a three-stage
//              ring (FP8; BF16 at two row groups on sm_90) the tiles are software-pipelined: QK^T of
//              tile t + 1 is interleaved with P.V of tile t. Two stages run QK^T, softmax, P.V in turn.
//              fp8_ds_mla rows come through registers instead of cp.async (load_kv_ds_mla.cuh);
//   epilogue   normalise and write the output or the split partial (epilogue.cuh).
// KV rows in shared memory are padded by 16 bytes so that ldmatrix is free of bank conflicts.
// Shared memory stays under SM120's 99 KB per block (the sm_90-only f16-Q variant takes 112 KB,
// two CTAs per SM on SM90).
#pragma once

#include <stdint.h>

#include <type_traits>

#include "common/params.h"
#include "common/ptx.cuh"
#include "decode/epilogue.cuh"
#include "decode/load_kv.cuh"
#include "decode/load_kv_ds_mla.cuh"
#include "decode/load_q.cuh"
#include "decode/qk_pv.cuh"
#include "decode/softmax.cuh"
#include "decode/tile_config.h"

namespace mla {

template <bool FP8, int ROW_GROUPS, int RF, KvFormat KV = KvFormat::kPlain>
__global__ void __launch_bounds__(TileConfig<FP8, ROW_GROUPS, RF, KV>::kThreads)
    mla_decode_kernel(const __grid_constant__ DecodeParams p) {
  using C = TileConfig<FP8, ROW_GROUPS, RF, KV>;
  // fp8_ds_mla rows (load_kv_ds_mla.cuh): scaled after the products; on BF16 tiles they go through
  // registers, a tile fetched one tile before it is stored into the stage its cp.async copies would have
  // filled; FP8 tiles copy them as they are.
  constexpr bool kDsMla = KV == KvFormat::kDsMla;
  constexpr bool kDsMlaRegs = kDsMla && !C::kRawDsMla;
  [[maybe_unused]] std::conditional_t<kDsMlaRegs, DsMlaTileLoad<C>, NoDsMlaLoad> ds_load;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t kv_smem = smem_u32(smem);
  float* scores = reinterpret_cast<float*>(smem + C::kScoresOffset);

  // Plain locals first (not a helper returning WarpRole): the compiler then recomputes them from
  // threadIdx.x near their uses, which keeps the FP8 two-fragment kernel within 255 registers
  // without spills on sm_100a.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wd = warp & 3, wr = warp >> 2;
  const int g = lane >> 2, t = lane & 3;
  const WarpRole w{lane, wd, wr, g, t};

  pdl_wait();
  pdl_launch_dependents();
  const WorkItem item = work_item(p);
  if (!item.valid) return;
  const int b = item.b, split = item.split;

  // The global reads that do not depend on seq_len go out first: Q, and the page ids of this
  // split's first tiles as if seq_len were max_seq_len (right for the longest requests; checked
  // below, re-read where wrong). Then seq_len -> page id -> KV is one round trip shorter.
  const uint32_t q_smem = kv_smem + C::kQOffset;
  using QLoad = std::conditional_t<C::kRawDsMla, DsMlaQTileLoad<C>, QTileLoad<C>>;
  [[maybe_unused]] std::conditional_t<C::kQInSmem, QLoad, NoQTileLoad> q_load;
  if constexpr (C::kQInSmem) q_load.issue(q_smem, p, b, blockIdx.x * C::kTileRows);
  const TableRow table = table_row(p, b);
  const int* bt_row = table.ids;
  const int guess_len = min(p.max_seq_len, table.entries << p.page_shift);
  const int guess_begin = split * tiles_per_split(guess_len, item.splits);
  int guessed_page[C::kStages - 1];
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) guessed_page[s] = page_of<C>(p, bt_row, guess_begin + s, guess_len);

  const int seq_len = request_len(p, b, table.entries);
  const SplitTiles tiles = split_tiles(seq_len, split, item.splits);
  const int tile_begin = tiles.begin, tile_end = tiles.end;
  // Page id of this thread's token in tile tile_begin + s: the guess where it read the right entry.
  auto first_page = [&](int s) {
    const int pos = kv_pos<C>(tile_begin + s);
    if (tile_begin == guess_begin && (pos < guess_len || pos >= seq_len)) return pos < seq_len ? guessed_page[s] : -1;
    return page_of<C>(p, bt_row, tile_begin + s, seq_len);
  };

  // Rows of this thread: fragment f, half h -> row = warp_row0 + 16 f + 8 h + g.
  const int warp_row0 = blockIdx.x * C::kTileRows + w.wr * C::kRowsPerWarp;
  // Causal over the q_len new tokens: row r sees positions < seq_len - q_len + r / heads + 1, so
  // only tiles reaching past seq_len - q_len need a mask (rows past the problem have Q = 0).
  const int first_masked = first_masked_position(p, seq_len);
  const int* const sparse_ids = sparse_list<C>(p, bt_row);

  const uint32_t p_smem = kv_smem + C::kPOffset;
  float* corr_smem = reinterpret_cast<float*>(smem + C::kCorrOffset);
  uint32_t qf[C::kQRegFragments][C::kQRegChunks][4];
  if constexpr (!C::kQInSmem) load_q_fragments<C>(qf, p, b, warp_row0, w);
  if constexpr (C::kRawDsMla) load_q_rope_fragments<C>(qf, p, b, warp_row0, w);

  const float scale_log2 = read_scale(p.bmm1_ptr, p.bmm1) * kLog2e;
  float acc[RF][16][4];
  zero_fill(acc);
  OnlineSoftmax<C> softmax(wr * C::kRowsPerWarp + wd * C::kSoftRows,
                           reinterpret_cast<float*>(smem + C::kExactSumOffset), lane);

#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if constexpr (kDsMlaRegs) {
      if (tile_begin + s < tile_end) {
        ds_load.fetch(p, tile_begin + s, first_page(s));
        ds_load.store(kv_smem + s * C::kStageBytes);
      }
    } else if (tile_begin + s < tile_end) {
      load_kv_tile<C>(kv_smem + s * C::kStageBytes, p, tile_begin + s, first_page(s));
    }
    // Q joins the first tile's group (cp.async), or is widened to f16 while the tiles load.
    if constexpr (C::kQInSmem) {
      if (s == 0) q_load.finish(q_smem);
    }
    cp_async_commit();
  }
  int next_page = page_of<C>(p, bt_row, tile_begin + C::kStages - 1, seq_len);
  // fp8_ds_mla: the tile after the prologue's is fetched now, stored at the first tile's refill.
  if constexpr (kDsMlaRegs) {
    if (tile_begin + C::kStages - 1 < tile_end) ds_load.fetch(p, tile_begin + C::kStages - 1, next_page);
    next_page = page_of<C>(p, bt_row, tile_begin + C::kStages, seq_len);
  }
  // Ring positions (byte offsets) of the tile read now and of the tile loaded now, rotated by
  // compare-and-wrap rather than a modulo.
  uint32_t read_off = 0, fill_off = (C::kStages - 1) * C::kStageBytes;
  auto advance = [](uint32_t off) {
    return off + C::kStageBytes == C::kStages * C::kStageBytes ? 0u : off + C::kStageBytes;
  };
  auto load_ahead = [&](int tile) {  // tile + kStages - 1 into the stage freed last
    const int next = tile + C::kStages - 1;
    if constexpr (kDsMlaRegs) {  // tile + kStages - 1 from registers; the one after into them
      if (next < tile_end) ds_load.store(kv_smem + fill_off);
      if (next + 1 < tile_end) ds_load.fetch(p, next + 1, next_page);
      next_page = page_of<C>(p, bt_row, next + 2, seq_len);
    } else {
      if (next < tile_end) load_kv_tile<C>(kv_smem + fill_off, p, next, next_page);
      cp_async_commit();
      next_page = page_of<C>(p, bt_row, next + 1, seq_len);  // consumed next iteration
    }
    fill_off = advance(fill_off);
  };

  // With three stages the tiles are software-pipelined, two barriers per tile: QK^T of tile t + 1
  // runs interleaved with P.V of tile t (two independent MMA chains per warp hide each other's
  // latency); the refill goes out after the score barrier (its stage was last read by the previous
  // P.V) and the next tile is waited for at the barrier before P.V, a whole tile after it was
  // issued. With two stages the refilled stage is the one this tile's P.V reads, so each tile
  // starts with a barrier of its own and runs QK^T, softmax, P.V in turn.
  constexpr bool kPipelined = C::kStages >= 3;
  float sc[RF][4][4];
  // QK^T step i of the tile in `stage`. fp8_ds_mla: the latent partial scores are scaled per token
  // before the rope step.
  auto qk_tile_step = [&](uint32_t stage, int i) {
    if constexpr (kDsMla) {
      if (i == C::kLatentQkSteps) scale_latent_scores<C>(sc, stage, w);
    }
    qk_step<C>(sc, stage, i, w, q_smem, qf);
  };
  if constexpr (kPipelined) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    zero_fill(sc);
    if (tile_begin < tile_end) {
#pragma unroll
      for (int i = 0; i < C::kQkSteps; ++i) {
        qk_tile_step(kv_smem, i);
      }
    }
  }

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const uint32_t stage = kv_smem + read_off;
    read_off = advance(read_off);
    if constexpr (!kPipelined) {
      cp_async_wait<C::kStages - 2>();
      __syncthreads();  // this tile landed for all; every warp is done with the stage refilled next
      load_ahead(tile);
      zero_fill(sc);
#pragma unroll
      for (int i = 0; i < C::kQkSteps; ++i) {
        qk_tile_step(stage, i);
      }
    }

    store_partial_scores<C>(scores, sc, w);
    __syncthreads();  // partial scores complete; every warp is past the previous tile's P.V
    if constexpr (kPipelined) load_ahead(tile);
    softmax.update(scores, p, tile, first_masked, seq_len, scale_log2, p_smem, corr_smem, w, sparse_ids);
    if constexpr (kPipelined) cp_async_wait<C::kStages - 2>();  // the next tile, for its QK^T
    __syncthreads();                                            // P and the rescale factors complete

    rescale_accumulators<C>(acc, corr_smem, w);
    uint32_t pf[RF][2][4];  // P as A fragments: [f][k16 step][reg]
    [[maybe_unused]] VScales vs;
    auto load_p = [&](int kk) {
#pragma unroll
      for (int f = 0; f < RF; ++f) ldmatrix_a<C>(pf[f][kk], w, p_smem, C::kPRowBytes, f, kk * 32);
      if constexpr (C::kRawDsMla) vs = v_scale_pairs<C>(stage, kk, w);
    };
    // Raw fp8_ds_mla rows: each 16-token k-step's P fragments and V scales are read as P.V reaches it
    // (step kPvSteps / 2 starts the second), which keeps the registers for the rope step's Q.
    constexpr int kLateK = C::kRawDsMla ? C::kPvSteps / 2 : -1;
    load_p(0);
    if constexpr (!C::kRawDsMla) load_p(1);
    if constexpr (kDsMlaRegs) scale_p_fragments<C>(pf, stage, w);

    // O += P.V; in the pipeline, interleaved step by step with QK^T of the next tile.
    if (kPipelined && tile + 1 < tile_end) {
      const uint32_t next_stage = kv_smem + read_off;
      zero_fill(sc);
#pragma unroll
      for (int i = 0; i < (C::kQkSteps > C::kPvSteps ? C::kQkSteps : C::kPvSteps); ++i) {
        if (i < C::kQkSteps) qk_tile_step(next_stage, i);
        if (i == kLateK) load_p(1);
        pv_part<C>(acc, pf, stage, i, w, vs);
      }
    } else {
#pragma unroll
      for (int i = 0; i < C::kPvSteps; ++i) {
        if (i == kLateK) load_p(1);
        pv_part<C>(acc, pf, stage, i, w, vs);
      }
    }
  }
  cp_async_wait<0>();

  // The row owners publish 1 / sum and the LSE in the score buffer (the last tile's sums are done),
  // then each warp normalises and writes its dims.
  float2* row_stats = reinterpret_cast<float2*>(scores);
  softmax.publish(row_stats, w);
  __syncthreads();
  write_output<C>(acc, row_stats, p, warp_row0, w);
}

}  // namespace mla
