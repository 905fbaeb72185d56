// The scheduling formulas as ops, for Python to read (mla_backend/launcher.py keeps none of its own):
// pure functions of their arguments, registered without tensors, so they run wherever the library
// loads, GPU or not.
#pragma once

#include <limits.h>
#include <stdint.h>

#include <tuple>

#include "api/invariants.h"
#include "common/kernel_constants.h"
#include "schedule/host_schedule.h"
#include "schedule/plan_layout.h"
#include "schedule/workspace.h"

namespace mla {

static_assert(tile_rows(true, kMaxRows) > 0 && tile_rows(false, kMaxRows) > 0, "the tile table covers every row count");

// A batch whose plan's offsets fit int32, as PlanLayout counts them.
constexpr int64_t kMaxPlanBatch = INT_MAX / 8;

inline void check_batch(int64_t batch) {
  MLA_INVARIANT(batch >= 0 && batch <= kMaxPlanBatch, "batch must be 0..", kMaxPlanBatch);
}

inline void check_schedule_args(int64_t batch, int64_t rows, int64_t slots, int64_t workspace_capacity) {
  check_batch(batch);
  MLA_INVARIANT(rows >= 1 && rows <= kMaxRows, "rows (q_len x heads) must be 1..", kMaxRows);
  MLA_INVARIANT(slots >= 1 && slots <= INT_MAX, "slots (resident CTAs) must be 1..", INT_MAX);
  MLA_INVARIANT(workspace_capacity >= 0, "workspace_capacity must be >= 0");
}

// Lengths whose tile counts the cost model's doubles hold exactly.
inline void check_max_seq_len(int64_t max_seq_len) {
  MLA_INVARIANT(max_seq_len >= 0 && max_seq_len <= (int64_t{1} << 53), "max_seq_len must be 0..2^53");
}

// int32 entries of a split plan of `batch` requests over `plan_pieces` CTAs per row block.
inline int64_t plan_ints_op(int64_t batch, int64_t plan_pieces) {
  check_batch(batch);
  MLA_INVARIANT(plan_pieces >= 0 && plan_pieces <= kMaxPlanPieces, "plan_pieces must be 0..", kMaxPlanPieces);
  return PlanLayout{static_cast<int>(batch), static_cast<int>(plan_pieces)}.ints();
}

inline int64_t workspace_bytes_op(int64_t batch, int64_t rows, int64_t num_splits, int64_t plan_pieces,
                                  bool step_plan) {
  check_batch(batch);
  MLA_INVARIANT(rows >= 0 && rows <= kMaxRows, "rows (q_len x heads) must be 0..", kMaxRows);
  MLA_INVARIANT(num_splits >= 1 && num_splits <= kMaxSplits, "num_splits must be 1..", kMaxSplits);
  MLA_INVARIANT(plan_pieces >= 0 && plan_pieces <= kMaxPlanPieces, "plan_pieces must be 0..", kMaxPlanPieces);
  return workspace_bytes(batch, rows, num_splits, plan_pieces, step_plan);
}

inline int64_t num_splits_op(int64_t batch, int64_t rows, bool fp8, int64_t max_seq_len, int64_t slots,
                             int64_t workspace_capacity) {
  check_schedule_args(batch, rows, slots, workspace_capacity);
  check_max_seq_len(max_seq_len);
  return choose_num_splits(batch, rows, fp8, max_seq_len, slots, workspace_capacity);
}

inline std::tuple<int64_t, int64_t> schedule_op(int64_t batch, int64_t rows, bool fp8, int64_t max_seq_len,
                                                int64_t slots, int64_t workspace_capacity, bool step_plan) {
  check_schedule_args(batch, rows, slots, workspace_capacity);
  check_max_seq_len(max_seq_len);
  const auto [num_splits, pieces] = schedule(batch, rows, fp8, max_seq_len, slots, workspace_capacity, step_plan);
  return {num_splits, pieces};
}

}  // namespace mla
