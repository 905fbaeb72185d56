// How the host schedules a call's split-KV: one split count for every request, or the number of CTAs
// (pieces) the GPU's split plan (plan/plan_kernel.cuh) deals the call's work to. Both depend only on
// host values (the batch, the rows, the bound on the lengths, the GPU's resident CTAs and the
// workspace), so a captured CUDA graph stays valid for any seq_lens.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <utility>

#include "common/kernel_constants.h"
#include "schedule/cost_model.h"
#include "schedule/workspace.h"

namespace mla {

// Query rows of the CTA tile a problem of `rows` (query tokens x heads) runs on: the first entry of
// constants.h's tile table for its dtype whose max_rows covers them (0: none does).
constexpr int64_t tile_rows(bool fp8, int64_t rows) {
#define MLA_TILE_ROWS(FP8, MAX_ROWS, ROW_GROUPS, RF) \
  if (fp8 == ((FP8) != 0) && rows <= (MAX_ROWS)) return 16 * (ROW_GROUPS) * (RF);
  MLA_TILE_SHAPES(MLA_TILE_ROWS)
#undef MLA_TILE_ROWS
  return 0;
}

// The split count of every request of a call that has no plan: the grid (batch x row blocks x splits)
// fills whole waves of `slots` resident CTAs. A split costs waves x cta_cost(tiles per split) plus the
// merge (cost_model.h), in doubles; the smallest count within 2% of the cheapest wins. Splits keep at
// least kMinTilesPerSplit tiles of the longest request (`max_seq_len` tokens) and fit the workspace.
inline int64_t choose_num_splits(int64_t batch, int64_t rows, bool fp8, int64_t max_seq_len, int64_t slots,
                                 int64_t workspace_capacity) {
  if (batch == 0) return 1;
  const int64_t ctas = batch * ceil_div<int64_t>(rows, tile_rows(fp8, rows));
  const int64_t useful = std::max<int64_t>(1, ceil_div<int64_t>(max_seq_len, kBlockN * kMinTilesPerSplit));
  const int64_t per_split = workspace_bytes(batch, rows, 2, 0, false) / 2;
  const int64_t fits = per_split > 0 ? std::max<int64_t>(1, workspace_capacity / per_split) : 1;
  const int64_t limit = std::max<int64_t>(1, std::min({useful, fits, int64_t{kMaxSplits}}));
  const int64_t tiles = std::max<int64_t>(1, ceil_div<int64_t>(max_seq_len, kBlockN));
  auto cost = [&](int64_t s) {
    const double waves = static_cast<double>(ceil_div(ctas * s, slots));
    return waves * cta_cost(static_cast<double>(tiles) / s) +
           merge_cost(static_cast<int>(s)) * (1.0 / kSplitsPerMergeTile);
  };
  double best = cost(1);
  for (int64_t s = 2; s <= limit; ++s) best = std::min(best, cost(s));
  int64_t s = 1;
  while (cost(s) > best * 1.02) ++s;
  return s;
}

// CTAs per row block the GPU's split plan deals a call's work to: one wave of the resident CTAs, as
// many as the workspace holds partials (and, made in the call, the plan) for and grid.y's bound
// leaves room for; 0 (no plan: the host's split count) where it holds none or the batch is under
// kPlanMinBatch (kStepPlanMinBatch for a plan made once a step, whose ints live outside the workspace).
inline int64_t choose_plan_pieces(int64_t batch, int64_t rows, bool fp8, int64_t slots, int64_t workspace_capacity,
                                  bool step_plan) {
  if (batch < (step_plan ? kStepPlanMinBatch : kPlanMinBatch)) return 0;
  const int64_t row_blocks = ceil_div<int64_t>(rows, tile_rows(fp8, rows));
  const int64_t items_room = (kMaxGridY - batch) / kPlanCutWaves;  // the plan's items span grid.y
  int64_t pieces =
      std::max<int64_t>(0, std::min({int64_t{kMaxPlanPieces}, std::max<int64_t>(1, slots / row_blocks), items_room}));
  while (pieces > 0 && workspace_bytes(batch, rows, 1, pieces, step_plan) > workspace_capacity) pieces /= 2;
  return pieces;
}

// (num_splits, plan_pieces) of a call: planned on the GPU where choose_plan_pieces gives it pieces
// (then one split a request until the plan cuts them), else the host's split count.
inline std::pair<int64_t, int64_t> schedule(int64_t batch, int64_t rows, bool fp8, int64_t max_seq_len, int64_t slots,
                                            int64_t workspace_capacity, bool step_plan) {
  const int64_t pieces = choose_plan_pieces(batch, rows, fp8, slots, workspace_capacity, step_plan);
  return {pieces > 0 ? 1 : choose_num_splits(batch, rows, fp8, max_seq_len, slots, workspace_capacity), pieces};
}

}  // namespace mla
