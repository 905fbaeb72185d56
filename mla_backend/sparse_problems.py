"""Seeded sparse decode problems (the bench's and the tests'): FlashMLA's sparse test inputs (query
randn clamped to +-1, KV randn / 10 clamped to +-1, unique random slot ids a token), a cache of 64-token
pages in either sparse format, empty entries where asked, and NaN in every cache row no valid entry
names, so a read of a masked or unlisted row shows in the output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from .sparse_cache import pack_fp8_ds_mla, unpack_fp8_ds_mla

# bf16 rows, or fp8_ds_mla rows quantised with DeepSeek's (pow2) or GLM's (arbitrary) scales.
SparseCacheKind = Literal["bf16", "pow2_fp32", "arbitrary_fp32"]
# Where lists hold empty entries: none; the second half -1 (FlashInfer's test); -1 scattered through
# each list (vLLM's lists); every entry of every third token -1; ids past the cache's end.
InvalidPattern = Literal["none", "tail", "scattered", "all_some_tokens", "past_the_end"]
PAGE = 64


@dataclass
class SparseCase:
    query: torch.Tensor  # bf16 [T, H, 576]
    kv_cache: torch.Tensor  # [pages, 64, 576] bf16 or [pages, 64, 656] uint8, unread rows NaN
    indices: torch.Tensor  # int32 [T, K]
    topk_lens: torch.Tensor | None  # int32 [T], or None (every list whole)
    sm_scale: float
    kv_rows: torch.Tensor  # float64 [N, 576]: the dequantised cache before poisoning (the reference's)


def _nan_rows(cache_rows: torch.Tensor, unread: torch.Tensor, kind: SparseCacheKind) -> None:
    """NaN into the unread rows: bf16 NaN, or e4m3 NaN bytes, NaN scales and bf16 NaN rope."""
    if kind == "bf16":
        cache_rows.view(torch.int16)[unread] = 0x7FC0
        return
    cache_rows[unread, :512] = 0x7F
    cache_rows[unread, 512:528] = torch.tensor([0, 0, 0xC0, 0x7F] * 4, dtype=torch.uint8, device=cache_rows.device)
    cache_rows[unread, 528:] = torch.tensor([0xC0, 0x7F] * 64, dtype=torch.uint8, device=cache_rows.device)


def make_sparse_case(
    tokens: int,
    heads: int,
    topk: int,
    kind: SparseCacheKind,
    device: str | torch.device,
    seed: int = 0,
    *,
    cache_tokens: int | None = None,
    invalid: InvalidPattern = "none",
    random_lens: bool = False,
    poison: bool = True,
) -> SparseCase:
    """A sparse problem of ``tokens`` query tokens x ``heads`` over lists of ``topk`` ids into a cache of
    ``cache_tokens`` rows (default: 2 x topk, at least 4096, whole pages)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = max(cache_tokens or 2 * topk, 4096, topk)
    rows = -(-rows // PAGE) * PAGE
    query = torch.randn(tokens, heads, 576, generator=gen).clamp(-1, 1).to(torch.bfloat16)
    values = (torch.randn(rows, 576, generator=gen) / 10).clamp(-1, 1)
    if kind == "bf16":
        cache_rows = values.to(torch.bfloat16)
        kv_rows = cache_rows.double()
    else:
        cache_rows = pack_fp8_ds_mla(values, kind)
        kv_rows = unpack_fp8_ds_mla(cache_rows)
    indices = torch.stack([torch.randperm(rows, generator=gen)[:topk] for _ in range(tokens)]).to(torch.int32)
    if invalid == "tail":
        indices[:, topk // 2 :] = -1
    elif invalid == "scattered":
        indices[torch.rand(tokens, topk, generator=gen) < 0.3] = -1
    elif invalid == "all_some_tokens":
        indices[::3] = -1
    elif invalid == "past_the_end":
        far = torch.rand(tokens, topk, generator=gen) < 0.2
        indices[far] = rows + torch.randint(0, 1 << 20, (int(far.sum()),), generator=gen, dtype=torch.int32)
    topk_lens = torch.randint(0, topk + 1, (tokens,), generator=gen, dtype=torch.int32) if random_lens else None
    if poison:
        listed = torch.arange(topk)[None, :] < (topk_lens[:, None] if topk_lens is not None else topk)
        valid = listed & (indices >= 0) & (indices < rows)
        unread = torch.ones(rows, dtype=torch.bool)
        unread[indices[valid].long()] = False
        _nan_rows(cache_rows, unread, kind)
    width = cache_rows.shape[-1]
    return SparseCase(
        query.to(device),
        cache_rows.view(rows // PAGE, PAGE, width).to(device),
        indices.to(device),
        None if topk_lens is None else topk_lens.to(device),
        576**-0.5,
        kv_rows,
    )
