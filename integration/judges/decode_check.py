"""One MLA decode call (``forward_mqa``'s inputs and outputs, recorded in an engine) recomputed in
float64 on the real paged cache and compared row by row. The engines' checkers record the calls
(integration/engines/vllm_decode_checker.py, integration/engines/sglang_decode_check.py).

A checked row must see at least MIN_VISIBLE_KEYS keys: with one key, softmax is exactly 1 and any
kernel returns that key's V exactly.

A call recomputed after its engine step may find the keys of its own new tokens rewritten: a drafter's
later draft steps in the same step write the positions its rejected tokens held. Such a call carries
``own_keys``, the cache rows of its own tokens copied when it ran (own_keys below), and the reference
reads those instead.
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
from mla_backend.shapes import pages_view

MIN_VISIBLE_KEYS = 16


@dataclass(eq=False)  # compared by identity: its fields are tensors
class DecodeCall:
    """One forward_mqa call: its inputs and outputs as copies (eager) or probes (graphs)."""

    layer: str
    query: torch.Tensor  # [tokens, H, 576] (latent + rope), the dtype the kernel read
    kv_cache: torch.Tensor  # the layer's cache itself: read after the step, before the next one writes
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    num_decodes: int
    q_len: int
    bmm1: float
    bmm2: float
    out: torch.Tensor  # [tokens, H, 512] (the latent)
    lse: torch.Tensor | None  # [tokens, H] natural log, or None where the backend returned none
    own_keys: torch.Tensor | None = None  # [requests, q_len, 576]: own_keys(), copied when the call ran


def own_token_positions(seq_lens: torch.Tensor, q_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([requests, q_len] cache positions of each request's new tokens, whether each exists): a
    request shorter than q_len (a graph's padding) has positions before its start, clamped to 0."""
    offsets = torch.arange(q_len, device=seq_lens.device, dtype=torch.int64)
    positions = seq_lens.to(torch.int64)[:, None] - q_len + offsets
    return positions.clamp(min=0), positions >= 0


def own_keys(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, q_len: int) -> torch.Tensor:
    """Copies of the cache rows of each request's new tokens: GPU ops only, so a CUDA graph that
    captures this call refills them on every replay. Page ids of absent positions are never read."""
    cache = pages_view(kv_cache)
    page_size = cache.shape[1]
    positions, present = own_token_positions(seq_lens, q_len)
    pages = block_table[: seq_lens.shape[0]].to(torch.int64).gather(1, positions // page_size)
    pages = torch.where(present, pages, 0).clamp(0, cache.shape[0] - 1)
    return cache[pages, positions % page_size].clone()


def cache_as_seen(call: DecodeCall) -> tuple[torch.Tensor, torch.Tensor]:
    """(cache, block table) holding what the call read: its requests' pages copied out of the live
    cache, with the rows of its own tokens put back from own_keys."""
    requests = call.num_decodes
    cache = pages_view(call.kv_cache)
    page_size = cache.shape[1]
    seq_lens = call.seq_lens[:requests].to(torch.int64)
    width = max(1, -(-int(seq_lens.max()) // page_size))
    pages_needed = -(-seq_lens // page_size)
    used = torch.arange(width, device=seq_lens.device)[None, :] < pages_needed[:, None]
    pages = torch.where(used, call.block_table[:requests, :width].to(torch.int64), 0)
    private = cache[pages].clone()  # [requests, width, page, 576]
    positions, present = own_token_positions(seq_lens, call.q_len)
    request_index = torch.arange(requests, device=seq_lens.device)[:, None].expand_as(positions)
    rows = (request_index[present], positions[present] // page_size, positions[present] % page_size)
    private[rows] = call.own_keys[present]
    table = torch.arange(requests * width, device=pages.device, dtype=torch.int32).view(requests, width)
    return private.view(requests * width, page_size, -1), table


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
    kv_cache, block_table = (
        (call.kv_cache, call.block_table[:requests]) if call.own_keys is None else cache_as_seen(call)
    )
    want, want_lse = mla_decode_reference(
        query, kv_cache, block_table, seq_lens, call.bmm1, call.bmm2, kv_lora_rank=call.out.shape[-1]
    )  # the latent's width from the output: 512 for most families, 256 for Mistral Small 4
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
