"""One MLA decode call (``forward_mqa``'s inputs and outputs, recorded in an engine) recomputed in
float64 on the real paged cache and compared row by row. The engines' checkers record the calls
(integration/engines/vllm_decode_checker.py, integration/engines/sglang_decode_check.py).

A checked row must see at least MIN_VISIBLE_KEYS keys: with one key, softmax is exactly 1 and any
kernel returns that key's V exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mla_backend.reference import (
    LSE_ABS_TOLERANCE,
    LSE_REL_TOLERANCE,
    mla_decode_reference,
    visible_lengths,
)

MIN_VISIBLE_KEYS = 16


@dataclass(eq=False)  # compared by identity: its fields are tensors
class DecodeCall:
    """One forward_mqa call: its inputs and outputs as copies (eager) or probes (graphs)."""

    layer: str
    query: torch.Tensor  # [tokens, H, 576], the dtype the kernel read
    kv_cache: torch.Tensor  # the layer's cache itself: read after the step, before the next one writes
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    num_decodes: int
    q_len: int
    bmm1: float
    bmm2: float
    out: torch.Tensor  # [tokens, H, 512]
    lse: torch.Tensor | None  # [tokens, H] natural log, or None where the backend returned none


@dataclass
class CallCheck:
    rows: int  # (request, token, head) rows compared, each seeing >= MIN_VISIBLE_KEYS keys
    out_error: float  # worst relative L2 error of an output row
    lse_error: float | None  # worst |LSE - reference| beyond its tolerance's relative part, if returned
    lse_ok: bool


def check_call(call: DecodeCall) -> CallCheck:
    """Recompute one call in float64; compare rows that see at least MIN_VISIBLE_KEYS keys."""
    requests, q_len = call.num_decodes, call.q_len
    tokens, heads, dim = call.query.shape
    query = call.query.view(requests, q_len, heads, dim)
    seq_lens = call.seq_lens[:requests]
    want, want_lse = mla_decode_reference(
        query, call.kv_cache, call.block_table[:requests], seq_lens, call.bmm1, call.bmm2
    )
    visible = torch.tensor([visible_lengths(n, q_len) for n in seq_lens.tolist()], device=seq_lens.device)
    rows = (visible >= MIN_VISIBLE_KEYS)[:, :, None].expand(requests, q_len, heads).reshape(tokens, heads)
    want, want_lse = want.reshape(tokens, heads, -1), want_lse.reshape(tokens, heads)
    got = call.out.reshape(tokens, heads, -1).double()
    if not rows.any():
        return CallCheck(0, 0.0, None, True)
    error = ((got - want).norm(dim=-1) / want.norm(dim=-1))[rows]
    out_error = float("inf") if not torch.isfinite(got[rows]).all() else error.max().item()
    lse_error, lse_ok = None, True
    if call.lse is not None:
        delta = (call.lse.reshape(tokens, heads).double() - want_lse)[rows].abs()
        allowed = LSE_ABS_TOLERANCE + LSE_REL_TOLERANCE * want_lse[rows].abs()
        lse_error = delta.max().item() if torch.isfinite(delta).all() else float("inf")
        lse_ok = bool((delta <= allowed).all())
    return CallCheck(int(rows.sum()), out_error, lse_error, lse_ok)
