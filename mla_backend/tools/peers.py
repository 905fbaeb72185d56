"""Peer MLA decode kernels the benchmark compares against, when importable (vLLM's FlashMLA and
TRITON_MLA). Each factory returns a no-argument callable that runs one decode, or raises."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..inputs import PagedProblem


def flashmla(problem: PagedProblem, sm_scale: float) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    from ..vllm import flashmla as fm

    ok, why = fm.available()
    if not ok:
        raise RuntimeError(why)
    batch, q_len, heads, _ = problem.query.shape
    if problem.kv_cache.shape[-2] != fm.PAGE_SIZE:
        raise RuntimeError(f"FlashMLA needs page size {fm.PAGE_SIZE}")
    kv_fp8 = problem.query.dtype == torch.float8_e4m3fn
    schedule = fm.Scheduler(heads, kv_fp8, None, problem.query.device)(problem.seq_lens, q_len)
    # Unit descales made once, as vLLM's layers hold theirs: not a fill kernel inside every timed call.
    one = torch.ones(1, dtype=torch.float32, device=problem.query.device) if kv_fp8 else None
    return lambda: fm.decode(
        problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens, schedule, sm_scale, one, one
    )


def triton_mla(problem: PagedProblem, sm_scale: float) -> Callable[[], object]:
    from vllm.v1.attention.ops.triton_decode_attention import decode_attention_fwd

    batch, q_len, heads, _ = problem.query.shape
    if q_len != 1:
        raise RuntimeError("TRITON_MLA decodes one query token per request")
    device = problem.query.device
    q = problem.query[:, 0].to(torch.bfloat16)  # vLLM feeds bf16 queries to Triton MLA
    cache = problem.kv_cache.unsqueeze(2)
    splits = min(
        1 << max(0, (problem.max_seq_len // 512).bit_length() - 1),
        2 * torch.cuda.get_device_properties(device).multi_processor_count,
    )
    splits = max(1, splits)
    out = torch.empty(batch, heads, 512, dtype=torch.bfloat16, device=device)
    lse = torch.empty(batch, heads, dtype=torch.bfloat16, device=device)
    logits = torch.empty(batch, heads, splits, 513, dtype=torch.float32, device=device)
    one = torch.ones((), dtype=torch.float32, device=device)
    return lambda: decode_attention_fwd(
        q,
        cache,
        cache[..., :512],
        out,
        lse,
        problem.block_tables,
        problem.seq_lens,
        logits,
        splits,
        sm_scale,
        cache.shape[1],
        k_scale=one,
        v_scale=one,
        is_mla=True,
    )


PEERS = {"flashmla": flashmla, "triton_mla": triton_mla}
SM_SCALE = 1 / math.sqrt(192)
