// The split plan's layout, which the plan kernel writes, the decode and merge kernels read and the
// host sizes buffers by: one definition for all of them (and for Python, through the library's ops).
#pragma once

#include <stdint.h>

#include "common/kernel_constants.h"

namespace mla {

// The split plan in the workspace (int32), written by mla_plan_kernel from the real seq_lens:
//   [0]                    items: (request, split) pairs, one decode CTA each (per row block)
//   [1], [2]               requests cut into 2..kFewSplitsMax splits, and into more (the merge's work)
//   first_item() + b       the first item of request b (its items are consecutive)
//   count() + b            the splits of request b
//   first_partial() + b    where request b's split partials start in the workspace (split requests only)
//   items() + i            the request of item i, for i < max_items()
//   merged() + k           the k-th request cut into 2..kFewSplitsMax splits, k < [1]
//   merged() + max_merged() - 1 - k   the k-th request cut into more, k < [2]
// The plan keeps within these bounds (plan/plan_kernel.cuh weighs only the targets that do): items at most
// batch + cut waves x pieces, partials at most (cut waves + 1) x pieces, split requests at most half
// that and the batch. One split a request always does.
struct PlanLayout {
  int batch, pieces;
  __host__ __device__ int first_item() const { return 3; }
  __host__ __device__ int count() const { return 3 + batch; }
  __host__ __device__ int first_partial() const { return 3 + 2 * batch; }
  __host__ __device__ int items() const { return 3 + 3 * batch; }
  static constexpr int kCutWaves = kPlanCutWaves;
  __host__ __device__ int max_items() const { return batch + kCutWaves * pieces; }
  __host__ __device__ int merged() const { return items() + max_items(); }
  __host__ __device__ int max_partials() const { return (kCutWaves + 1) * pieces; }
  __host__ __device__ int max_merged() const { return batch < max_partials() / 2 ? batch : max_partials() / 2; }
  __host__ __device__ int ints() const { return merged() + max_merged(); }
};

// Workspace bytes the plan takes, a multiple of 256 so that the partials after it stay aligned.
inline int64_t plan_workspace_bytes(const PlanLayout& layout) {
  return (static_cast<int64_t>(layout.ints()) * 4 + 255) / 256 * 256;
}

}  // namespace mla
