// Which merge kernel combines a call's split partials, and its grid.
#pragma once

#include <stdint.h>

#include <algorithm>

#include "api/dispatch.cuh"
#include "api/occupancy.cuh"
#include "merge/merge_few.cuh"
#include "merge/merge_kernel.cuh"
#include "schedule/plan_layout.h"

namespace mla {

// After the decode kernel: nothing where no request was split. A planned call's merge takes enough
// blocks to fill the GPU, which take merge units in turn (how many is known only on the GPU); an
// unplanned call's, a warp a row where kFewSplitsMax splits or fewer fit its registers, else a block a
// (row, request, slice).
inline void launch_merge(const DecodeParams& p, bool fp8, int device, cudaStream_t stream, bool pdl) {
  if (p.plan != nullptr) {
    const int64_t units = static_cast<int64_t>(PlanLayout{p.batch, p.plan_pieces}.max_merged()) * p.rows * kMergeSlices;
    const int64_t wave = std::max<int64_t>(1, merge_blocks_per_sm(device, fp8)) * multiprocessors(device);
    const int64_t blocks = std::min<int64_t>(units, wave);
    launch(fp8 ? mla_merge_splits_kernel<true> : mla_merge_splits_kernel<false>, dim3(static_cast<unsigned>(blocks)),
           kMergeThreads, 0, stream, pdl, p);
  } else if (p.num_splits > 1 && p.num_splits <= kFewSplitsMax) {
    const int64_t blocks =
        (static_cast<int64_t>(p.batch) * p.rows + kFewSplitsRowsPerBlock - 1) / kFewSplitsRowsPerBlock;
    launch(fp8 ? mla_merge_few_splits_kernel<true> : mla_merge_few_splits_kernel<false>,
           dim3(static_cast<unsigned>(blocks)), 32 * kFewSplitsRowsPerBlock, 0, stream, pdl, p);
  } else if (p.num_splits > 1) {
    launch(fp8 ? mla_merge_splits_kernel<true> : mla_merge_splits_kernel<false>, dim3(p.rows, p.batch, kMergeSlices),
           kMergeThreads, 0, stream, pdl, p);
  }
}

}  // namespace mla
