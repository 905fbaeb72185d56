// The decode and plan ops: their tensors read into the kernels' parameters (api/tensor_args.h), the
// workspace carved (schedule/workspace.h), then the launches.
#pragma once

#include <limits.h>
#include <stdint.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <optional>

#include "api/dispatch.cuh"
#include "api/invariants.h"
#include "api/merge_launch.cuh"
#include "api/tensor_args.h"
#include "common/params.h"
#include "plan/plan_kernel.cuh"
#include "schedule/plan_layout.h"
#include "schedule/workspace.h"

namespace mla {

// The workspace holds what the schedule writes there: the plan where the call makes its own, then the
// split partials and their LSE (schedule/workspace.h). `step_plan`: the step's plan, which lives apart.
inline void carve_workspace(DecodeParams& p, const Tensor& workspace, int* step_plan) {
  if (p.plan_pieces == 0 && p.num_splits == 1) return;
  const WorkspaceLayout layout = workspace_layout(p.batch, p.rows, p.num_splits, p.plan_pieces, step_plan != nullptr);
  const PlanLayout plan_layout{p.batch, p.plan_pieces};
  MLA_INVARIANT(p.plan_pieces == 0 || plan_layout.max_items() <= kMaxGridY,
                "batch + the plan's cut waves x plan_pieces must be <= ", kMaxGridY);
  MLA_INVARIANT(workspace.is_cuda() && workspace.is_contiguous() &&
                    workspace.numel() * static_cast<int64_t>(workspace.element_size()) >= layout.bytes(),
                "workspace too small: need ", layout.bytes(), " bytes for ",
                p.plan_pieces > 0 ? "the split plan" : "the KV splits");
  uint8_t* base = static_cast<uint8_t*>(workspace.data_ptr());
  if (p.plan_pieces > 0) p.plan = step_plan != nullptr ? step_plan : reinterpret_cast<int*>(base);
  p.part_o = base + layout.plan_bytes;
  p.part_lse = reinterpret_cast<float*>(base + layout.plan_bytes) + layout.partial_rows * kDimV;
}

// Stable boxing passes tensors by value (reference-counted handles).
inline void decode(Tensor q_nope, Tensor q_pe, Tensor kv, Tensor kv_pe, Tensor block_tables, Tensor seq_lens,
                   Tensor out, std::optional<Tensor> lse, Tensor workspace, int64_t max_seq_len, int64_t num_splits,
                   int64_t plan_pieces, std::optional<Tensor> plan, int64_t row_groups, int64_t rf, double bmm1,
                   std::optional<Tensor> bmm1_tensor, double bmm2, std::optional<Tensor> bmm2_tensor, bool pdl,
                   std::optional<Tensor> kv_indptr, bool causal) {
  check_q_part(q_nope, kDimV, "q_nope");
  check_q_part(q_pe, kRopeDim, "q_pe");
  MLA_INVARIANT(q_pe.scalar_type() == q_nope.scalar_type() && q_pe.size(0) == q_nope.size(0) &&
                    q_pe.size(1) == q_nope.size(1) && q_pe.size(2) == q_nope.size(2),
                "q_pe must match q_nope in dtype and leading shape");
  const Tensor& q = q_nope;
  const bool fp8 = q.scalar_type() == ScalarType::Float8_e4m3fn;
  MLA_INVARIANT(fp8 || q.scalar_type() == ScalarType::BFloat16, "q must be bf16 or fp8 e4m3");
  check_kv_part(kv, q, kDimV, "kv");
  check_kv_part(kv_pe, q, kRopeDim, "kv_pe");
  MLA_INVARIANT(kv_pe.size(0) == kv.size(0) && kv_pe.size(1) == kv.size(1), "kv_pe: same pages and page size as kv");
  const int64_t batch = q.size(0), rows = q.size(1) * q.size(2);
  const int shift = page_shift(kv.size(1));
  int64_t max_pages = 0;  // page ids a request may own
  if (kv_indptr.has_value()) {
    MLA_INVARIANT(kv_indptr->scalar_type() == ScalarType::Int && kv_indptr->is_contiguous() && kv_indptr->dim() == 1 &&
                      kv_indptr->numel() >= batch + 1 && kv_indptr->get_device_index() == q.get_device_index(),
                  "kv_indptr: contiguous int32 [B + 1] on the query's device");
    MLA_INVARIANT(
        block_tables.scalar_type() == ScalarType::Int && block_tables.dim() == 1 && block_tables.is_contiguous(),
        "block_tables with kv_indptr: FlashInfer's kv_indices, contiguous int32 [n]");
    max_pages = block_tables.numel();
  } else {
    MLA_INVARIANT(block_tables.scalar_type() == ScalarType::Int && block_tables.dim() == 2 &&
                      block_tables.size(0) >= batch && block_tables.stride(1) == 1,
                  "block_tables: int32 rows, one a request");
    max_pages = block_tables.size(1);
  }
  MLA_INVARIANT((max_pages << shift) <= INT_MAX, "page ids x page size must fit int32 token positions");
  MLA_INVARIANT(seq_lens.scalar_type() == ScalarType::Int && seq_lens.is_contiguous() && seq_lens.numel() >= batch,
                "seq_lens: int32, one a request");
  MLA_INVARIANT(out.scalar_type() == ScalarType::BFloat16 && out.is_contiguous() && out.numel() == q.numel(),
                "out: bf16 [B, q_len, H, 512]");
  MLA_INVARIANT(num_splits >= 1 && num_splits <= kMaxSplits, "num_splits must be 1..", kMaxSplits);
  MLA_INVARIANT(plan_pieces >= 0 && plan_pieces <= kMaxPlanPieces, "plan_pieces must be 0..", kMaxPlanPieces);
  MLA_INVARIANT(rows <= kMaxRows, "q_len x heads must be <= ", kMaxRows);  // heads_recip's exact range

  DecodeParams p = {};
  set_queries_and_outputs(p, q_nope, q_pe, out, lse, batch * rows, "fp32 [B, q_len, H]", bmm1, bmm1_tensor, bmm2,
                          bmm2_tensor);
  p.kv = static_cast<const uint8_t*>(kv.data_ptr());
  p.kv_pe = static_cast<const uint8_t*>(kv_pe.data_ptr());
  p.block_tables = static_cast<const int*>(block_tables.data_ptr());
  p.seq_lens = static_cast<const int*>(seq_lens.data_ptr());
  p.page_stride = kv.stride(0) * kv.element_size();
  p.pe_page_stride = kv_pe.stride(0) * kv_pe.element_size();
  // Pages of one token never step along dim 1, whose stride may then be anything.
  p.token_stride = kv.size(1) == 1 ? 0 : static_cast<int>(kv.stride(1) * kv.element_size());
  p.pe_token_stride = kv_pe.size(1) == 1 ? 0 : static_cast<int>(kv_pe.stride(1) * kv_pe.element_size());
  p.page_shift = shift;
  p.max_pages = static_cast<int>(max_pages);
  MLA_INVARIANT(kv.size(0) <= INT_MAX, "kv: at most 2^31 - 1 pages (int32 page ids)");
  p.num_pages = static_cast<int>(kv.size(0));
  p.kv_indptr = kv_indptr.has_value() ? static_cast<const int*>(kv_indptr->data_ptr()) : nullptr;
  p.bt_stride = kv_indptr.has_value() ? 0 : static_cast<int>(block_tables.stride(0));
  p.causal = causal ? 1 : 0;
  p.batch = static_cast<int>(batch);
  p.num_splits = static_cast<int>(num_splits);
  p.max_seq_len =
      static_cast<int>(std::clamp<int64_t>(max_seq_len, 0, static_cast<int64_t>(p.max_pages) << p.page_shift));
  p.plan_pieces = static_cast<int>(plan_pieces);
  int* const step_plan = step_plan_ints(plan, q, batch, plan_pieces);
  carve_workspace(p, workspace, step_plan);

  const int device = q.get_device_index();
  const torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  if (batch == 0) return;
  if (p.plan != nullptr && step_plan == nullptr) launch(mla_plan_kernel, dim3(1), kPlanThreads, 0, stream, pdl, p);
  with_tile_shape(fp8, row_groups, rf, LaunchDecode{p, stream, pdl});
  launch_merge(p, fp8, device, stream, pdl);
}

// A decode step's split plan, made once for all its layers' calls (`decode`'s plan argument): what a
// planned call would make itself, from the same seq_lens and block-table width. A plan stays correct
// for other lengths (each split's tiles come from the request's length when it runs), only less even.
inline void plan(Tensor seq_lens, Tensor plan, int64_t max_pages, int64_t page_size, int64_t plan_pieces) {
  MLA_INVARIANT(seq_lens.is_cuda() && seq_lens.scalar_type() == ScalarType::Int && seq_lens.is_contiguous() &&
                    seq_lens.dim() == 1,
                "seq_lens: contiguous int32 [B] CUDA tensor");
  MLA_INVARIANT(plan_pieces > 0 && plan_pieces <= kMaxPlanPieces, "plan_pieces must be 1..", kMaxPlanPieces);
  const int shift = page_shift(page_size);
  MLA_INVARIANT(max_pages >= 0 && (max_pages << shift) <= INT_MAX, "max_pages x page_size must fit int32");
  const int64_t batch = seq_lens.size(0);
  const PlanLayout layout{static_cast<int>(batch), static_cast<int>(plan_pieces)};
  MLA_INVARIANT(layout.max_items() <= kMaxGridY, "batch + the plan's cut waves x plan_pieces must be <= ", kMaxGridY);
  DecodeParams p = {};
  p.seq_lens = static_cast<const int*>(seq_lens.data_ptr());
  p.batch = static_cast<int>(batch);
  p.max_pages = static_cast<int>(max_pages);
  p.page_shift = shift;
  p.plan_pieces = static_cast<int>(plan_pieces);
  p.plan = step_plan_ints(plan, seq_lens, batch, plan_pieces);
  const int device = seq_lens.get_device_index();
  const torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  if (batch == 0) return;
  // No programmatic launch: whatever follows on the stream sees the whole plan.
  launch(mla_plan_kernel, dim3(1), kPlanThreads, 0, stream, false, p);
}

}  // namespace mla
