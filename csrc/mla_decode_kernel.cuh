// Paged MLA decode on warp-level mma.sync: one source for sm_120a (native FP8 QMMA), sm_90a and sm_89.
//
// Rows of the MMA are (query token, head) pairs of one request, so 1-128 heads and q_len 1-8 share
// one path. A CTA owns TILE_ROWS rows and a range of KV tiles (split-KV). Its warps form
// ROW_GROUPS x 4: each warp owns RF 16-row fragments and one quarter of the 512 output dims.
//   QK^T: each warp multiplies its rows by a quarter of the 576 dims. FP8 uses m16n8k32 e4m3
//         (QMMA), BF16 m16n8k16.
//   Softmax: the 4 partial scores meet in shared memory; each warp sums them for a quarter of its
//         row group's rows and runs the online softmax there, so it runs once per row, not 4x.
//         P (16-bit) and the per-row rescale factors go back through shared memory.
//   P.V:  P is fetched as A fragments by ldmatrix. BF16 V feeds m16n8k16 bf16 via ldmatrix.trans. FP8 V
//         is widened exactly to f16 (ldmatrix.trans on byte pairs + prmt + cvt.f16x2.e4m3x2) and
//         multiplied with f16 P: P in e4m3 would cost ~4% relative error.
// KV tiles of 32 tokens stream through a cp.async ring; rows are padded by 16 bytes so that
// ldmatrix is free of bank conflicts. With a three-stage ring (FP8) the tiles are software-
// pipelined: QK^T of tile t + 1 is interleaved with P.V of tile t. Shared memory stays under
// SM120's 99 KB per block (the sm_90-only f16-Q variant below takes 112 KB, two CTAs per H100 SM).
// With RF > 1 fragments per warp the accumulators need the registers, so Q moves to shared memory
// and is fetched by ldmatrix. Where e4m3 mma.sync is emulated (sm_90: F2FP + 2 HMMA, with Q
// re-widened every tile), MLA_FP8_QK_VIA_F16 widens Q to f16 once, into shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "kernel_limits.h"

namespace mla {

constexpr int kHeadDim = 576;  // 512 latent (nope) + 64 rope
constexpr int kDimV = 512;
constexpr int kRopeDim = 64;
constexpr int kBlockN = MLA_TOKENS_PER_TILE;  // KV tokens per tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kMaxGrowthLog2 = 8.f;  // online softmax: growth of a row maximum absorbed without rescaling

struct DecodeParams {
  const uint8_t* q_nope;       // [B, q_len, H, 512] latent part of Q, rows contiguous
  const uint8_t* q_pe;         // [B, q_len, H, 64] rope part (a separate tensor or a view of one Q)
  long long q_nope_stride[3];  // bytes between requests, query tokens, heads (multiples of 16)
  long long q_pe_stride[3];
  const uint8_t* kv;        // pages of [page_size, 576]
  const int* block_tables;  // [B, bt_stride]
  const int* seq_lens;      // [B]
  __nv_bfloat16* out;       // [B, q_len, H, 512]
  float* lse;               // [B, q_len, H] natural log, or nullptr
  void* part_o;             // [B, splits, rows, 512] split partials (normalised), when splits > 1:
                            // f16 for FP8 KV (|O| <= 448, the e4m3 maximum), else fp32
  float* part_lse;          // [B, splits, rows] log2 domain
  const float* bmm1_ptr;    // device scale or nullptr
  const float* bmm2_ptr;
  float bmm1, bmm2;
  long long page_stride;   // bytes between pages
  int q_len, heads, rows;  // rows = q_len * heads
  int heads_recip;         // ceil(2^20 / heads): row / heads == (row * heads_recip) >> 20 for rows < 1024
  int page_shift;          // log2(page_size)
  int max_pages;           // block-table columns: never read past them
  int max_seq_len;         // the host's bound on seq_lens (<= max_pages * page_size): a guess
                           // that lets page ids be fetched before seq_len arrives
  int bt_stride;
  int num_splits;
};

#ifdef MLA_FP8_QK_VIA_F16
constexpr bool kFp8QkViaF16 = true;
constexpr int kMaxSmemPerBlock = 227 * 1024;  // sm_90
#else
constexpr bool kFp8QkViaF16 = false;
constexpr int kMaxSmemPerBlock = 99 * 1024;  // SM120 allows 99 KB of shared memory per block
#endif

template <bool FP8, int ROW_GROUPS, int RF>
struct TileConfig {
  static constexpr int kElem = FP8 ? 1 : 2;
  static constexpr int kWarps = 4 * ROW_GROUPS;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowsPerWarp = 16 * RF;
  static constexpr int kTileRows = kRowsPerWarp * ROW_GROUPS;
  static constexpr int kStages = FP8 ? 3 : 2;
  static constexpr int kRowBytes = kHeadDim * kElem;
  static constexpr int kSmemRowBytes = kRowBytes + 16;  // 16-byte pad: ldmatrix rows hit distinct banks
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kStageBytes = kBlockN * kSmemRowBytes;
  // Partial scores of the four dim quarters, kBlockN floats per row, XOR-swizzled (score_index).
  static constexpr int kScoreBytes = 4 * kTileRows * kBlockN * 4;
  // Softmax runs once per row: each warp of a row group owns a quarter of the group's rows.
  static constexpr int kSoftRows = kRowsPerWarp / 4;
  // P (f16 for FP8, bf16 for BF16) for the P.V A fragments; 16-byte row pad for ldmatrix.
  static constexpr int kPRowBytes = kBlockN * 2 + 16;
  static constexpr int kPBytes = kTileRows * kPRowBytes;
  static constexpr int kCorrBytes = kTileRows * 4;  // per-row rescale factor of the tile
  static constexpr bool kQInSmem = RF > 1;
  static constexpr bool kQkF16 = FP8 && kFp8QkViaF16 && kQInSmem;  // Q widened to f16 once
  static constexpr int kQElem = kQkF16 ? 2 : kElem;
  static constexpr int kSmemQRowBytes = kHeadDim * kQElem + 16;
  static constexpr int kQBytes = kQInSmem ? kTileRows * kSmemQRowBytes : 0;
  static constexpr int kSmemBytes = kStages * kStageBytes + kScoreBytes + kQBytes + kPBytes + kCorrBytes;
  // The loader gives each token of a tile kThreadsPerToken threads (one page lookup per thread).
  static constexpr int kThreadsPerToken = kThreads / kBlockN;
  static constexpr int kChunksPerThread = (kChunksPerRow + kThreadsPerToken - 1) / kThreadsPerToken;
  // QK^T works on 32-byte column chunks (one k32 fp8 step or one k16 bf16 step): each warp takes
  // a quarter of the latent dims, and the rope chunks go one per warp from warp 0.
  static constexpr int kNopeChunks = kDimV * kElem / 32 / 4;
  static constexpr int kRopeChunks = kRopeDim * kElem / 32;
  static constexpr int kQkChunks = kNopeChunks + 1;
  // Widened to f16, QK^T runs in k16 steps of 16 K bytes: 36 per row, spread evenly over the warps.
  static constexpr int kF16StepsPerWarp = kRowBytes / 16 / 4;
  static_assert(kSmemBytes <= kMaxSmemPerBlock, "tile does not fit the shared memory of a block");
  static_assert(kThreads % kBlockN == 0, "the loader maps whole tokens to threads");
  static_assert(kRopeChunks <= 4, "rope chunks are spread one per warp");
  static_assert(kSoftRows % 4 == 0 && kBlockN == 32, "softmax: 8 lanes per row, 4 tokens per lane");
};

// ---------------------------------------------------------------------------------------------
// PTX wrappers
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d));
}

__device__ __forceinline__ void st_shared_v2(uint32_t addr, uint32_t a, uint32_t b) {
  asm volatile("st.shared.v2.u32 [%0], {%1,%2};\n" ::"r"(addr), "r"(a), "r"(b));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D += A.B with fp32 accumulators; A row-major (4 regs), B column-major (2 regs). The wrappers
// differ only in the instruction: e4m3 16x8x32 (QMMA), bf16 and f16 16x8x16 (HMMA).
#define MLA_DEFINE_MMA(name, instruction)                                                                 \
  __device__ __forceinline__ void name(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { \
    asm volatile(instruction " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                   \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                         \
  }
MLA_DEFINE_MMA(mma_e4m3, "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32")
MLA_DEFINE_MMA(mma_bf16, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
MLA_DEFINE_MMA(mma_f16, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
#undef MLA_DEFINE_MMA

// Four e4m3 values (low byte first) -> two f16x2 (bytes 0-1, bytes 2-3), exact. Taking the halves
// apart in PTX lets F2FP read the upper half directly (R.H1) instead of after a shift.
__device__ __forceinline__ void e4m3x4_to_f16x4(uint32_t packed, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(packed));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <bool F16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (F16) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

template <bool F16>
__device__ __forceinline__ float2 unpack2(uint32_t packed) {
  if constexpr (F16) {
    return __half22float2(*reinterpret_cast<const __half2*>(&packed));
  } else {
    return make_float2(__uint_as_float(packed << 16), __uint_as_float(packed & 0xffff0000u));
  }
}

// Programmatic dependent launch: wait for the previous kernel's writes before the first global
// read, and let the next kernel start its prologue early.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

// Accumulator arrays (O and the scores) start at zero.
template <int A, int B, int N>
__device__ __forceinline__ void zero_fill(float (&x)[A][B][N]) {
#pragma unroll
  for (int a = 0; a < A; ++a)
#pragma unroll
    for (int i = 0; i < B; ++i)
#pragma unroll
      for (int n = 0; n < N; ++n) x[a][i][n] = 0.f;
}

__device__ __forceinline__ float read_scale(const float* ptr, float value) {
  return ptr != nullptr ? __ldg(ptr) : value;
}

// ---------------------------------------------------------------------------------------------
// KV tiles: thread i loads token i / kThreadsPerToken of a tile, so it looks up one page per tile.
// The page id is fetched a tile ahead (page_of), keeping the block-table read off the critical path.
template <class C>
__device__ __forceinline__ int kv_pos(int tile) {
  return tile * kBlockN + threadIdx.x / C::kThreadsPerToken;
}

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

// Start of Q row `row` of request b (query token row / heads, head row % heads): its latent part
// and its rope part (two tensors, or views of one).
struct QRow {
  const uint8_t* nope;
  const uint8_t* pe;
};
// Query token of a row (rows are token-major: row = token * heads + head).
__device__ __forceinline__ int token_of_row(const DecodeParams& p, int row) { return (row * p.heads_recip) >> 20; }

__device__ __forceinline__ QRow q_row(const DecodeParams& p, int b, int row) {
  const int token = token_of_row(p, row), head = row - token * p.heads;
  return {p.q_nope + b * p.q_nope_stride[0] + token * p.q_nope_stride[1] + head * p.q_nope_stride[2],
          p.q_pe + b * p.q_pe_stride[0] + token * p.q_pe_stride[1] + head * p.q_pe_stride[2]};
}
// Byte `byte` of the 576-element row: latent bytes first, then rope.
template <class C>
__device__ __forceinline__ const uint8_t* q_byte(const QRow& r, int byte) {
  constexpr int kNopeBytes = kDimV * C::kElem;
  return byte < kNopeBytes ? r.nope + byte : r.pe + (byte - kNopeBytes);
}

struct NoQTileLoad {};  // Q in registers

// Q of the CTA's rows into shared memory (FP8 tiles of 32 rows; rows past the problem are zero).
// Warp w takes rows 8w..8w+7: lane l loads the latent 16-byte chunk l of each of them and rope
// chunk l % 4 of row 8w + l / 4, so each row's address is worked out once per warp.
// As stored, Q is e4m3. Widened to f16, the 32 k of each e4m3 chunk are permuted so that ldmatrix
// hands every thread the k that F2FP unpacks from its K registers: bytes 4t..4t+3 of a 16-byte
// half become f16 positions (2t, 2t+1, 8+2t, 9+2t).
// Two phases, so that the global loads go out first, before the seq_len -> page id -> KV chain:
// issue() loads (cp.async: straight into shared memory; f16: into registers), finish() widens and
// stores (f16 only).
template <class C>
struct QTileLoad {
  static constexpr int kRows = 8, kNopeChunks16 = kDimV / 16, kRopeChunks16 = kRopeDim / 16;
  static_assert(C::kElem == 1 && C::kTileRows == kRows * C::kWarps, "QTileLoad maps 8 FP8 rows to a warp");
  static_assert(kNopeChunks16 == 32 && kRows * kRopeChunks16 == 32, "one latent chunk per lane and row");
  // Tile row and 16-byte column of this lane's chunks: kRows latent ones, then one rope.
  int row[kRows + 1], col[kRows + 1];
  uint4 raw[C::kQkF16 ? kRows + 1 : 1];

  __device__ __forceinline__ void issue(uint32_t q_smem, const DecodeParams& p, int b, int row0) {
    const int lane = threadIdx.x & 31, first = (threadIdx.x >> 5) * kRows;
    const uint8_t* src[kRows + 1];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row[r] = first + r;
      col[r] = lane;
      src[r] = row0 + row[r] < p.rows ? q_row(p, b, row0 + row[r]).nope + lane * 16 : nullptr;
    }
    row[kRows] = first + lane / kRopeChunks16;
    col[kRows] = kNopeChunks16 + lane % kRopeChunks16;
    src[kRows] = row0 + row[kRows] < p.rows ? q_row(p, b, row0 + row[kRows]).pe + lane % kRopeChunks16 * 16 : nullptr;
#pragma unroll
    for (int i = 0; i <= kRows; ++i) {
      if constexpr (C::kQkF16) {
        raw[i] = src[i] ? __ldg(reinterpret_cast<const uint4*>(src[i])) : make_uint4(0u, 0u, 0u, 0u);
      } else {
        cp_async_16(q_smem + row[i] * C::kSmemQRowBytes + col[i] * 16, src[i] ? src[i] : p.q_nope, src[i] ? 16 : 0);
      }
    }
  }

  // f16: a 16-byte chunk is one k16 half; its four words' low pairs fill the first 16 bytes of
  // the f16 half, high pairs the rest.
  __device__ __forceinline__ void finish(uint32_t q_smem) const {
    if constexpr (C::kQkF16) {
#pragma unroll
      for (int i = 0; i <= kRows; ++i) {
        const uint32_t dst = q_smem + row[i] * C::kSmemQRowBytes + col[i] * 32;
        const uint32_t w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) e4m3x4_to_f16x4(w[k], lo[k], hi[k]);
        st_shared_v4(dst, lo[0], lo[1], lo[2], lo[3]);
        st_shared_v4(dst + 16, hi[0], hi[1], hi[2], hi[3]);
      }
    }
  }
};

template <bool FP8, int ROW_GROUPS, int RF>
__global__ void __launch_bounds__(TileConfig<FP8, ROW_GROUPS, RF>::kThreads)
    mla_decode_kernel(const __grid_constant__ DecodeParams p) {
  using C = TileConfig<FP8, ROW_GROUPS, RF>;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t kv_smem = smem_u32(smem);
  float* scores = reinterpret_cast<float*>(smem + C::kStages * C::kStageBytes);
  // Swizzle: a row's 8-float groups are XOR-ed with row & 3, so that float2 stores from the MMA
  // layout (rows g, columns 8j + 2t) and float4 loads along a row are both free of bank conflicts.
  auto score_index = [](int row, int col) { return row * kBlockN + (col ^ ((row & 3) << 3)); };

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wd = warp & 3, wr = warp >> 2;  // dim quarter, row group
  const int g = lane >> 2, t = lane & 3;
  const int b = blockIdx.z, split = blockIdx.y;

  pdl_wait();
  pdl_launch_dependents();

  // The global reads that do not depend on seq_len go out first: Q, and the page ids of this
  // split's first tiles as if seq_len were max_seq_len (right for the longest requests; checked
  // below, re-read where wrong). Then seq_len -> page id -> KV is one round trip shorter.
  const uint32_t q_smem = kv_smem + C::kStages * C::kStageBytes + C::kScoreBytes;
  [[maybe_unused]] std::conditional_t<C::kQInSmem, QTileLoad<C>, NoQTileLoad> q_load;
  if constexpr (C::kQInSmem) q_load.issue(q_smem, p, b, blockIdx.x * C::kTileRows);
  const int* bt_row = p.block_tables + (long long)b * p.bt_stride;
  auto tiles_per_split = [&](int len) { return ((len + kBlockN - 1) / kBlockN + p.num_splits - 1) / p.num_splits; };
  const int guess_len = p.max_seq_len, guess_begin = split * tiles_per_split(guess_len);
  int guessed_page[C::kStages - 1];
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) guessed_page[s] = page_of<C>(p, bt_row, guess_begin + s, guess_len);

  const int seq_len = max(0, min(p.seq_lens[b], p.max_pages << p.page_shift));
  const int n_tiles = (seq_len + kBlockN - 1) / kBlockN;
  const int per_split = tiles_per_split(seq_len);
  const int tile_begin = split * per_split;
  const int tile_end = min(n_tiles, tile_begin + per_split);
  // Page id of this thread's token in tile tile_begin + s: the guess where it read the right entry.
  auto first_page = [&](int s) {
    const int pos = kv_pos<C>(tile_begin + s);
    if (tile_begin == guess_begin && (pos < guess_len || pos >= seq_len)) return pos < seq_len ? guessed_page[s] : -1;
    return page_of<C>(p, bt_row, tile_begin + s, seq_len);
  };

  // Rows of this thread: fragment f, half h -> row = warp_row0 + 16 f + 8 h + g.
  const int warp_row0 = blockIdx.x * C::kTileRows + wr * C::kRowsPerWarp;
  // Causal over the q_len new tokens: row r sees positions < seq_len - q_len + r / heads + 1, so
  // only tiles reaching past seq_len - q_len need a mask (rows past the problem have Q = 0).
  const int first_masked = seq_len - p.q_len + 1;

  // Q: fragments in registers for the whole KV range (RF == 1), or in shared memory (RF > 1).
  auto chunk_byte = [&](int s) {
    return s < C::kNopeChunks ? (wd * C::kNopeChunks + s) * 32 : kDimV * C::kElem + wd * 32;
  };
  const bool has_rope = wd < C::kRopeChunks;
  const uint32_t p_smem = q_smem + C::kQBytes;
  float* corr_smem =
      reinterpret_cast<float*>(smem + C::kStages * C::kStageBytes + C::kScoreBytes + C::kQBytes + C::kPBytes);
  uint32_t qf[C::kQInSmem ? 1 : RF][C::kQkChunks][4];
  if constexpr (!C::kQInSmem) {
#pragma unroll
    for (int f = 0; f < RF; ++f)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp_row0 + 16 * f + 8 * h + g;
        const QRow r = q_row(p, b, row);
#pragma unroll
        for (int s = 0; s < C::kQkChunks; ++s)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const bool valid = row < p.rows && (s < C::kNopeChunks || has_rope);
            const uint8_t* src = q_byte<C>(r, chunk_byte(s) + 16 * half + 4 * t);
            qf[f][s][2 * half + h] = valid ? __ldg(reinterpret_cast<const uint32_t*>(src)) : 0u;
          }
      }
  }
  // Tile-local row of this thread's fragment f, half h (accumulator layout).
  auto local_row = [=](int f, int h) { return wr * C::kRowsPerWarp + 16 * f + 8 * h + g; };
  // A fragment f (16 rows x 16 bytes at byte offset `byte`) of a row-major matrix in shared memory.
  auto ldmatrix_a = [&](uint32_t (&a)[4], uint32_t base, int pitch, int f, int byte) {
    ldmatrix_x4(a, base + (wr * C::kRowsPerWarp + 16 * f + (lane & 15)) * pitch + byte + 16 * (lane >> 4));
  };

  const float scale_log2 = read_scale(p.bmm1_ptr, p.bmm1) * kLog2e;
  float acc[RF][16][4];
  zero_fill(acc);
  // Softmax state of the rows this lane reduces: row soft_row0 + 4 i + lane / 8 (tile-local), whose
  // 8 lanes hold 4 tokens each of a tile.
  constexpr int kSoftPerLane = C::kSoftRows / 4;
  const int soft_row0 = wr * C::kRowsPerWarp + wd * C::kSoftRows;
  float row_max[kSoftPerLane], row_sum[kSoftPerLane];
#pragma unroll
  for (int i = 0; i < kSoftPerLane; ++i) {
    row_max[i] = -INFINITY;
    row_sum[i] = 0.f;
  }

#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (tile_begin + s < tile_end) load_kv_tile<C>(kv_smem + s * C::kStageBytes, p, tile_begin + s, first_page(s));
    // Q joins the first tile's group (cp.async), or is widened to f16 while the tiles load.
    if constexpr (C::kQInSmem) {
      if (s == 0) q_load.finish(q_smem);
    }
    cp_async_commit();
  }
  int next_page = page_of<C>(p, bt_row, tile_begin + C::kStages - 1, seq_len);
  // Ring positions (byte offsets) of the tile read now and of the tile loaded now, rotated by
  // compare-and-wrap rather than a modulo.
  uint32_t read_off = 0, fill_off = (C::kStages - 1) * C::kStageBytes;
  auto advance = [](uint32_t off) {
    return off + C::kStageBytes == C::kStages * C::kStageBytes ? 0u : off + C::kStageBytes;
  };
  auto load_ahead = [&](int tile) {  // tile + kStages - 1 into the stage freed last
    const int next = tile + C::kStages - 1;
    if (next < tile_end) load_kv_tile<C>(kv_smem + fill_off, p, next, next_page);
    cp_async_commit();
    next_page = page_of<C>(p, bt_row, next + 1, seq_len);  // consumed next iteration
    fill_off = advance(fill_off);
  };
  // QK^T of one tile, step by step: partial scores over this warp's dims, K fragments via ldmatrix.
  constexpr int kQkSteps = C::kQkF16 ? C::kF16StepsPerWarp : C::kQkChunks;
  auto qk_step = [&](float (&sc)[RF][4][4], uint32_t stage, int i) {
    if constexpr (C::kQkF16) {
      // k16 steps of 16 bytes: 36 per row (latent and rope alike), 9 per warp. One ldmatrix.x4
      // takes a step of all 32 tokens (matrix j = tokens 8j..8j+7); register j holds bytes
      // 4t..4t+3, whose two f16 pairs are B of the widened (permuted) Q.
      const int step = wd * C::kF16StepsPerWarp + i;
      uint32_t kb[4];
      ldmatrix_x4(kb, stage + lane * C::kSmemRowBytes + 16 * step);
      uint32_t qa[RF][4];
#pragma unroll
      for (int f = 0; f < RF; ++f) ldmatrix_a(qa[f], q_smem, C::kSmemQRowBytes, f, 32 * step);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t lo, hi;
        e4m3x4_to_f16x4(kb[j], lo, hi);
#pragma unroll
        for (int f = 0; f < RF; ++f) mma_f16(sc[f][j], qa[f], lo, hi);
      }
    } else {
      if (i == C::kNopeChunks && !has_rope) return;
      uint32_t qa[RF][4];
#pragma unroll
      for (int f = 0; f < RF; ++f) {
        if constexpr (C::kQInSmem)
          ldmatrix_a(qa[f], q_smem, C::kSmemQRowBytes, f, chunk_byte(i));
        else
#pragma unroll
          for (int r = 0; r < 4; ++r) qa[f][r] = qf[f][i][r];
      }
#pragma unroll
      for (int jp = 0; jp < 2; ++jp) {  // n-tile pairs (16 tokens)
        const int mi = lane >> 3;
        const int tok = 16 * jp + 8 * (mi >> 1) + (lane & 7);
        uint32_t kb[4];
        ldmatrix_x4(kb, stage + tok * C::kSmemRowBytes + chunk_byte(i) + 16 * (mi & 1));
#pragma unroll
        for (int f = 0; f < RF; ++f) {
          if constexpr (FP8) {
            mma_e4m3(sc[f][2 * jp], qa[f], kb[0], kb[1]);
            mma_e4m3(sc[f][2 * jp + 1], qa[f], kb[2], kb[3]);
          } else {
            mma_bf16(sc[f][2 * jp], qa[f], kb[0], kb[1]);
            mma_bf16(sc[f][2 * jp + 1], qa[f], kb[2], kb[3]);
          }
        }
      }
    }
  };
  // O += P.V over this warp's 128 output dims, one 16-token x 32-dim (FP8) or x 16-dim (BF16)
  // block of V per step.
  constexpr int kPvSteps = FP8 ? 8 : 16;
  auto pv_step = [&](const uint32_t (&pf)[RF][2][4], uint32_t stage, int i) {
    constexpr int kPerK = kPvSteps / 2;
    const int kk = i / kPerK, q = i % kPerK;
    const int mi = lane >> 3;
    const int tok = 16 * kk + 8 * (mi & 1) + (lane & 7);
    uint32_t vr[4];
    if constexpr (FP8) {
      // x4.trans over byte pairs: 16 tokens x 32 dims. Register r holds tokens (2t, 2t+1) of dims
      // (2g, 2g+1) of its 16-byte column; prmt splits even and odd dims, cvt widens to f16.
      ldmatrix_x4_trans(vr, stage + tok * C::kSmemRowBytes + wd * 128 + q * 32 + 16 * (mi >> 1));
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        // tokens 2t.. and 8+2t..: [even dims | odd dims] -> f16 B fragments of both dim groups
        uint32_t even[2], odd[2];
        e4m3x4_to_f16x4(__byte_perm(vr[2 * half], 0, 0x3120), even[0], odd[0]);
        e4m3x4_to_f16x4(__byte_perm(vr[2 * half + 1], 0, 0x3120), even[1], odd[1]);
#pragma unroll
        for (int f = 0; f < RF; ++f) {
          mma_f16(acc[f][q * 4 + half * 2], pf[f][kk], even[0], even[1]);
          mma_f16(acc[f][q * 4 + half * 2 + 1], pf[f][kk], odd[0], odd[1]);
        }
      }
    } else {
      ldmatrix_x4_trans(vr, stage + tok * C::kSmemRowBytes + (wd * 128 + q * 16 + 8 * (mi >> 1)) * 2);
#pragma unroll
      for (int f = 0; f < RF; ++f) {
        mma_bf16(acc[f][2 * q], pf[f][kk], vr[0], vr[1]);
        mma_bf16(acc[f][2 * q + 1], pf[f][kk], vr[2], vr[3]);
      }
    }
  };

  // With three stages the tiles are software-pipelined, two barriers per tile: QK^T of tile t + 1
  // runs interleaved with P.V of tile t (two independent MMA chains per warp hide each other's
  // latency); the refill goes out after the score barrier (its stage was last read by the previous
  // P.V) and the next tile is waited for at the barrier before P.V, a whole tile after it was
  // issued. With two stages the refilled stage is the one this tile's P.V reads, so each tile
  // starts with a barrier of its own and runs QK^T, softmax, P.V in turn.
  constexpr bool kPipelined = C::kStages >= 3;
  float sc[RF][4][4];
  if constexpr (kPipelined) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    zero_fill(sc);
    if (tile_begin < tile_end) {
#pragma unroll
      for (int i = 0; i < kQkSteps; ++i) qk_step(sc, kv_smem, i);
    }
  }

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const uint32_t stage = kv_smem + read_off;
    read_off = advance(read_off);
    if constexpr (!kPipelined) {
      cp_async_wait<C::kStages - 2>();
      __syncthreads();  // this tile landed for all; every warp is done with the stage refilled next
      load_ahead(tile);
      zero_fill(sc);
#pragma unroll
      for (int i = 0; i < kQkSteps; ++i) qk_step(sc, stage, i);
    }

    // ---- the four dim-quarter partials go to shared memory; each warp then sums them for its own
    // share of the row group's rows and runs the online softmax there, once per row.
    {
      float* mine = scores + wd * C::kTileRows * kBlockN;
#pragma unroll
      for (int f = 0; f < RF; ++f)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int j = 0; j < 4; ++j)
            *reinterpret_cast<float2*>(mine + score_index(local_row(f, h), 8 * j + 2 * t)) =
                make_float2(sc[f][j][2 * h], sc[f][j][2 * h + 1]);
    }
    __syncthreads();  // partial scores complete; every warp is past the previous tile's P.V
    if constexpr (kPipelined) load_ahead(tile);
    const bool masked_tile = (tile + 1) * kBlockN > first_masked;
#pragma unroll
    for (int i = 0; i < kSoftPerLane; ++i) {
      const int row = soft_row0 + 4 * i + (lane >> 3), tok0 = 4 * (lane & 7);
      float x[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 v = *reinterpret_cast<const float4*>(scores + q * C::kTileRows * kBlockN + score_index(row, tok0));
        x[0] += v.x;
        x[1] += v.y;
        x[2] += v.z;
        x[3] += v.w;
      }
      // Causal limit of the row (log2 domain from here on).
      const int limit = masked_tile ? first_masked + token_of_row(p, blockIdx.x * C::kTileRows + row) : seq_len;
      float mx = -INFINITY;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        x[e] = tile * kBlockN + tok0 + e < limit ? x[e] * scale_log2 : -INFINITY;
        mx = fmaxf(mx, x[e]);
      }
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      // The reference maximum stays stale until the row maximum outgrows it by 2^kMaxGrowthLog2:
      // P <= 2^8 is still exact enough in f16/bf16, the sum and the accumulators share the stale
      // reference (it cancels in O and the LSE), and the accumulators are rescaled only then. Until
      // a row sees a finite score its accumulators are zero and need no rescale either.
      const float old = row_max[i];
      const float new_max = fmaxf(old, mx);
      const bool rescale = old != -INFINITY && new_max > old + kMaxGrowthLog2;
      const float ref = old == -INFINITY || rescale ? new_max : old;
      const float base = ref == -INFINITY ? 0.f : ref;  // a row with nothing visible yet
      const float correction = rescale ? fast_exp2(old - ref) : 1.f;
      row_max[i] = ref;
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = fast_exp2(x[e] - base);
      const uint32_t p01 = pack2<FP8>(x[0], x[1]), p23 = pack2<FP8>(x[2], x[3]);
      // The sum is taken over P as rounded for P.V, so a dominant key's rounding cancels in O (with
      // a stale maximum its P is no longer exactly 1).
      const float2 r01 = unpack2<FP8>(p01), r23 = unpack2<FP8>(p23);
      row_sum[i] = row_sum[i] * correction + ((r01.x + r01.y) + (r23.x + r23.y));
      st_shared_v2(p_smem + row * C::kPRowBytes + tok0 * 2, p01, p23);
      if ((lane & 7) == 0) corr_smem[row] = correction;  // exactly 1 unless rescaled
    }
    if constexpr (kPipelined) cp_async_wait<C::kStages - 2>();  // the next tile, for its QK^T
    __syncthreads();                                            // P and the rescale factors complete

    // ---- rescale this warp's accumulators where a row's reference maximum was raised; P as A fragments.
    {
      float corr[RF][2];
      bool rescale = false;
#pragma unroll
      for (int f = 0; f < RF; ++f)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          corr[f][h] = corr_smem[local_row(f, h)];
          rescale |= corr[f][h] != 1.f;
        }
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int f = 0; f < RF; ++f)
#pragma unroll
          for (int n = 0; n < 16; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[f][n][i] *= corr[f][i >> 1];
      }
    }
    uint32_t pf[RF][2][4];  // [f][k16 step][reg]
#pragma unroll
    for (int f = 0; f < RF; ++f)
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) ldmatrix_a(pf[f][kk], p_smem, C::kPRowBytes, f, kk * 32);

    // ---- O += P.V; in the pipeline, interleaved step by step with QK^T of the next tile.
    if (kPipelined && tile + 1 < tile_end) {
      const uint32_t next_stage = kv_smem + read_off;
      zero_fill(sc);
#pragma unroll
      for (int i = 0; i < (kQkSteps > kPvSteps ? kQkSteps : kPvSteps); ++i) {
        if (i < kQkSteps) qk_step(sc, next_stage, i);
        if (i < kPvSteps) pv_step(pf, stage, i);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kPvSteps; ++i) pv_step(pf, stage, i);
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: the row owners publish 1 / sum and the LSE (in the score buffer: the last tile's
  // sums are done), then each warp normalises its dims: bf16 output + LSE, or the split partials.
  float2* row_stats = reinterpret_cast<float2*>(scores);
#pragma unroll
  for (int i = 0; i < kSoftPerLane; ++i) {
    float total = row_sum[i];
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    if ((lane & 7) == 0)
      row_stats[soft_row0 + 4 * i + (lane >> 3)] =
          total > 0.f ? make_float2(1.f / total, row_max[i] + __log2f(total)) : make_float2(0.f, -INFINITY);
  }
  __syncthreads();
  const float bmm2 = read_scale(p.bmm2_ptr, p.bmm2);
  const bool single = p.num_splits == 1;
#pragma unroll
  for (int f = 0; f < RF; ++f)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row0 + 16 * f + 8 * h + g;
      if (row >= p.rows) continue;
      const float2 stats = row_stats[local_row(f, h)];
      const float inv = stats.x, lse2 = stats.y;
      const float out_scale = single ? inv * bmm2 : inv;
      const long long out_row =
          single ? (long long)b * p.rows + row : ((long long)b * p.num_splits + split) * p.rows + row;
#pragma unroll
      for (int q = 0; q < (FP8 ? 8 : 16); ++q) {
        // FP8 tiles pair up (even dims, odd dims) into 4 consecutive dims; BF16 tiles hold 2.
        float v[4];
        int dim;
        if constexpr (FP8) {
          const float* ev = acc[f][2 * q];
          const float* od = acc[f][2 * q + 1];
          v[0] = ev[2 * h];
          v[1] = od[2 * h];
          v[2] = ev[2 * h + 1];
          v[3] = od[2 * h + 1];
          dim = wd * 128 + q * 16 + 4 * t;
        } else {
          v[0] = acc[f][q][2 * h];
          v[1] = acc[f][q][2 * h + 1];
          dim = wd * 128 + q * 8 + 2 * t;
        }
        constexpr int kVec = FP8 ? 4 : 2;
        if (single) {
          __nv_bfloat16* dst = p.out + out_row * kDimV + dim;
          uint32_t packed[2];
#pragma unroll
          for (int i = 0; i < kVec / 2; ++i) packed[i] = pack2<false>(v[2 * i] * out_scale, v[2 * i + 1] * out_scale);
          if constexpr (kVec == 4)
            *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);
          else
            *reinterpret_cast<uint32_t*>(dst) = packed[0];
        } else if constexpr (FP8) {  // half the merge traffic of fp32
          __half* dst = static_cast<__half*>(p.part_o) + out_row * kDimV + dim;
          *reinterpret_cast<uint2*>(dst) =
              make_uint2(pack2<true>(v[0] * inv, v[1] * inv), pack2<true>(v[2] * inv, v[3] * inv));
        } else {
          float* dst = static_cast<float*>(p.part_o) + out_row * kDimV + dim;
          *reinterpret_cast<float2*>(dst) = make_float2(v[0] * inv, v[1] * inv);
        }
      }
      if (wd == 0 && t == 0) {
        if (!single)
          p.part_lse[out_row] = lse2;
        else if (p.lse != nullptr)
          p.lse[out_row] = lse2 * kLn2;
      }
    }
}

// Combine split partials by their LSE. One block per (request, row, slice of 128 dims), so even
// one request's merge spreads over the GPU. Each warp takes every kMergeGroups-th split of the
// slice (4 dims per lane), so the loads of all splits are in flight at once; the LSE pass over
// the splits is shared by all threads of the block.
constexpr int kMergeGroups = 8;
constexpr int kMergeThreads = 32 * kMergeGroups;
constexpr int kMergeSliceDims = 128;
constexpr int kMergeSlices = kDimV / kMergeSliceDims;
constexpr int kMergeBatch = 8;  // splits per warp loaded ahead of the LSE pass
constexpr int kMaxSplits = MLA_MAX_KV_SPLITS;
static_assert(kMaxSplits <= kMergeThreads, "one thread per split in the LSE pass");

template <bool HALF_PARTIALS>
__global__ void __launch_bounds__(kMergeThreads) mla_merge_splits_kernel(const __grid_constant__ DecodeParams p) {
  __shared__ float weights[kMaxSplits];
  __shared__ float reduce[kMergeThreads / 32];
  __shared__ float4 partial[kMergeGroups - 1][32];
  pdl_wait();
  const int row = blockIdx.x, b = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long first = (long long)b * p.num_splits * p.rows + row;
  const int dim = blockIdx.z * kMergeSliceDims + lane * 4;
  auto load_partial = [&](int s) {  // 4 dims of split s
    const long long at = (first + (long long)s * p.rows) * kDimV + dim;
    if constexpr (HALF_PARTIALS) {
      const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __half*>(p.part_o) + at);
      const float2 lo = unpack2<true>(raw.x), hi = unpack2<true>(raw.y);
      return make_float4(lo.x, lo.y, hi.x, hi.y);
    } else {
      return *reinterpret_cast<const float4*>(static_cast<const float*>(p.part_o) + at);
    }
  };
  // The first kMergeBatch splits of this warp are loaded before the LSE pass, so that their L2
  // round trip overlaps the LSE one (empty splits wrote zeros).
  float4 early[kMergeBatch];
#pragma unroll
  for (int i = 0; i < kMergeBatch; ++i) {
    const int s = warp + i * kMergeGroups;
    early[i] = s < p.num_splits ? load_partial(s) : make_float4(0.f, 0.f, 0.f, 0.f);
  }

  float lse = -INFINITY;
  if (threadIdx.x < p.num_splits) lse = p.part_lse[first + (long long)threadIdx.x * p.rows];
  float best = lse;
  for (int o = 16; o > 0; o >>= 1) best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, o));
  if (lane == 0) reduce[warp] = best;
  __syncthreads();
  best = -INFINITY;
  for (int w = 0; w < kMergeThreads / 32; ++w) best = fmaxf(best, reduce[w]);
  const float base = best == -INFINITY ? 0.f : best;
  const float w_own = threadIdx.x < p.num_splits ? fast_exp2(lse - base) : 0.f;
  if (threadIdx.x < p.num_splits) weights[threadIdx.x] = w_own;
  float sum = w_own;
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  __syncthreads();  // weights[] complete; reduce[] reads of the max are done
  if (lane == 0) reduce[warp] = sum;
  __syncthreads();
  float weight_sum = 0.f;
  for (int w = 0; w < kMergeThreads / 32; ++w) weight_sum += reduce[w];

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  auto add = [&](float w, const float4& v) {
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  };
#pragma unroll
  for (int i = 0; i < kMergeBatch; ++i) {
    const int s = warp + i * kMergeGroups;
    if (s < p.num_splits) add(weights[s], early[i]);
  }
#pragma unroll 4
  for (int s = warp + kMergeBatch * kMergeGroups; s < p.num_splits; s += kMergeGroups) add(weights[s], load_partial(s));
  if (warp > 0) partial[warp - 1][lane] = acc;
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int g = 0; g < kMergeGroups - 1; ++g) {
    const float4 v = partial[g][lane];
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  const float scale = weight_sum > 0.f ? read_scale(p.bmm2_ptr, p.bmm2) / weight_sum : 0.f;
  const long long out_row = (long long)b * p.rows + row;
  const uint2 packed =
      make_uint2(pack2<false>(acc.x * scale, acc.y * scale), pack2<false>(acc.z * scale, acc.w * scale));
  *reinterpret_cast<uint2*>(p.out + out_row * kDimV + dim) = packed;
  if (blockIdx.z == 0 && lane == 0 && p.lse != nullptr)
    p.lse[out_row] = weight_sum > 0.f ? (best + __log2f(weight_sum)) * kLn2 : -INFINITY;
}

}  // namespace mla
