// Limits the kernels and the Python side must agree on, written once: mla_backend/kernel_limits.py
// reads the MLA_* definitions of this file.
#pragma once

// Splits of one request's KV across CTAs: bounds the merge kernel's LSE pass (one thread per
// split) and the workspace the split partials take.
#define MLA_MAX_KV_SPLITS 256
// KV tokens per tile of the main loop: the unit the split plan counts in.
#define MLA_TOKENS_PER_TILE 32
