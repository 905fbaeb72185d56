"""A small decode sweep (split-KV included: forced counts, and the GPU's own plan where num_kv_splits is
None) to run under compute-sanitizer memcheck/racecheck:
    compute-sanitizer --tool memcheck python tests/sanitize_decode.py
Exits non-zero if any result is wrong, so the sanitizer run also checks correctness."""

import torch

from mla_backend import (
    MLABackendConfig,
    mla_decode,
    mla_decode_reference,
    xqa_batch_decode_with_kv_cache_mla,
)
from mla_backend.inputs import make_paged_problem

workspace = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")
worst = 0.0
for splits, dtype, heads, q_len, lengths, split_query in [
    (1, torch.bfloat16, 16, 1, [70, 1, 0], False),
    (3, torch.bfloat16, 32, 2, [300, 45], True),
    (1, torch.float8_e4m3fn, 8, 2, [129, 2], False),
    (4, torch.float8_e4m3fn, 128, 1, [700, 0, 33], True),
    (2, torch.float8_e4m3fn, 16, 4, [90, 5], False),  # 64 rows: two-fragment tiles with the causal mask
    (3, torch.float8_e4m3fn, 16, 2, [260, 7, 0], True),  # 32 rows: the warp-specialized tile on SM120
    # The GPU's plan (csrc/plan/plan_kernel.cuh, batches of 32 or more): long requests cut into splits beside
    # short and empty ones
    (None, torch.float8_e4m3fn, 16, 1, [3000, 10, 0, 200, 1] * 7, False),
    (None, torch.bfloat16, 128, 1, [2000, 64, 1, 40] * 8, True),
    (None, torch.float8_e4m3fn, 8, 2, [1500, 33, 0, 7] * 8, False),
    (None, torch.float8_e4m3fn, 16, 1, [0] * 32, False),  # a padded batch: no tile at all
]:
    # from_sources keeps the environment's settings (MLA_BACKEND_FP8_QK picks the SM120 Q layout)
    config = MLABackendConfig.from_sources({"num_kv_splits": splits})
    p = make_paged_problem(lengths, q_len, heads, 16, dtype, "cuda", seed=splits or len(lengths))
    query = p.query
    if split_query:  # (q_nope, q_pe) views of rows 16 elements wider than 576: read in place
        wide = torch.cat([p.query, p.query[..., :16]], dim=-1)
        query = (wide[..., :512], wide[..., 512:576])
    out = xqa_batch_decode_with_kv_cache_mla(
        query, p.kv_cache, workspace, 128, 512, 64, p.block_tables, p.seq_lens, p.max_seq_len, bmm1_scale=0.07,
        config=config,
    )  # fmt: skip
    want, _ = mla_decode_reference(p.query, p.kv_cache, p.block_tables, p.seq_lens, 0.07, 1.0)
    err = ((out.double() - want).norm() / want.norm().clamp_min(1e-30)).item()
    worst = max(worst, err)
# A step's plan made once (step_plan.py) and read by two calls, for batches under 32 as well.
for dtype, heads, q_len, lengths in [
    (torch.float8_e4m3fn, 16, 1, [3000, 10, 0, 200]),
    (torch.bfloat16, 128, 2, [2000, 64, 1, 40] * 9),
    (torch.float8_e4m3fn, 20, 2, [0, 0, 0, 0]),
    # One request of about 38 splits (a block per merge unit) beside requests of about 10 (a warp per
    # unit) and unsplit ones, on an H100's plan: the merge's shared list of block requests.
    (torch.float8_e4m3fn, 16, 1, [6000] + [1500] * 7 + [100] * 8),
    (torch.bfloat16, 16, 1, [6000] + [1500] * 7 + [100] * 8),
]:
    config = MLABackendConfig.from_sources({"backend": "xqa"})
    layers = [make_paged_problem(lengths, q_len, heads, 16, dtype, "cuda", seed=s) for s in range(2)]
    plan = layers[0].step_plan(workspace, config)
    assert plan is not None
    for p in layers:
        out = mla_decode(*p.decode_args(workspace), bmm1_scale=0.07, config=config, plan=plan)
        want, _ = mla_decode_reference(p.query, p.kv_cache, p.block_tables, p.seq_lens, 0.07, 1.0)
        err = ((out.double() - want).norm() / want.norm().clamp_min(1e-30)).item() if want.norm() > 0 else 0.0
        assert not out.isnan().any()
        worst = max(worst, err)
print(f"sanitize sweep ({MLABackendConfig.from_sources().kernel_variant}): worst relative error {worst:.2e}")
raise SystemExit(0 if worst < 2e-2 else 1)
