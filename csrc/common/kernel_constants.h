// csrc/constants.h's definitions as typed constants, for the kernels and the host code alike.
#pragma once

#include "constants.h"

namespace mla {

constexpr int kDimV = MLA_LATENT_DIM;         // 512 latent dims: the output, V, and K's first part
constexpr int kRopeDim = MLA_ROPE_DIM;        // 64 rope dims: K's second part
constexpr int kHeadDim = kDimV + kRopeDim;    // 576
constexpr int kBlockN = MLA_TOKENS_PER_TILE;  // KV tokens per tile
constexpr int kMaxRows = MLA_MAX_ROWS;
constexpr int kMaxPageSize = MLA_MAX_PAGE_SIZE;
constexpr int kMaxSplits = MLA_MAX_KV_SPLITS;
constexpr int kMinTilesPerSplit = MLA_MIN_TILES_PER_SPLIT;
constexpr int kSplitsPerMergeTile = MLA_SPLITS_PER_MERGE_TILE;
constexpr int kFixedTilesPerCta = MLA_FIXED_TILES_PER_CTA;
constexpr int kFewSplitsMax = MLA_FEW_SPLITS_MAX;
constexpr int kMaxPlanPieces = MLA_MAX_PLAN_PIECES;
constexpr int kPlanCutWaves = MLA_PLAN_CUT_WAVES;
constexpr int kPlanMinBatch = MLA_PLAN_MIN_BATCH;
constexpr int kStepPlanMinBatch = MLA_STEP_PLAN_MIN_BATCH;
constexpr int kDsMlaScaleOffset = MLA_DS_MLA_SCALE_OFFSET;
constexpr int kDsMlaRopeOffset = MLA_DS_MLA_ROPE_OFFSET;
constexpr int kDsMlaRowBytes = MLA_DS_MLA_ROW_BYTES;
static_assert(kDsMlaScaleOffset == kDimV && kDsMlaRopeOffset == kDsMlaScaleOffset + 4 * (kDimV / 128) &&
                  kDsMlaRowBytes == kDsMlaRopeOffset + 2 * kRopeDim,
              "fp8_ds_mla rows: 512 e4m3, four fp32 scales, 64 bf16");
constexpr int kMaxGridY = 65535;  // CUDA's bound on grid.y, which a plan's items span
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace mla
