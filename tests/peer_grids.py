"""The test grids and accuracy rules of our peers' own MLA decode tests, rewritten for this package.

FlashMLA (tests/test_flash_mla_dense_decoding.py): inputs randn / 10 clamped to +-1, pages of 64,
scale 1 / sqrt(576), lengths fixed or drawn around s_k, NaN in every cache slot a request does not
own and page ids past the end set to 2147480000; an element passes when its absolute error is below
abs_tol or its relative error below rel_tol, and the whole tensor's cosine difference is below
cos_tol (out: 8e-4, 2/128, 5e-6; LSE: 1e-6, 8/65536).

FlashInfer (tests/attention/test_trtllm_gen_mla.py): randn inputs, DeepSeek's 128 heads, scale
x / sqrt(192) for x in (1, 0.5), pages of 32 and 64, q_len 1 and 2, batch 1 to 1024 with lengths
up to 1024; torch.testing.assert_close with rtol = atol = 1e-2 (bf16) or 1e-1 (fp8).

The reference is computed here in float64 on the (dequantised) inputs, a request block at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FLASHMLA_OUT = dict(abs_tol=8e-4, rel_tol=2.01 / 128, cos_tol=5e-6)
FLASHMLA_LSE = dict(abs_tol=1e-6, rel_tol=8.01 / 65536)
# FlashMLA's sparse decode test (tests/test_flash_mla_sparse_decoding.py): out within 1e-3 absolute.
FLASHMLA_SPARSE_OUT = dict(abs_tol=1e-3, rel_tol=2.01 / 128, cos_tol=5e-6)
FLASHINFER_TOL = {torch.bfloat16: 1e-2, torch.float8_e4m3fn: 1e-1}
PAST_THE_END_PAGE = 2147480000


@dataclass
class Problem:
    query: torch.Tensor  # [B, q_len, H, 576]
    kv_cache: torch.Tensor  # [pages, page_size, 576]
    block_tables: torch.Tensor  # int32 [B, max_pages]
    seq_lens: torch.Tensor  # int32 [B]
    max_seq_len: int


def quantise(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype) if dtype == torch.bfloat16 else t.clamp(-448, 448).to(dtype)


def flashmla_problem(
    batch: int, q_len: int, s_k: int, heads: int, varlen: bool, dtype, seed: int, zero_lengths=False, device="cuda"
) -> Problem:
    """FlashMLA's dense-decoding inputs (our own code, its recipe)."""
    gen = torch.Generator().manual_seed(seed)
    if varlen:
        drawn = torch.normal(float(s_k), s_k / 2, (batch,), generator=gen)
        lengths = drawn.clamp(min=q_len).to(torch.int64)
    else:
        lengths = torch.full((batch,), s_k, dtype=torch.int64)
    if zero_lengths:
        lengths[torch.randn(batch, generator=gen) > 0] = 0
    page = 64
    max_len = int(lengths.max())
    pages_per_request = -(-max(max_len, 1) // 256) * 256 // page
    total_pages = batch * pages_per_request
    table = torch.randperm(total_pages, generator=gen).to(torch.int32).view(batch, pages_per_request)
    cache = (torch.randn(total_pages, page, 576, generator=gen) / 10).clamp(-1, 1)
    for b, n in enumerate(lengths.tolist()):
        used = -(-n // page)
        cache[table[b, used:].long()] = float("nan")
        if n % page:
            cache[table[b, used - 1].long(), n % page :] = float("nan")
        table[b, used:] = PAST_THE_END_PAGE
    query = (torch.randn(batch, q_len, heads, 576, generator=gen) / 10).clamp(-1, 1)
    return Problem(
        query=quantise(query, dtype).to(device),
        kv_cache=quantise(cache, dtype).to(device),
        block_tables=table.to(device),
        seq_lens=lengths.to(torch.int32).to(device),
        max_seq_len=max_len,
    )


def flashinfer_problem(
    batch: int, q_len: int, heads: int, page: int, max_len: int, dtype, seed: int, device="cuda"
) -> Problem:
    """FlashInfer's trtllm-gen MLA test inputs (our own code, its recipe): randn query and cache,
    lengths uniform in q_len..max_len, a shuffled page table."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(q_len, max_len + 1, (batch,), generator=gen)
    pages_per_request = -(-max_len // page)
    total_pages = batch * pages_per_request
    table = torch.randperm(total_pages, generator=gen).to(torch.int32).view(batch, pages_per_request)
    cache = torch.randn(total_pages, page, 576, generator=gen)
    query = torch.randn(batch, q_len, heads, 576, generator=gen)
    return Problem(
        query=quantise(query, dtype).to(device),
        kv_cache=quantise(cache, dtype).to(device),
        block_tables=table.to(device),
        seq_lens=lengths.to(torch.int32).to(device),
        max_seq_len=int(lengths.max()),
    )


def reference(p: Problem, bmm1: float, bmm2: float = 1.0, block: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) in float64, natural log, -inf and zeros for rows that see no key; causal over the
    q_len new tokens. Requests go through in blocks, padded to the block's longest."""
    batch, q_len, heads, _ = p.query.shape
    page, device = p.kv_cache.shape[-2], p.query.device
    out = torch.zeros(batch, q_len, heads, 512, dtype=torch.float64, device=device)
    lse = torch.full((batch, q_len, heads), -math.inf, dtype=torch.float64, device=device)
    lengths = p.seq_lens.tolist()
    for start in range(0, batch, block):
        rows = range(start, min(batch, start + block))
        longest = max(lengths[b] for b in rows)
        if longest == 0:
            continue
        used = -(-longest // page)
        tables = p.block_tables[start : rows.stop, :used].long().clamp(0, p.kv_cache.shape[0] - 1)
        keys = p.kv_cache[tables].reshape(len(rows), used * page, 576)[:, :longest].double()
        n = torch.tensor([lengths[b] for b in rows], device=device)
        position = torch.arange(longest, device=device)
        visible = n[:, None] - q_len + 1 + torch.arange(q_len, device=device)[None, :]  # [rows, q_len]
        hidden = position[None, None, :] >= visible[:, :, None]
        keys = keys.masked_fill((position[None, :] >= n[:, None])[..., None], 0.0)  # NaN past the end
        logits = torch.einsum("bthd,bld->bthl", p.query[start : rows.stop].double(), keys) * bmm1
        logits = logits.masked_fill(hidden[:, :, None, :], -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)
        probs = torch.exp(logits - row_lse[..., None]).nan_to_num(0.0)
        out[start : rows.stop] = torch.einsum("bthl,bld->bthd", probs, keys[..., :512]) * bmm2
        lse[start : rows.stop] = row_lse
    return out, lse


@dataclass
class Verdict:
    passed: bool
    failing: int  # elements outside the rule
    max_abs: float
    max_rel: float
    cos_diff: float
    why: str


def flashmla_rule(got: torch.Tensor, want: torch.Tensor, abs_tol: float, rel_tol: float, cos_tol=None) -> Verdict:
    """FlashMLA's check: infinities and NaNs in the same places; elsewhere each element within abs_tol
    or rel_tol (relative to |want| + 1e-6); the cosine difference within cos_tol."""
    got, want = got.double().reshape(want.shape), want.double()
    for value, name in ((math.inf, "+inf"), (-math.inf, "-inf")):
        if not torch.equal(got == value, want == value):
            return Verdict(False, -1, math.inf, math.inf, math.inf, f"{name} in different places")
    if not torch.equal(torch.isnan(got), torch.isnan(want)):
        return Verdict(False, -1, math.inf, math.inf, math.inf, "NaN in different places")
    finite = torch.isfinite(want)
    g, w = got[finite], want[finite]
    err = (g - w).abs()
    rel = err / (w.abs() + 1e-6)
    failing = int(((err >= abs_tol) & (rel >= rel_tol)).sum())
    denominator = (g * g + w * w).sum()
    cos_diff = 0.0 if (w * w).sum() < 1e-12 else float(1 - 2 * (g * w).sum() / denominator)
    cos_ok = cos_tol is None or abs(cos_diff) <= cos_tol
    why = "" if failing == 0 and cos_ok else f"{failing} elements outside, cosine difference {cos_diff:.2e}"
    return Verdict(
        failing == 0 and cos_ok,
        failing,
        float(err.max()) if err.numel() else 0.0,
        float(rel.max()) if rel.numel() else 0.0,
        cos_diff,
        why,
    )


def assert_lse_exact(got: torch.Tensor, want: torch.Tensor) -> None:
    """The exact-LSE contract: -inf exactly where a row sees no key, every other LSE within FlashMLA's
    rule (1e-6 absolute or 8/65536 relative) of the float64 reference."""
    assert torch.equal(torch.isneginf(got.reshape(want.shape)), torch.isneginf(want)), (
        "LSE must be -inf exactly where a row sees nothing"
    )
    verdict = flashmla_rule(got, want, **FLASHMLA_LSE)
    assert verdict.passed, f"LSE: {verdict.why} (largest error {verdict.max_abs:.2e})"
