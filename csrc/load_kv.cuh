// KV tiles from the paged cache into the shared-memory ring. Thread i loads token i / kThreadsPerToken
// of a tile, so it looks up one page per tile; the page id is fetched a tile ahead (page_of), which
// keeps the block-table read off the critical path. Tokens at or past seq_len are zero-filled, so a
// tile is always whole.
#pragma once

#include <stdint.h>

#include "params.h"
#include "ptx.cuh"
#include "tile_config.h"

namespace mla {

// Position in the request of this thread's token of a tile.
template <class C>
__device__ __forceinline__ int kv_pos(int tile) {
  return tile * kBlockN + threadIdx.x / C::kThreadsPerToken;
}

// Page id of that token, or -1 past seq_len.
template <class C>
__device__ __forceinline__ int page_of(const DecodeParams& p, const int* bt_row, int tile, int seq_len) {
  const int pos = kv_pos<C>(tile);
  return pos < seq_len ? __ldg(bt_row + (pos >> p.page_shift)) : -1;
}

// One KV tile (32 tokens x 576) into shared memory; tokens at or past seq_len (page -1) are
// zero-filled.
template <class C>
__device__ __forceinline__ void load_kv_tile(uint32_t stage, const DecodeParams& p, int tile, int page) {
  const int tok = threadIdx.x / C::kThreadsPerToken, first = threadIdx.x % C::kThreadsPerToken;
  const int pos = tile * kBlockN + tok;
  const uint8_t* src = p.kv;
  int bytes = 0;
  if (page >= 0) {
    src += page * p.page_stride + (pos & ((1 << p.page_shift) - 1)) * C::kRowBytes;
    bytes = 16;
  }
  const uint32_t dst = stage + tok * C::kSmemRowBytes;
#pragma unroll
  for (int i = 0; i < C::kChunksPerThread; ++i) {
    const int col = i * C::kThreadsPerToken + first;
    if (C::kChunksPerRow % C::kThreadsPerToken == 0 || col < C::kChunksPerRow) {
      cp_async_16(dst + col * 16, src + col * 16, bytes);
    }
  }
}

}  // namespace mla
