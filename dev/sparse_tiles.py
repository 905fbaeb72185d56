"""Probe: sparse decode over fp8_ds_mla timed with each tile shape that reads it (BF16 16-row tiles at two
CTAs an SM, BF16 32-row tiles at one, and where the library has it the FP8 32-row tile of f16 Q), at the
bench's shapes, through the op directly. Run with PART=script."""

import torch

from mla_backend.config import default_config
from mla_backend.launcher import (
    choose_num_splits,
    library_op,
    load_library,
    resident_slots,
    tile_shape,
    workspace_bytes,
)
from mla_backend.sparse_inputs import check_sparse_inputs
from mla_backend.sparse_problems import make_sparse_case
from mla_backend.tools.bench import copies_past_l2, time_graph

load_library(torch.device("cuda"), default_config())
for heads, tokens in [(16, 64), (64, 64), (128, 16), (128, 128)]:
    cases = [
        make_sparse_case(tokens, heads, 2048, "pow2_fp32", "cuda", seed=i, cache_tokens=tokens * 2048, poison=False)
        for i in range(copies_past_l2(tokens * 2048 * 656))
    ]
    cells = []
    fp8_shape = tile_shape(heads, True)
    tiles = [(False, 1, 1), (False, 2, 1)] + ([(True, *fp8_shape)] if library_op("ds_mla_fp8_tile")(*fp8_shape) else [])
    for fp8, rg, rf in tiles:
        slots = resident_slots(0, fp8, rg, rf, 1)
        splits = choose_num_splits(tokens, heads, fp8, 2048, slots, 1 << 40)
        calls = []
        for c in cases:
            p = check_sparse_inputs(c.query, c.kv_cache, c.indices, c.sm_scale, None, None)
            ws = torch.empty(workspace_bytes(tokens, heads, splits), dtype=torch.uint8, device="cuda")
            q = p.query.view(tokens, 1, heads, 576)
            args = (
                q[..., :512],
                q[..., 512:],
                p.kv_rows,
                p.indices,
                p.topk_lens,
                p.out,
                None,
                ws,
                splits,
                rg,
                rf,
                p.sm_scale,
                None,
                1.0,
                None,
                True,
                1,
                fp8,
            )
            calls.append(lambda a=args: torch.ops.mla_backend.sparse_decode(*a))
        us = time_graph(calls)
        cells.append(f"{'fp8' if fp8 else 'bf16'} rg{rg} rf{rf}: {us:7.1f} us ({slots // 132} CTA/SM, {splits} splits)")
    print(f"H {heads:3} T {tokens:3} | " + " | ".join(cells), flush=True)
