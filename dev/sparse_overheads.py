"""Probe: where sparse decode's time goes at 128 and 16 heads. The same work (T query tokens x 2048 keys)
timed five ways: dense BF16 and dense FP8 decode (T requests of 2048 keys, pages of 64), sparse over
bf16 rows (cp.async, no conversion), sparse over fp8_ds_mla rows (the tile the library picks), and
sparse over fp8_ds_mla with every list in cache order (locality as dense). Run with PART=script."""

import torch

from mla_backend import mla_decode
from mla_backend.inputs import make_paged_problem
from mla_backend.sparse import sparse_mla_decode
from mla_backend.sparse_problems import make_sparse_case
from mla_backend.tools.bench import copies_past_l2, time_graph

WORKSPACE = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")


def sparse_calls(cases):
    calls = []
    for c in cases:
        out = torch.empty(c.query.shape[0], c.query.shape[1], 512, dtype=torch.bfloat16, device="cuda")
        calls.append(
            lambda c=c, out=out: sparse_mla_decode(
                c.query, c.kv_cache, c.indices, c.sm_scale, out=out, workspace_buffer=WORKSPACE
            )
        )
    return calls


for heads, tokens in [(128, 128), (128, 16), (16, 64)]:
    n = copies_past_l2(tokens * 2048 * 656)
    row = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
        dense = [make_paged_problem([2048] * tokens, 1, heads, 64, dtype, "cuda", seed=i) for i in range(n)]
        row[f"dense {name}"] = time_graph(
            [
                lambda p=p: mla_decode(*p.decode_args(WORKSPACE), bmm1_scale=0.04, plan=p.step_plan(WORKSPACE))
                for p in dense
            ]
        )
        del dense
    for kind in ("bf16", "pow2_fp32"):
        cases = [
            make_sparse_case(tokens, heads, 2048, kind, "cuda", seed=i, cache_tokens=tokens * 2048, poison=False)
            for i in range(n)
        ]
        row[f"sparse {kind}"] = time_graph(sparse_calls(cases))
        if kind == "pow2_fp32":
            for c in cases:
                c.indices.copy_(
                    torch.arange(2048, device="cuda", dtype=torch.int32)[None, :]
                    + 2048 * torch.arange(tokens, device="cuda", dtype=torch.int32)[:, None]
                )
            row["sparse fp8_ds_mla in order"] = time_graph(sparse_calls(cases))
        del cases
    flops = 2 * heads * tokens * 2048 * 1088
    print(f"H {heads} T {tokens}: " + " | ".join(f"{k} {v:.1f} us {flops / v / 1e6:.0f} TF/s" for k, v in row.items()))
