// The merge kernels' measured choices (docs/performance.md), fixed per build target.
#pragma once

namespace mla {

struct MergeTraits {
  // Blocks of mla_merge_splits_kernel an SM must hold at once: four on SM90, whose merge fits the 64
  // registers a thread that leaves; three elsewhere (SM120's build spills at 64). The launcher asks the
  // occupancy (api/occupancy.cuh) and sizes a planned call's merge grid to one wave.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
  static constexpr int kMinBlocks = 4;
#else
  static constexpr int kMinBlocks = 3;
#endif
  // Splits a warp merges a unit of (merge_warp.cuh; more take a block): a split's weight sits in lane s.
  static constexpr int kWarpMaxSplits = 16;
  // fp32 splits a warp unit loads a batch, the next batch loading while one is summed: about one L2
  // round trip a batch (4 x 2 and 8 x 1 spill at sm_90's 64 registers).
  static constexpr int kWarpBatch = 2;
  static_assert(kWarpMaxSplits <= 32, "one lane holds each split's weight");
  static_assert(kWarpMaxSplits % kWarpBatch == 0, "batches of whole splits");
};

}  // namespace mla
