// KV tiles from the paged cache into the shared-memory ring. Thread i loads token i / kThreadsPerToken
// of a tile, so it looks up one page per tile; the page id is fetched a tile ahead (page_of), which
// keeps the block-table read off the critical path. Tokens at or past seq_len, and ids outside the
// cache, are zero-filled, so a tile is always whole.
#pragma once

#include <stdint.h>

#include "common/params.h"
#include "common/ptx.cuh"
#include "decode/load_kv_ds_mla.cuh"
#include "decode/tile_config.h"

namespace mla {

// Position in the request of this thread's token of a tile.
template <class C>
__device__ __forceinline__ int kv_pos(int tile) {
  return tile * kBlockN + threadIdx.x / C::kThreadsPerToken;
}

// Page id of the token at pos, or -1 past seq_len or where the id is outside the cache.
__device__ __forceinline__ int page_at(const DecodeParams& p, const int* bt_row, int pos, int seq_len) {
  return pos < seq_len ? checked_page(p, __ldg(bt_row + (pos >> p.page_shift))) : -1;
}

// Page id of this thread's token of a tile, or -1 past seq_len.
template <class C>
__device__ __forceinline__ int page_of(const DecodeParams& p, const int* bt_row, int tile, int seq_len) {
  return page_at(p, bt_row, kv_pos<C>(tile), seq_len);
}

// Token tok of a KV tile (32 tokens x 576) into shared memory, split over kThreads threads of which
// this is the first-th (a loader warp's thread takes a whole token: kThreads 1): its 512 latent dims
// from its row of p.kv, its 64 rope dims from its row of p.kv_pe (one cache's two column ranges, or
// two caches); a token at or past seq_len (page -1) is zero-filled. The rope row's address is formed
// only for its own copies, after the latent ones, so it holds registers briefly.
template <class C, int kThreads>
__device__ __forceinline__ void load_kv_token(uint32_t stage, const DecodeParams& p, int tile, int tok, int first,
                                              int page) {
  constexpr int kLatentChunks = kDimV * C::kElem / 16, kRopeChunks = kRopeDim * C::kElem / 16;
  static_assert(kLatentChunks % kThreads == 0, "each thread's latent chunks stay in the latent part");
  const int slot = (tile * kBlockN + tok) & ((1 << p.page_shift) - 1);
  const int bytes = page >= 0 ? 16 : 0;
  const long long page_offset = page >= 0 ? page : 0;
  const uint32_t dst = stage + tok * C::kSmemRowBytes;
  const uint8_t* latent = p.kv + page_offset * p.page_stride + slot * p.token_stride;
#pragma unroll
  for (int i = 0; i < kLatentChunks / kThreads; ++i) {
    const int col = i * kThreads + first;
    cp_async_16(dst + col * 16, latent + col * 16, bytes);
  }
  const uint8_t* rope = p.kv_pe + page_offset * p.pe_page_stride + slot * p.pe_token_stride;
#pragma unroll
  for (int i = 0; i < (kRopeChunks + kThreads - 1) / kThreads; ++i) {
    const int col = i * kThreads + first;
    if (kRopeChunks % kThreads == 0 || col < kRopeChunks)
      cp_async_16(dst + (kLatentChunks + col) * 16, rope + col * 16, bytes);
  }
}

// One KV tile, every thread of the CTA's kThreads taking its share of a token (raw fp8_ds_mla rows: a
// row as it is, load_kv_ds_mla.cuh).
template <class C>
__device__ __forceinline__ void load_kv_tile(uint32_t stage, const DecodeParams& p, int tile, int page) {
  constexpr int kThreads = C::kThreadsPerToken;
  if constexpr (C::kRawDsMla)
    load_ds_mla_rows<C>(stage, p, tile, page);
  else
    load_kv_token<C, kThreads>(stage, p, tile, threadIdx.x / kThreads, threadIdx.x % kThreads, page);
}

}  // namespace mla
