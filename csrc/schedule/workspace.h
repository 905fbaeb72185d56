// What a decode call's workspace holds, from its start: the split plan where the call makes its own
// (rounded to 256 bytes, so that the partials after it stay aligned), then the split partials, a row of
// kDimV outputs a (split, query row), then their LSE. Sized for fp32 outputs: FP8 problems store f16
// ones and use the first half of them. A step's plan lives in a buffer of its own; a call that splits
// nothing needs no workspace.
#pragma once

#include <stdint.h>

#include "common/kernel_constants.h"
#include "schedule/plan_layout.h"

namespace mla {

struct WorkspaceLayout {
  int64_t plan_bytes;    // the plan's ints, where the call plans itself
  int64_t partial_rows;  // splits x query rows
  int64_t bytes() const { return plan_bytes + partial_rows * (kDimV + 1) * static_cast<int64_t>(sizeof(float)); }
};

// A call of `batch` requests of `rows` query rows each: `num_splits` splits a request, or a plan over
// `plan_pieces` CTAs per row block (made in the call, or once a step: `step_plan`).
inline WorkspaceLayout workspace_layout(int64_t batch, int64_t rows, int64_t num_splits, int64_t plan_pieces,
                                        bool step_plan) {
  if (plan_pieces > 0) {
    const PlanLayout layout{static_cast<int>(batch), static_cast<int>(plan_pieces)};
    return {step_plan ? 0 : plan_workspace_bytes(layout), layout.max_partials() * rows};
  }
  return {0, num_splits > 1 ? batch * num_splits * rows : 0};
}

inline int64_t workspace_bytes(int64_t batch, int64_t rows, int64_t num_splits, int64_t plan_pieces, bool step_plan) {
  return workspace_layout(batch, rows, num_splits, plan_pieces, step_plan).bytes();
}

}  // namespace mla
