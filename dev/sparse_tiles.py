"""Probe: sparse decode timed with each BF16 tile shape the library holds (16-row tiles at two CTAs an
SM against 32-row tiles at one), at the bench's shapes, through the op directly. Run with PART=script."""

import torch

from mla_backend.config import default_config
from mla_backend.launcher import choose_num_splits, load_library, resident_slots, workspace_bytes
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
    for rg, rf in [(1, 1), (2, 1)]:
        slots = resident_slots(0, False, rg, rf)
        splits = choose_num_splits(tokens, heads, False, 2048, slots, 1 << 40)
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
            )
            calls.append(lambda a=args: torch.ops.mla_backend.sparse_decode(*a))
        us = time_graph(calls)
        cells.append(f"rg{rg}: {us:7.1f} us ({slots // 132} CTA/SM, {splits} splits)")
    print(f"H {heads:3} T {tokens:3} | " + " | ".join(cells), flush=True)
