"""`python -m mla_backend bench --token-indexed`: one decode shape read three ways, timed in one run.

- ``page64``: a [B, max_pages] table of shuffled 64-token pages (the paged path);
- ``page1``: one slot id a token (SGLang's default page size), the slots a random permutation of the
  cache, so no two neighbouring tokens of a request sit side by side;
- ``ragged1``: the same slot ids as FlashInfer's ragged ``kv_indices``/``kv_indptr``;
- ``runs16``: one slot id a token, the slots in runs of 16 (what an allocator's free list hands out
  once the cache has churned), read as pages of one token.

Each token's row (576 bytes fp8, 1152 bf16) is 32-byte-sector aligned wherever its slot is, and every
loader thread already looks up its own token's page id, so a gather of single tokens moves the same
bytes as whole pages; what a random permutation of the slots costs on top is the locality DRAM and
the address translation lose. Ratios are against ``page64`` of the same shape in the same run.
"""

from __future__ import annotations

import torch

from ..decode import mla_decode
from ..inputs import make_paged_problem
from .bench import copies_past_l2, time_graph
from .peers import SM_SCALE

SHAPES = [(16, 128, 16384), (128, 64, 8192)]  # heads, batch, context
LAYOUTS = ("page64", "page1", "ragged1", "runs16")


def _token_slots(problem):
    """``problem`` (pages of several tokens) as one slot id a token over a page-size-1 view of its cache."""
    page = problem.kv_cache.shape[-2]
    first_slots = problem.block_tables.clamp(min=0).long() * page
    slots = (first_slots[:, :, None] + torch.arange(page, device=first_slots.device)).flatten(1)
    problem.block_tables = slots.to(torch.int32)
    problem.kv_cache = problem.kv_cache.view(-1, 1, problem.kv_cache.shape[-1])
    return problem


def _call(problem, workspace, ragged: bool):
    plan = problem.step_plan(workspace)
    args = problem.decode_args(workspace)
    if not ragged:
        return lambda: mla_decode(*args, bmm1_scale=SM_SCALE, plan=plan)
    indices, indptr = problem.ragged_ids()
    args = (args[0], args[1], workspace, indices, args[4], args[5])
    return lambda: mla_decode(*args, bmm1_scale=SM_SCALE, plan=plan, kv_indptr=indptr)


def time_layout(dtype: torch.dtype, heads: int, batch: int, seq: int, layout: str, workspace) -> float:
    """Median microseconds of one decode call of the shape read through ``layout``."""
    page = {"page64": 64, "runs16": 16}.get(layout, 1)
    kv_bytes = batch * seq * 576 * (1 if dtype == torch.float8_e4m3fn else 2)
    problems = [
        make_paged_problem([seq] * batch, 1, heads, page, dtype, "cuda", seed=i, extra_pages=0)
        for i in range(copies_past_l2(kv_bytes))
    ]
    if layout == "runs16":
        problems = [_token_slots(p) for p in problems]
    us = time_graph([_call(p, workspace, layout == "ragged1") for p in problems])
    del problems
    torch.cuda.empty_cache()
    return us


def main() -> int:
    if not torch.cuda.is_available():
        print("bench needs a CUDA GPU")
        return 2
    workspace = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")
    print(f"token-indexed KV on {torch.cuda.get_device_name()}: us per call (x = time / page64's)")
    print(f"{'dtype':5} {'H':>4} {'B':>4} {'seq':>6} | " + " | ".join(f"{name:>8} {'x':>5}" for name in LAYOUTS))
    for name, dtype in (("fp8", torch.float8_e4m3fn), ("bf16", torch.bfloat16)):
        for heads, batch, seq in SHAPES:
            times = {layout: time_layout(dtype, heads, batch, seq, layout, workspace) for layout in LAYOUTS}
            cells = " | ".join(f"{times[k]:>8.1f} {times[k] / times['page64']:>5.3f}" for k in LAYOUTS)
            print(f"{name:5} {heads:>4} {batch:>4} {seq:>6} | {cells}", flush=True)
    return 0
