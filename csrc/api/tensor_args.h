// Reading the op's tensors into the kernels' parameters, with the invariants the kernels' 16-byte loads
// and int32 reads depend on.
#pragma once

#include <stdint.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/tensor.h>

#include <optional>

#include "api/invariants.h"
#include "common/kernel_constants.h"
#include "common/params.h"
#include "schedule/plan_layout.h"

namespace mla {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// A scale given as a one-element float32 tensor (read on the GPU at run time), or nullptr.
inline const float* optional_scale(const std::optional<Tensor>& t) {
  if (!t.has_value()) return nullptr;
  MLA_INVARIANT(t->scalar_type() == ScalarType::Float && t->numel() == 1, "scale tensors must be one float32");
  return static_cast<const float*>(t->data_ptr());
}

// Q as two [B, q_len, H, *] tensors (or views of one [B, q_len, H, 576] tensor): rows contiguous,
// other strides (of dims longer than 1) and the start 16-byte aligned, for the kernel's 16-byte loads.
inline void check_q_part(const Tensor& t, int64_t dim, const char* name) {
  MLA_INVARIANT(t.is_cuda() && t.dim() == 4 && t.size(3) == dim && t.stride(3) == 1, name, ": [B, q_len, H, ", dim,
                "] CUDA tensor with contiguous rows");
  MLA_INVARIANT(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name, ": start must be 16-byte aligned");
  for (int d = 0; d < 3; ++d) {
    MLA_INVARIANT(t.size(d) == 1 || t.stride(d) * t.element_size() % 16 == 0, name,
                  ": strides must be multiples of 16 bytes");
  }
}

// Byte strides; a dim of size 1 is only ever indexed at 0, so its stride (which may be anything) is 0.
inline void set_q_strides(long long (&dst)[3], const Tensor& t) {
  for (int d = 0; d < 3; ++d) dst[d] = t.size(d) == 1 ? 0 : t.stride(d) * t.element_size();
}

// What the decode and sparse ops fill alike: Q (two [B, q_len, H, *] parts, checked), the bf16 output and
// the optional fp32 LSE of `lse_numel` elements (`lse_shape` names it in the error), the bmm scales, the
// row counts and heads_recip (row / heads == (row * heads_recip) >> 20 below kMaxRows rows).
inline void set_queries_and_outputs(DecodeParams& p, const Tensor& q_nope, const Tensor& q_pe, const Tensor& out,
                                    const std::optional<Tensor>& lse, int64_t lse_numel, const char* lse_shape,
                                    double bmm1, const std::optional<Tensor>& bmm1_tensor, double bmm2,
                                    const std::optional<Tensor>& bmm2_tensor) {
  p.q_nope = static_cast<const uint8_t*>(q_nope.data_ptr());
  p.q_pe = static_cast<const uint8_t*>(q_pe.data_ptr());
  set_q_strides(p.q_nope_stride, q_nope);
  set_q_strides(p.q_pe_stride, q_pe);
  p.out = reinterpret_cast<__nv_bfloat16*>(out.data_ptr());
  p.lse = nullptr;
  if (lse.has_value()) {
    MLA_INVARIANT(lse->scalar_type() == ScalarType::Float && lse->is_contiguous() && lse->numel() == lse_numel,
                  "lse: ", lse_shape);
    p.lse = static_cast<float*>(lse->data_ptr());
  }
  p.bmm1_ptr = optional_scale(bmm1_tensor);
  p.bmm2_ptr = optional_scale(bmm2_tensor);
  p.bmm1 = static_cast<float>(bmm1);
  p.bmm2 = static_cast<float>(bmm2);
  p.q_len = static_cast<int>(q_nope.size(1));
  p.heads = static_cast<int>(q_nope.size(2));
  p.rows = p.q_len * p.heads;
  p.heads_recip = ((1 << 20) + p.heads - 1) / p.heads;
}

// One part of the KV cache, [pages, page, dim] (a column range of one [.., 576] cache, or a cache of
// its own): rows contiguous; start, token stride and page stride 16-byte aligned (16-byte copies).
inline void check_kv_part(const Tensor& t, const Tensor& q, int64_t dim, const char* name) {
  MLA_INVARIANT(
      t.is_cuda() && t.scalar_type() == q.scalar_type() && t.dim() == 3 && t.size(2) == dim && t.stride(2) == 1, name,
      ": [pages, page, ", dim, "] CUDA tensor of the query's dtype with contiguous rows");
  MLA_INVARIANT(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 &&
                    (t.size(1) == 1 || t.stride(1) * t.element_size() % 16 == 0) &&
                    (t.size(0) == 1 || t.stride(0) * t.element_size() % 16 == 0),
                name, ": start, token stride and page stride must be 16-byte aligned");
}

// Pages of a power-of-two size (1: a token-indexed cache, one slot id a token): a token's page is its
// index shifted right.
inline int page_shift(int64_t page_size) {
  MLA_INVARIANT(page_size >= 1 && page_size <= kMaxPageSize && (page_size & (page_size - 1)) == 0,
                "page size must be a power of two in 1..", kMaxPageSize);
  return __builtin_ctzll(page_size);
}

// A step's plan made by the plan op and read by every layer's decode call: int32,
// PlanLayout{batch, pieces}.ints() of them on the query's device.
inline int* step_plan_ints(const std::optional<Tensor>& plan, const Tensor& q, int64_t batch, int64_t pieces) {
  if (!plan.has_value()) return nullptr;
  MLA_INVARIANT(pieces > 0, "a step plan needs plan_pieces > 0");
  MLA_INVARIANT(plan->is_cuda() && plan->get_device_index() == q.get_device_index() &&
                    plan->scalar_type() == ScalarType::Int && plan->is_contiguous(),
                "plan: contiguous int32 tensor on the query's device");
  const PlanLayout layout{static_cast<int>(batch), static_cast<int>(pieces)};
  MLA_INVARIANT(plan->numel() >= layout.ints(), "plan: ", layout.ints(), " ints for batch ", batch, " and ", pieces,
                " pieces, got ", plan->numel());
  return static_cast<int*>(plan->data_ptr());
}

// The stream torch runs on for the device.
inline cudaStream_t current_stream(int32_t device) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  return static_cast<cudaStream_t>(stream);
}

}  // namespace mla
