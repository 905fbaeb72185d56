// The parameter block of one decode call: filled by the decode op (api/decode_op.h) from validated
// tensors, passed by value (__grid_constant__) to the decode and merge kernels. Pointers are raw
// bytes where the element type depends on the dtype (e4m3 or bf16); strides are in bytes.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "common/kernel_constants.h"
#include "schedule/plan_layout.h"

namespace mla {

// How KV rows are stored: the query dtype's plain rows (576 values), or DeepSeek's fp8_ds_mla rows of
// 656 bytes (decode/load_kv_ds_mla.cuh), read with bf16 queries by a BF16 tile or, where
// kDsMlaOnFp8Tiles, an FP8 tile of more than 16 rows.
enum class KvFormat : int { kPlain = 0, kDsMla = 1 };

struct DecodeParams {
  const uint8_t* q_nope;       // [B, q_len, H, 512] latent part of Q, rows contiguous
  const uint8_t* q_pe;         // [B, q_len, H, 64] rope part (a separate tensor or a view of one Q)
  long long q_nope_stride[3];  // bytes between requests, query tokens, heads (multiples of 16)
  long long q_pe_stride[3];
  const uint8_t* kv;        // latent part (512) of the first token row: pages of [page_size, >= 512]
  const uint8_t* kv_pe;     // rope part (64): the same rows 512 elements on, or a separate cache
  const int* block_tables;  // [B, bt_stride] page ids, or FlashInfer's ragged kv_indices (kv_indptr)
  const int* kv_indptr;     // [B + 1]: request b's page ids are block_tables[kv_indptr[b], kv_indptr[b + 1]),
                            // or nullptr: a table of bt_stride columns a request
  const int* seq_lens;      // [B]
  __nv_bfloat16* out;       // [B, q_len, H, 512]
  float* lse;               // [B, q_len, H] natural log, or nullptr
  void* part_o;             // [B, splits, rows, 512] split partials (normalised), when splits > 1:
                            // f16 for plain FP8 rows (|O| <= 448, the e4m3 maximum), else fp32
  float* part_lse;          // [B, splits, rows] log2 domain
  const float* bmm1_ptr;    // device scale or nullptr
  const float* bmm2_ptr;
  float bmm1, bmm2;
  long long page_stride;     // bytes between pages of kv
  long long pe_page_stride;  // ... of kv_pe
  int token_stride;          // bytes between token rows of kv (multiples of 16)
  int pe_token_stride;       // ... of kv_pe
  int q_len, heads, rows;    // rows = q_len * heads
  int heads_recip;           // ceil(2^20 / heads): row / heads == (row * heads_recip) >> 20 for rows < 1024
  int page_shift;            // log2(page_size): 0 for a token-indexed cache (one slot id a token)
  int max_pages;             // block-table columns: never read past them (the ragged ids' count)
  int num_pages;             // pages of the cache: an id outside [0, num_pages) reads as no page
  int sparse;                // 1: entries are per-token slot ids of a sparse index list (page size 1), and
                             // an id outside the cache (-1: an empty entry) is masked out of the softmax
  int max_seq_len;           // the host's bound on seq_lens (<= max_pages * page_size): a guess
                             // that lets page ids be fetched before seq_len arrives
  int causal;                // query token i of q_len sees seq_len - q_len + i + 1 keys; else seq_len
  int bt_stride;
  int batch;        // requests
  int num_splits;   // splits of every request, where there is no plan
  int* plan;        // the split plan (plan/plan_kernel.cuh), or nullptr: see PlanLayout
  int plan_pieces;  // the plan's target of splits per row block of the whole batch
};

// What one decode CTA computes: split `split` of the `splits` of request b, whose split partials
// start at partial row block `first` (read only where splits > 1).
struct WorkItem {
  int b, split, splits, first;
  bool valid;  // false: a CTA past the plan's items, which returns at once
};

// The work item of this CTA: from the plan (grid.y over items) or, without one, from grid.z (request)
// and grid.y (split). Reads the plan: after pdl_wait.
__device__ __forceinline__ WorkItem work_item(const DecodeParams& p) {
  if (p.plan == nullptr) {
    const int b = blockIdx.z;
    return {b, static_cast<int>(blockIdx.y), p.num_splits, b * p.num_splits, true};
  }
  const PlanLayout layout{p.batch, p.plan_pieces};
  const int item = blockIdx.y;
  if (item >= p.plan[0]) return {0, 0, 1, 0, false};
  const int b = p.plan[layout.items() + item];
  return {b, item - p.plan[layout.first_item() + b], p.plan[layout.count() + b], p.plan[layout.first_partial() + b],
          true};
}

// KV tiles per split of a request of `len` tokens cut into `splits` (spread evenly).
__device__ __forceinline__ int tiles_per_split(int len, int splits) {
  return ((len + kBlockN - 1) / kBlockN + splits - 1) / splits;
}

// A request's page ids: its block-table row, or its range of the ragged ids (read from kv_indptr).
struct TableRow {
  const int* ids;
  int entries;  // ids the request owns: never read past them
};
__device__ __forceinline__ TableRow table_row(const DecodeParams& p, int b) {
  if (p.kv_indptr == nullptr) return {p.block_tables + static_cast<long long>(b) * p.bt_stride, p.max_pages};
  const int begin = __ldg(p.kv_indptr + b);
  return {p.block_tables + begin, max(0, min(__ldg(p.kv_indptr + b + 1) - begin, p.max_pages))};
}

// A page id the kernels may read: one in [0, num_pages); -1 for any other (a sparse list's empty entry).
__device__ __forceinline__ int checked_page(const DecodeParams& p, int id) {
  return static_cast<unsigned>(id) < static_cast<unsigned>(p.num_pages) ? id : -1;
}

// A request's length as the kernels read it: never past what its page ids address.
__device__ __forceinline__ int request_len(const DecodeParams& p, int b, int entries) {
  return max(0, min(p.seq_lens[b], entries << p.page_shift));
}

// The first KV position some query row may not see (the softmax masks from the tile holding it on).
__device__ __forceinline__ int first_masked_position(const DecodeParams& p, int seq_len) {
  return p.causal ? seq_len - p.q_len + 1 : seq_len;
}

// The KV tiles [begin, end) split `split` of `splits` of a request of `seq_len` tokens owns (empty past
// its last).
struct SplitTiles {
  int begin, end;
};
__device__ __forceinline__ SplitTiles split_tiles(int seq_len, int split, int splits) {
  const int per_split = tiles_per_split(seq_len, splits), begin = split * per_split;
  return {begin, min((seq_len + kBlockN - 1) / kBlockN, begin + per_split)};
}

// Query token of a row (rows are token-major: row = token * heads + head).
__device__ __forceinline__ int token_of_row(const DecodeParams& p, int row) { return (row * p.heads_recip) >> 20; }

// A scale given as a device tensor (read at run time, so graphs replay with new values) or a value.
__device__ __forceinline__ float read_scale(const float* ptr, float value) {
  return ptr != nullptr ? __ldg(ptr) : value;
}

}  // namespace mla
