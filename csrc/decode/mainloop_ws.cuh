// The warp-specialized decode kernel: FP8 at 32 rows (the 128-head and MTP shapes) and 16 rows (up to
// 16 heads at q_len 1), BF16 at 16 rows and at 32 in two row groups (decode/arch_traits.h says where each
// runs). The CTA holds three roles on the same tile layout as mainloop.cuh (tile_config.h), each of
// the math roles 4 x row groups warps (a warp per dim quarter of its row group):
//
//   S warps        Q (in shared memory for FP8 at 32 rows, else in registers), QK^T by dim quarter,
//                  the partial-score exchange (named barrier 1, S warps only) and the online softmax;
//                  P and the rescale factors go into one of two buffers, handed over with an mbarrier
//                  (p_full);
//   O warps        P.V by dim quarter into the accumulators, the epilogue;
//   loader         four warps: the page ids and the KV cp.async ring, kStages tiles ahead; it hands
//                  most of its registers to the other roles (setmaxnreg, which takes whole warpgroups).
//
// So the softmax and the score exchange run while the O warps multiply P.V of the tile before, and
// neither waits on the loads' address arithmetic or the block table: the loader's copies land
// behind both. On SM120 one CTA fits an SM (99 KB of shared memory per block), so this overlap is what
// keeps its tensor pipe busy; mainloop.cuh's warps all stop together at every barrier.
//
// Hand-overs (mbarriers, parity-tracked by the tile's index i from the split's first tile; the ring has
// kStages stages, 3 for FP8 and 2 for BF16, whose 37 KB stages leave no room for a third in 99 KB):
//   kv_full[i % kStages]   loader -> S: tile i landed (each loader thread's arrival fires when its
//                          copies have; the S warps' arrival on p_full passes it on to the O warps);
//   p_full[i & 1]          S -> O: P and the factors of tile i are written;
//   p_empty[i & 1]         O -> S: the O warps hold P of tile i in registers; S may write tile i + 2 there;
//   kv_empty[i % kStages]  O -> loader: P.V of tile i is done (so is its QK^T); the loader may refill
//                          its stage with tile i + kStages;
//   stats_ready            S -> O: each row's 1 / sum and LSE are published (after the last tile).
// With two stages the loader fetches tile i + 1 while S works on tile i, once the O warps are done
// with tile i - 1: one 37 KB tile in flight an SM, more than the memory's latency needs.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "common/params.h"
#include "common/ptx.cuh"
#include "decode/epilogue.cuh"
#include "decode/load_kv.cuh"
#include "decode/load_q.cuh"
#include "decode/qk_pv.cuh"
#include "decode/softmax.cuh"
#include "decode/tile_config.h"

namespace mla {

// The warp-specialized kernel's roles and the shared memory it adds after mainloop.cuh's map of tile C:
// a second P buffer, a second set of rescale factors and the mbarriers.
template <class C>
struct WsLayout {
  static constexpr int kRoleWarps = C::kWarps;  // S warps, and as many O warps: 4 x row groups
  static constexpr int kRoleThreads = C::kThreads;
  static constexpr int kLoaderThreads = 128;
  static constexpr int kThreads = 2 * kRoleThreads + kLoaderThreads;
  // Registers a thread holds once the roles have traded them (setmaxnreg, by warpgroup). The CTA keeps
  // what it launched with, kLaunchRegisters a thread (168 at one row group, 96 at two): setmaxnreg.inc
  // takes only what the loader's setmaxnreg.dec gave back (the SASS says CTAPOOL) and waits forever for
  // more. So the math roles share the launch allocation less the loader's 24 (240 and 112 a thread).
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kLoaderRegisters = 24;
  static constexpr int kMathPool =
      (kLaunchRegisters * kThreads - kLoaderRegisters * kLoaderThreads) / (2 * kRoleThreads) / 8 * 8;
  static constexpr int kMathRegisters = kMathPool < 240 ? kMathPool : 240;
  static_assert(kLoaderRegisters * kLoaderThreads + kMathRegisters * 2 * kRoleThreads <= kLaunchRegisters * kThreads,
                "the roles hold no more than the CTA launched with");
  static_assert(kRoleWarps % 4 == 0, "setmaxnreg trades registers by whole warpgroups");
  static constexpr int kP1Offset = C::kSmemBytes;
  static constexpr int kCorr1Offset = kP1Offset + C::kPBytes;
  static constexpr int kBarrierOffset = (kCorr1Offset + C::kCorrBytes + 7) / 8 * 8;
  static constexpr int kBarriers = 2 + 2 + 2 * C::kStages + 1;
  static constexpr int kSmemBytes = kBarrierOffset + 8 * kBarriers;
  static constexpr int kScoreBarrier = 1;  // named barrier of the S warps
  static_assert(C::kStages >= 2, "the ring holds at least the tile the O warps read and the one S reads");
  static_assert(kLoaderThreads % kBlockN == 0, "the loader's threads take whole tokens");
  static_assert(kSmemBytes <= kMaxSmemPerBlock, "the warp-specialized tile does not fit the shared memory of a block");
};

template <class C>
__global__ void __launch_bounds__(WsLayout<C>::kThreads, 1)
    mla_decode_ws_kernel(const __grid_constant__ DecodeParams p) {
#if !defined(MLA_TRADES_REGISTERS)
  __trap();  // the dispatch launches it only where the roles can trade registers
#else
  using L = WsLayout<C>;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t kv_smem = smem_u32(smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool s_role = warp < L::kRoleWarps, loader = warp >= 2 * L::kRoleWarps;
  constexpr int kLoaderThreadsPerToken = L::kLoaderThreads / kBlockN;
  const int loader_token = (threadIdx.x - 2 * L::kRoleThreads) / kLoaderThreadsPerToken;
  const int loader_first = threadIdx.x % kLoaderThreadsPerToken;
  const int role_warp = warp % L::kRoleWarps;  // the S or O warp's place: dim quarter, row group
  const WarpRole w{lane, role_warp & 3, role_warp >> 2, lane >> 2, lane & 3};

  const uint32_t barriers = kv_smem + L::kBarrierOffset;
  auto p_full = [&](int i) { return barriers + 8 * (i & 1); };
  auto p_empty = [&](int i) { return barriers + 16 + 8 * (i & 1); };
  auto kv_empty = [&](int stage) { return barriers + 32 + 8 * stage; };
  auto kv_full = [&](int stage) { return barriers + 32 + 8 * (C::kStages + stage); };
  const uint32_t stats_ready = barriers + 32 + 16 * C::kStages;
  if (threadIdx.x == 0) {
    for (int i = 0; i < 2; ++i) {
      mbarrier_init(p_full(i), L::kRoleThreads);
      mbarrier_init(p_empty(i), L::kRoleThreads);
    }
    for (int s = 0; s < C::kStages; ++s) {
      mbarrier_init(kv_empty(s), L::kRoleThreads);
      mbarrier_init(kv_full(s), L::kLoaderThreads);
    }
    mbarrier_init(stats_ready, L::kRoleThreads);
  }

  pdl_wait();
  pdl_launch_dependents();
  const WorkItem item = work_item(p);
  if (!item.valid) return;
  const int b = item.b, split = item.split;

  // The S warps read Q, the loader the first page ids (guessed from max_seq_len while seq_len is on
  // its way), before the split's tiles are known.
  const uint32_t q_smem = kv_smem + C::kQOffset;
  [[maybe_unused]] std::conditional_t<C::kQInSmem, QTileLoad<C>, NoQTileLoad> q_load;
  uint32_t qf[C::kQRegFragments][C::kQRegChunks][4];  // Q's A fragments where it stays in registers (16 rows)
  const TableRow table = table_row(p, b);
  const int* bt_row = table.ids;
  const int guess_len = min(p.max_seq_len, table.entries << p.page_shift);
  const int guess_begin = split * tiles_per_split(guess_len, item.splits);
  int guessed_page[C::kStages];
  // Rows of an S or O thread: fragment f, half h -> row = warp_row0 + 16 f + 8 h + g.
  const int warp_row0 = blockIdx.x * C::kTileRows + w.wr * C::kRowsPerWarp;
  // At two row groups the CTA launches at 96 registers a thread, too few to hold Q's fragments through
  // the prologue: the S warps load them once they hold their share (below).
  constexpr bool kEarlyQ = L::kLaunchRegisters >= 128;
  if (s_role) {
    if constexpr (C::kQInSmem)
      q_load.issue(q_smem, p, b, blockIdx.x * C::kTileRows);
    else if constexpr (kEarlyQ)
      load_q_fragments<C>(qf, p, b, warp_row0, w);
  }
  if (loader) {
#pragma unroll
    for (int s = 0; s < C::kStages; ++s)
      guessed_page[s] = page_at(p, bt_row, (guess_begin + s) * kBlockN + loader_token, guess_len);
  }
  const int seq_len = request_len(p, b, table.entries);
  const SplitTiles tiles = split_tiles(seq_len, split, item.splits);
  const int tile_begin = tiles.begin, tile_end = tiles.end;
  float* row_stats_smem = reinterpret_cast<float*>(smem + C::kScoresOffset);
  __syncthreads();  // the mbarriers are initialised

  if (loader) {
    setmaxnreg_dec<L::kLoaderRegisters>();
    // Page id of this thread's token of tile i of the split (a guess where it holds).
    auto page_for = [&](int i) {
      const int pos = (tile_begin + i) * kBlockN + loader_token;
      if (i < C::kStages && tile_begin == guess_begin && (pos < guess_len || pos >= seq_len)) {
        int guess = -1;
#pragma unroll
        for (int s = 0; s < C::kStages; ++s) guess = s == i ? guessed_page[s] : guess;  // registers, not local memory
        return pos < seq_len ? guess : -1;
      }
      return page_at(p, bt_row, pos, seq_len);
    };
    int page = page_for(0);
    for (int tile = tile_begin, i = 0; tile < tile_end; ++tile, ++i) {
      const int stage = i % C::kStages;
      if (i >= C::kStages) mbarrier_wait(kv_empty(stage), (i / C::kStages - 1) & 1);  // tile i - kStages is done
      load_kv_token<C, kLoaderThreadsPerToken>(kv_smem + stage * C::kStageBytes, p, tile, loader_token, loader_first,
                                               page);
      cp_async_mbarrier_arrive(kv_full(stage));
      page = page_for(i + 1);
    }
    cp_async_commit();
    cp_async_wait<0>();
  } else if (s_role) {
    setmaxnreg_inc<L::kMathRegisters>();
    float* scores = reinterpret_cast<float*>(smem + C::kScoresOffset);
    if constexpr (!C::kQInSmem && !kEarlyQ) load_q_fragments<C>(qf, p, b, warp_row0, w);
    if constexpr (C::kQInSmem) {
      q_load.finish(q_smem);
      cp_async_commit();
      cp_async_wait<0>();  // this thread's part of Q landed; the barrier below shows every S thread's
    }
    const float scale_log2 = read_scale(p.bmm1_ptr, p.bmm1) * kLog2e;
    const int first_masked = first_masked_position(p, seq_len);
    const int* const sparse_ids = sparse_list<C>(p, bt_row);
    OnlineSoftmax<C> softmax(w.wr * C::kRowsPerWarp + w.wd * C::kSoftRows,
                             reinterpret_cast<float*>(smem + C::kExactSumOffset), lane);

    for (int tile = tile_begin, i = 0; tile < tile_end; ++tile, ++i) {
      const uint32_t stage = kv_smem + (i % C::kStages) * C::kStageBytes;
      mbarrier_wait(kv_full(i % C::kStages), (i / C::kStages) & 1);
      // Every S warp is past the softmax of tile i - 1 (its read of the score buffer written next).
      named_barrier_sync(L::kScoreBarrier, L::kRoleThreads);
      float sc[C::kFragments][4][4];
      zero_fill(sc);
#pragma unroll
      for (int k = 0; k < C::kQkSteps; ++k) qk_step<C>(sc, stage, k, w, q_smem, qf);
      store_partial_scores<C>(scores, sc, w);
      named_barrier_sync(L::kScoreBarrier, L::kRoleThreads);

      if (i >= 2) mbarrier_wait(p_empty(i), ((i >> 1) - 1) & 1);  // the O warps hold P of tile i - 2
      const int buffer = i & 1;
      const uint32_t p_smem = kv_smem + (buffer ? L::kP1Offset : C::kPOffset);
      float* corr_smem = reinterpret_cast<float*>(smem + (buffer ? L::kCorr1Offset : C::kCorrOffset));
      softmax.update(scores, p, tile, first_masked, seq_len, scale_log2, p_smem, corr_smem, w, sparse_ids);
      mbarrier_arrive(p_full(i));
    }
    named_barrier_sync(L::kScoreBarrier, L::kRoleThreads);  // every S warp is done with the scores
    softmax.publish(reinterpret_cast<float2*>(row_stats_smem), w);
    mbarrier_arrive(stats_ready);
  } else {
    setmaxnreg_inc<L::kMathRegisters>();
    float acc[C::kFragments][16][4];
    zero_fill(acc);
    for (int tile = tile_begin, i = 0; tile < tile_end; ++tile, ++i) {
      const uint32_t stage = kv_smem + (i % C::kStages) * C::kStageBytes;
      const int buffer = i & 1;
      const uint32_t p_smem = kv_smem + (buffer ? L::kP1Offset : C::kPOffset);
      const float* corr_smem = reinterpret_cast<const float*>(smem + (buffer ? L::kCorr1Offset : C::kCorrOffset));
      mbarrier_wait(p_full(i), (i >> 1) & 1);
      rescale_accumulators<C>(acc, corr_smem, w);
      uint32_t pf[C::kFragments][2][4];
#pragma unroll
      for (int f = 0; f < C::kFragments; ++f)
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) ldmatrix_a<C>(pf[f][kk], w, p_smem, C::kPRowBytes, f, kk * 32);
      mbarrier_arrive(p_empty(i));
#pragma unroll
      for (int k = 0; k < C::kPvSteps; ++k) pv_part<C>(acc, pf, stage, k, w);
      mbarrier_arrive(kv_empty(i % C::kStages));
    }
    mbarrier_wait(stats_ready, 0);
    write_output<C>(acc, reinterpret_cast<const float2*>(row_stats_smem), p, warp_row0, w);
  }
#endif
}

}  // namespace mla
