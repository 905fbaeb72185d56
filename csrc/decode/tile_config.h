// The CTA's layout, derived at compile time from (dtype, row groups, fragments per warp): tile
// sizes, the shared-memory map, and which rows and dims each warp owns.
//
// Rows of the MMA are (query token, head) pairs of one request. A CTA owns kTileRows rows; its
// warps form ROW_GROUPS x 4: each warp owns RF 16-row fragments of its row group and one quarter
// of the 512 output dims (and of the QK^T reduction dims). Shared memory holds, in this order: the
// KV ring (kStages tiles of kBlockN tokens), the four dim quarters' partial scores, Q (when it is not
// kept in registers), P, the per-row rescale factors and the per-row exact sums of P (the LSE).
#pragma once

#include <stdint.h>

#include "common/params.h"
#include "common/ptx.cuh"

namespace mla {

#ifdef MLA_FP8_QK_VIA_F16
constexpr bool kFp8QkViaF16 = true;
constexpr int kMaxSmemPerBlock = 227 * 1024;  // sm_90
#else
constexpr bool kFp8QkViaF16 = false;
constexpr int kMaxSmemPerBlock = 99 * 1024;  // SM120 allows 99 KB of shared memory per block
#endif

#ifdef MLA_FP8_PV_F16_ACC
constexpr bool kFp8PvF16Acc = true;
#else
constexpr bool kFp8PvF16Acc = false;
#endif

// fp8_ds_mla rows (656 bytes: 512 e4m3, four fp32 scales, 64 bf16 rope; load_kv_ds_mla.cuh) run the FP8
// tiles where Q is widened to f16 (sm_90a) and P.V sums in fp32: raw rows straight into shared memory,
// the latent products in f16, the rope product in bf16. Elsewhere they run the BF16 tiles, widened to bf16.
constexpr bool kDsMlaOnFp8Tiles = kFp8QkViaF16 && !kFp8PvF16Acc;

template <bool FP8, int ROW_GROUPS, int RF, KvFormat KV = KvFormat::kPlain>
struct TileConfig {
  static constexpr bool kFp8 = FP8;
  static constexpr KvFormat kKv = KV;
  // fp8_ds_mla rows as they are in the cache, on an FP8 tile (kDsMlaOnFp8Tiles).
  static constexpr bool kRawDsMla = FP8 && KV == KvFormat::kDsMla;
  static constexpr int kRowGroups = ROW_GROUPS;
  static constexpr int kFragments = RF;  // 16-row fragments per warp
  static constexpr int kElem = FP8 ? 1 : 2;
  static constexpr int kWarps = 4 * ROW_GROUPS;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowsPerWarp = 16 * RF;
  static constexpr int kTileRows = kRowsPerWarp * ROW_GROUPS;
  // BF16 at two row groups holds one CTA an SM (its registers); where a block may take 227 KB (sm_90's
  // build) a third stage fits, and the loop then runs software-pipelined as FP8's does.
  static constexpr int kStages = FP8 || (ROW_GROUPS > 1 && kMaxSmemPerBlock > 99 * 1024) ? 3 : 2;
  static constexpr int kRowBytes = kHeadDim * kElem;
  // A 16-byte pad: ldmatrix rows hit distinct banks. A raw fp8_ds_mla row needs none: its 41 chunks
  // are an odd count already.
  static constexpr int kSmemRowBytes = kRawDsMla ? kDsMlaRowBytes : kRowBytes + 16;
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kStageBytes = kBlockN * kSmemRowBytes;
  // Partial scores of the four dim quarters, kBlockN floats per row, XOR-swizzled (score_index).
  static constexpr int kScoreBytes = 4 * kTileRows * kBlockN * 4;
  // Softmax runs once per row: each warp of a row group owns a quarter of the group's rows.
  static constexpr int kSoftRows = kRowsPerWarp / 4;
  // P (f16 for FP8, bf16 for BF16) for the P.V A fragments; 16-byte row pad for ldmatrix.
  static constexpr int kPRowBytes = kBlockN * 2 + 16;
  static constexpr int kPBytes = kTileRows * kPRowBytes;
  static constexpr int kCorrBytes = kTileRows * 4;      // per-row rescale factor of the tile
  static constexpr int kExactSumBytes = kTileRows * 4;  // per-row sum of P before rounding (the LSE)
  static constexpr bool kQInSmem = RF > 1;
  static constexpr bool kQkF16 = FP8 && kFp8QkViaF16 && kQInSmem;  // Q widened to f16 once
  static_assert(!kRawDsMla || (kQkF16 && kDsMlaOnFp8Tiles), "fp8_ds_mla runs FP8 tiles of f16 Q only");
  static constexpr int kQElem = kQkF16 ? 2 : kElem;
  // FP8 P.V summed in f16 per 16-token k-step, then in fp32 (the fp8_pv setting). P <= 2^8 (stale
  // maximum) and |V| <= 448, so P is stored scaled by 2^-6: 16 * 2^8 * 2^-6 * 448 = 28672 < 65504.
  static constexpr bool kPvF16Acc = FP8 && kFp8PvF16Acc;
  static constexpr float kPvF16Scale = 64.f;
  static constexpr int kSmemQRowBytes = (kRawDsMla ? kDimV : kHeadDim) * kQElem + 16;
  static constexpr int kQBytes = kQInSmem ? kTileRows * kSmemQRowBytes : 0;
  // The shared-memory map (byte offsets).
  static constexpr int kScoresOffset = kStages * kStageBytes;
  static constexpr int kQOffset = kScoresOffset + kScoreBytes;
  static constexpr int kPOffset = kQOffset + kQBytes;
  static constexpr int kCorrOffset = kPOffset + kPBytes;
  static constexpr int kExactSumOffset = kCorrOffset + kCorrBytes;
  static constexpr int kSmemBytes = kExactSumOffset + kExactSumBytes;
  // The loader gives each token of a tile kThreadsPerToken threads (one page lookup per thread).
  static constexpr int kThreadsPerToken = kThreads / kBlockN;
  static constexpr int kChunksPerThread = (kChunksPerRow + kThreadsPerToken - 1) / kThreadsPerToken;
  // QK^T works on 32-byte column chunks (one k32 fp8 step or one k16 bf16 step): each warp takes
  // a quarter of the latent dims, and the rope chunks go one per warp from warp 0.
  static constexpr int kNopeChunks = kDimV * kElem / 32 / 4;
  static constexpr int kRopeChunks = kRopeDim * kElem / 32;
  static constexpr int kQkChunks = kNopeChunks + 1;
  // Q fragments held in registers ([fragment][chunk]; 1 x 1: unused): all of Q where it is not in shared
  // memory; for raw fp8_ds_mla rows, the rope chunk of the warp (bf16 Q, in smem the latent part only).
  static constexpr int kQRegFragments = kQInSmem && !kRawDsMla ? 1 : RF;
  static constexpr int kQRegChunks = kQInSmem ? 1 : kQkChunks;
  // Widened to f16, QK^T runs in k16 steps of 16 K bytes: 36 per row, spread evenly over the warps.
  static constexpr int kF16StepsPerWarp = kRowBytes / 16 / 4;
  // QK^T steps of a tile per warp, the latent ones before the rope one. Raw fp8_ds_mla rows: a warp's
  // 128 latent dims (its scale tile) in 8 f16 steps, then its bf16 rope step.
  static constexpr int kLatentQkSteps = kRawDsMla ? kDimV / 4 / 16 : kNopeChunks;
  static constexpr int kQkSteps = kRawDsMla ? kLatentQkSteps + 1 : kQkF16 ? kF16StepsPerWarp : kQkChunks;
  // Split partials: f16 from plain FP8 rows (|O| <= 448, the e4m3 maximum), else fp32 (scaled rows).
  static constexpr bool kF16Partials = FP8 && !kRawDsMla;
  // Sparse lists come with bf16 queries: the BF16 tiles read them, and FP8 tiles over raw fp8_ds_mla rows.
  static constexpr bool kReadsSparseLists = !FP8 || kRawDsMla;
  // P.V steps of a tile per warp: one 16-token x 32-dim (FP8) or x 16-dim (BF16) block of V each.
  static constexpr int kPvSteps = FP8 ? 8 : 16;
  static_assert(kSmemBytes <= kMaxSmemPerBlock, "tile does not fit the shared memory of a block");
  static_assert(kThreads % kBlockN == 0, "the loader maps whole tokens to threads");
  static_assert(kRopeChunks <= 4, "rope chunks are spread one per warp");
  static_assert(kSoftRows % 4 == 0 && kBlockN == 32, "softmax: 8 lanes per row, 4 tokens per lane");
};

// Where a thread sits: its warp's dim quarter and row group, and its coordinates in the MMA
// fragments (g: row within an 8-row half, t: column pair). The kernel fills it once.
struct WarpRole {
  int lane;
  int wd, wr;  // dim quarter, row group
  int g, t;
};

// Byte offset in a K (or Q) row of QK^T chunk s of dim quarter wd: its latent chunks, then one rope
// chunk (held by the warps wd < kRopeChunks).
template <class C>
__device__ __forceinline__ int qk_chunk_byte(int wd, int s) {
  return s < C::kNopeChunks ? (wd * C::kNopeChunks + s) * 32 : kDimV * C::kElem + wd * 32;
}

// Tile-local row of fragment f, half h of this thread (accumulator layout).
template <class C>
__device__ __forceinline__ int local_row(const WarpRole& w, int f, int h) {
  return w.wr * C::kRowsPerWarp + 16 * f + 8 * h + w.g;
}

// A fragment f (16 rows x 16 bytes at byte offset `byte`) of this warp's rows of a row-major
// matrix in shared memory.
template <class C>
__device__ __forceinline__ void ldmatrix_a(uint32_t (&a)[4], const WarpRole& w, uint32_t base, int pitch, int f,
                                           int byte) {
  ldmatrix_x4(a, base + (w.wr * C::kRowsPerWarp + 16 * f + (w.lane & 15)) * pitch + byte + 16 * (w.lane >> 4));
}

}  // namespace mla
