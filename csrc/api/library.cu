// The torch library of the MLA decode kernels, on PyTorch's stable C ABI (STABLE_TORCH_LIBRARY,
// torch::stable::Tensor, the aoti_torch shim; built with TORCH_TARGET_VERSION set to the oldest
// supported torch): one library serves every torch from that release on and every Python version.
// The ops' schemas and kernels; what they do lives in api/decode_op.cuh and api/schedule_ops.h.
#include <torch/csrc/stable/library.h>

#include "api/decode_op.cuh"
#include "api/dispatch.cuh"
#include "api/schedule_ops.h"
#include "api/sparse_op.cuh"

STABLE_TORCH_LIBRARY(mla_backend, m) {
  m.def(
      "decode(Tensor q_nope, Tensor q_pe, Tensor kv, Tensor kv_pe, Tensor block_tables, Tensor seq_lens, Tensor(a!) "
      "out, Tensor(b!)? "
      "lse, "
      "Tensor(c!) workspace, int max_seq_len, int num_splits, int plan_pieces, Tensor? plan, int row_groups, int rf, "
      "float bmm1, Tensor? bmm1_tensor, float bmm2, Tensor? bmm2_tensor, bool pdl, Tensor? kv_indptr, bool causal) "
      "-> ()");
  m.def(
      "sparse_decode(Tensor q_nope, Tensor q_pe, Tensor kv, Tensor indices, Tensor topk_lens, Tensor(a!) out, "
      "Tensor(b!)? lse, Tensor(c!) workspace, int num_splits, int row_groups, int rf, float bmm1, Tensor? bmm1_tensor, "
      "float bmm2, Tensor? bmm2_tensor, bool pdl, int kv_format, bool fp8_tile) -> ()");
  m.def("plan(Tensor seq_lens, Tensor(a!) plan, int max_pages, int page_size, int plan_pieces) -> ()");
  m.def("ctas_per_sm(bool fp8, int row_groups, int rf, int kv_format) -> int");
  m.def("ds_mla_fp8_tile(int row_groups, int rf) -> bool");
  m.def("plan_ints(int batch, int plan_pieces) -> int");
  m.def("workspace_bytes(int batch, int rows, int num_splits, int plan_pieces, bool step_plan) -> int");
  m.def("num_splits(int batch, int rows, bool fp8, int max_seq_len, int slots, int workspace_capacity) -> int");
  m.def(
      "schedule(int batch, int rows, bool fp8, int max_seq_len, int slots, int workspace_capacity, bool step_plan) -> "
      "(int, int)");
}

STABLE_TORCH_LIBRARY_IMPL(mla_backend, CUDA, m) {
  m.impl("decode", TORCH_BOX(&mla::decode));
  m.impl("sparse_decode", TORCH_BOX(&mla::sparse_decode));
  m.impl("plan", TORCH_BOX(&mla::plan));
}

// No tensor arguments: the dispatcher finds these kernels under CompositeExplicitAutograd.
STABLE_TORCH_LIBRARY_IMPL(mla_backend, CompositeExplicitAutograd, m) {
  m.impl("ctas_per_sm", TORCH_BOX(&mla::ctas_per_sm));
  m.impl("ds_mla_fp8_tile", TORCH_BOX(&mla::ds_mla_fp8_tile));
  m.impl("plan_ints", TORCH_BOX(&mla::plan_ints_op));
  m.impl("workspace_bytes", TORCH_BOX(&mla::workspace_bytes_op));
  m.impl("num_splits", TORCH_BOX(&mla::num_splits_op));
  m.impl("schedule", TORCH_BOX(&mla::schedule_op));
}
