// Constants the kernels and the Python side must agree on, written once: mla_backend/kernel_constants.py
// reads the MLA_* definitions of this file (integers, and the tile table below).
#pragma once

// DeepSeek-V3-class MLA: K rows are 512 latent ("nope") dims then 64 rope dims; V is the latent part.
#define MLA_LATENT_DIM 512
#define MLA_ROPE_DIM 64
// Rows of one request's problem (query tokens x heads): the bound of the kernels' exact row / heads (heads_recip).
#define MLA_MAX_ROWS 1024
// Splits of one request's KV across CTAs: bounds the merge kernel's LSE pass (one thread per
// split) and the workspace the split partials take.
#define MLA_MAX_KV_SPLITS 256
// fp8_ds_mla KV rows (DeepSeek-V3.2, GLM-5), in bytes: MLA_LATENT_DIM e4m3 values, then one fp32 scale
// per 128 of them, then MLA_ROPE_DIM bf16 values.
#define MLA_DS_MLA_SCALE_OFFSET 512
#define MLA_DS_MLA_ROPE_OFFSET 528
#define MLA_DS_MLA_ROW_BYTES 656
// KV tokens per tile of the main loop: the unit the split plan counts in.
#define MLA_TOKENS_PER_TILE 32
// The largest page (tokens) the kernels address; pages are powers of two from 1 (a token-indexed cache).
#define MLA_MAX_PAGE_SIZE 1024
// Tiles a split holds at least (unless its request is shorter): shorter splits cost more in merging
// than they save.
#define MLA_MIN_TILES_PER_SPLIT 4
// One more split of a request costs its merge about a tile's work over this many splits (the split
// cost model, schedule/cost_model.h).
#define MLA_SPLITS_PER_MERGE_TILE 20
// Splits of a request the merge takes one warp a row for (all splits in registers); more take blocks.
#define MLA_FEW_SPLITS_MAX 8
// A CTA's fixed cost (pipeline fill, epilogue) in tiles' work (the split cost model, schedule/cost_model.h).
#define MLA_FIXED_TILES_PER_CTA 2
// The most CTAs (per row block) a split plan spreads one call's work over.
#define MLA_MAX_PLAN_PIECES 4096
// Waves of pieces a plan may cut beyond one item a request (schedule/plan_layout.h's PlanLayout bounds).
#define MLA_PLAN_CUT_WAVES 2
// Requests a call holds at least for the GPU's split plan made inside the call: the plan's kernel and
// its item lookup add about 7 us a call (H100, docs/performance.md), which batches this large repay
// once their lengths differ; smaller ones keep one split count for the batch, planned on the host.
#define MLA_PLAN_MIN_BATCH 32
// The same for a plan made once per engine step (mla_backend/step_plan.py), which every layer's call
// reads: from 4 requests it gains where lengths differ (2.1-5.5x with one 32k request among 1k ones)
// and costs equal batches 0-5%. A planned grid spans more CTAs than the items need (the plan is made
// on the GPU), and the H100 then places a few of its first CTAs two to an SM: one or two requests,
// split over a hundred CTAs, run up to 25% slower than with the host's count (docs/performance.md).
#define MLA_STEP_PLAN_MIN_BATCH 4

// The tile shapes built into the library, X(fp8, max_rows, row_groups, fragments_per_warp): a problem
// takes the first entry of its dtype whose max_rows covers its rows (query tokens x heads). CTAs are
// 4 x row_groups warps of 16 x fragments_per_warp rows each.
// FP8 over 16 rows: one warp per dim quarter with two fragments each (Q in shared memory) halves
// the K/V fetches and conversions per row; two BF16 fragments would not fit SM120's 99 KB.
#define MLA_TILE_SHAPES(X) \
  X(1, 16, 1, 1)           \
  X(1, MLA_MAX_ROWS, 1, 2) \
  X(0, 16, 1, 1)           \
  X(0, MLA_MAX_ROWS, 2, 1)
