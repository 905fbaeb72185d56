// The sparse decode op (DeepSeek Sparse Attention: DeepSeek-V3.2, GLM-5): query token t attends to the
// cache rows its index list names. Each query token is a request of one token to the decode kernels: its
// list is its block-table row of one-token pages, its length the list's valid prefix, and ids outside
// the cache (-1: an empty entry) are masked (DecodeParams::sparse).
#pragma once

#include <limits.h>
#include <stdint.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/tensor.h>

#include <optional>

#include "api/decode_op.cuh"
#include "api/dispatch.cuh"
#include "api/invariants.h"
#include "api/merge_launch.cuh"
#include "api/tensor_args.h"
#include "common/params.h"
#include "decode/load_kv_ds_mla.cuh"

namespace mla {

// q_nope/q_pe: [T, 1, H, 512/64] bf16 views. kv: the cache as rows, [N, 576] bf16 or, for fp8_ds_mla
// (kv_format 1), [N, 656] uint8, any 16-byte-aligned row stride. indices: int32 [T, K], unit stride along
// K. topk_lens: int32 [T], the valid prefix of each list (<= K). fp8_tile: fp8_ds_mla rows on the FP8 tile
// (row_groups, rf) where the build has one (ds_mla_fp8_tile), else the BF16 tile (row_groups, rf).
inline void sparse_decode(Tensor q_nope, Tensor q_pe, Tensor kv, Tensor indices, Tensor topk_lens, Tensor out,
                          std::optional<Tensor> lse, Tensor workspace, int64_t num_splits, int64_t row_groups,
                          int64_t rf, double bmm1, std::optional<Tensor> bmm1_tensor, double bmm2,
                          std::optional<Tensor> bmm2_tensor, bool pdl, int64_t kv_format, bool fp8_tile) {
  check_q_part(q_nope, kDimV, "q_nope");
  check_q_part(q_pe, kRopeDim, "q_pe");
  const Tensor& q = q_nope;
  MLA_INVARIANT(q.scalar_type() == ScalarType::BFloat16 && q_pe.scalar_type() == ScalarType::BFloat16,
                "sparse decode: q must be bf16");
  MLA_INVARIANT(q.size(1) == 1 && q_pe.size(0) == q.size(0) && q_pe.size(1) == 1 && q_pe.size(2) == q.size(2),
                "sparse decode: q_nope and q_pe are [T, 1, H, *] views");
  MLA_INVARIANT(kv_format == 0 || kv_format == 1, "kv_format must be 0 (bf16 rows) or 1 (fp8_ds_mla)");
  const KvFormat format = kv_format == 1 ? KvFormat::kDsMla : KvFormat::kPlain;
  MLA_INVARIANT(!fp8_tile || format == KvFormat::kDsMla, "sparse decode: only fp8_ds_mla rows run an FP8 tile");
  const int64_t row_elems = format == KvFormat::kDsMla ? kDsMlaRowBytes : kHeadDim;
  MLA_INVARIANT(kv.is_cuda() && kv.get_device_index() == q.get_device_index() && kv.dim() == 2 &&
                    kv.size(1) == row_elems && kv.stride(1) == 1 &&
                    kv.scalar_type() == (format == KvFormat::kDsMla ? ScalarType::Byte : ScalarType::BFloat16),
                "kv: [N, ", row_elems, "] ", format == KvFormat::kDsMla ? "uint8" : "bf16",
                " rows on the query's device");
  MLA_INVARIANT(reinterpret_cast<uintptr_t>(kv.data_ptr()) % 16 == 0 &&
                    (kv.size(0) == 1 || kv.stride(0) * kv.element_size() % 16 == 0),
                "kv: start and row stride must be 16-byte aligned");
  MLA_INVARIANT(kv.size(0) <= INT_MAX, "kv: at most 2^31 - 1 rows (int32 slot ids)");
  const int64_t tokens = q.size(0), heads = q.size(2);
  MLA_INVARIANT(indices.scalar_type() == ScalarType::Int && indices.dim() == 2 && indices.size(0) == tokens &&
                    indices.stride(1) == 1 && indices.get_device_index() == q.get_device_index(),
                "indices: int32 [T, K] on the query's device, unit stride along K");
  MLA_INVARIANT(topk_lens.scalar_type() == ScalarType::Int && topk_lens.is_contiguous() &&
                    topk_lens.numel() == tokens && topk_lens.get_device_index() == q.get_device_index(),
                "topk_lens: contiguous int32 [T] on the query's device");
  MLA_INVARIANT(
      out.scalar_type() == ScalarType::BFloat16 && out.is_contiguous() && out.numel() == tokens * heads * kDimV,
      "out: contiguous bf16 [T, H, 512]");
  MLA_INVARIANT(num_splits >= 1 && num_splits <= kMaxSplits, "num_splits must be 1..", kMaxSplits);
  MLA_INVARIANT(heads <= kMaxRows, "heads must be <= ", kMaxRows);

  DecodeParams p = {};
  set_queries_and_outputs(p, q_nope, q_pe, out, lse, tokens * heads, "contiguous fp32 [T, H]", bmm1, bmm1_tensor, bmm2,
                          bmm2_tensor);
  p.kv = static_cast<const uint8_t*>(kv.data_ptr());
  p.kv_pe = p.kv + kDimV * kv.element_size();  // plain rows: the rope columns (fp8_ds_mla's loader knows its own)
  p.block_tables = static_cast<const int*>(indices.data_ptr());
  p.bt_stride = static_cast<int>(indices.stride(0));
  p.seq_lens = static_cast<const int*>(topk_lens.data_ptr());
  p.page_stride = p.pe_page_stride = kv.stride(0) * kv.element_size();  // one-token pages: a row each
  p.token_stride = p.pe_token_stride = 0;
  p.page_shift = 0;
  p.max_pages = static_cast<int>(indices.size(1));
  p.max_seq_len = p.max_pages;
  p.num_pages = static_cast<int>(kv.size(0));
  p.sparse = 1;
  p.causal = 0;
  p.batch = static_cast<int>(tokens);
  p.num_splits = static_cast<int>(num_splits);
  carve_workspace(p, workspace, nullptr);

  const int device = q.get_device_index();
  const torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  if (tokens == 0) return;
  with_tile_shape(fp8_tile, row_groups, rf, LaunchDecode{p, stream, pdl, format});
  launch_merge(p, false, device, stream, pdl);
}

}  // namespace mla
