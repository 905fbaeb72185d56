"""Batches for BatchMLAPagedAttentionWrapper tests (CPU and GPU) and the float64 judge they share.

The judge runs mla_backend's float64 reference request by request straight from FlashInfer's
arguments (each request's own page ids, its whole qo_len at once, causal bottom-right), so it shares
nothing with the wrapper's plan layout (chunks, grid, token slot ids) it checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mla_backend.reference import ROW_ERROR_TOLERANCE, mla_decode_reference

SM_SCALE = 1.0 / math.sqrt(128 + 64)  # FlashInfer's: the head dim before matrix absorption
LOG2E = 1.0 / math.log(2.0)


@dataclass
class WrapperBatch:
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_lens: torch.Tensor
    q_nope: torch.Tensor  # [total_q, H, 512]
    q_pe: torch.Tensor  # [total_q, H, 64]
    ckv: torch.Tensor  # [pages, page_size, 512]
    kpe: torch.Tensor  # [pages, page_size, 64]
    page_size: int

    @property
    def heads(self) -> int:
        return self.q_nope.shape[1]

    def plan_args(self, causal: bool, sm_scale: float = SM_SCALE, kv_dtype: torch.dtype | None = None) -> tuple:
        """plan()'s positional arguments, FlashInfer's order."""
        return (
            self.qo_indptr,
            self.kv_indptr,
            self.kv_indices,
            self.kv_lens,
            self.heads,
            512,
            64,
            self.page_size,
            causal,
            sm_scale,
            self.q_nope.dtype,
            kv_dtype or self.ckv.dtype,
        )


def _indptr(lengths: list[int], device) -> torch.Tensor:
    return torch.tensor([0] + [sum(lengths[: i + 1]) for i in range(len(lengths))], dtype=torch.int32, device=device)


def make_batch(
    qo_lens: list[int],
    kv_lens: list[int],
    page_size: int,
    heads: int = 2,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    seed: int = 0,
    spare_pages: int = 3,
) -> WrapperBatch:
    """Pages shuffled over the cache; every key a request may not see (past its kv_len, spare pages) NaN."""
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-n // page_size) for n in kv_lens]
    total_pages = sum(pages) + spare_pages
    order = torch.randperm(total_pages, generator=gen)[: sum(pages)].to(torch.int32)
    ckv = torch.full((total_pages, page_size, 512), math.nan)
    kpe = torch.full((total_pages, page_size, 64), math.nan)
    start = 0
    for n, count in zip(kv_lens, pages):
        for token in range(n):
            page = int(order[start + token // page_size])
            ckv[page, token % page_size] = torch.randn(512, generator=gen)
            kpe[page, token % page_size] = torch.randn(64, generator=gen)
        start += count
    total_q = sum(qo_lens)
    q_nope = torch.randn(total_q, heads, 512, generator=gen)
    q_pe = torch.randn(total_q, heads, 64, generator=gen)
    return WrapperBatch(
        qo_indptr=_indptr(qo_lens, device),
        kv_indptr=_indptr(pages, device),
        kv_indices=order.to(device),
        kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=device),
        q_nope=q_nope.to(device, dtype),
        q_pe=q_pe.to(device, dtype),
        ckv=ckv.to(device, dtype),
        kpe=kpe.to(device, dtype),
        page_size=page_size,
    )


def reference(
    batch: WrapperBatch,
    causal: bool,
    sm_scale: float = SM_SCALE,
    query: torch.Tensor | None = None,
    cache: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out float64 [total_q, H, 512], natural-log LSE float64 [total_q, H]) request by request.
    ``query`` [total_q, H, 576] and ``cache`` [pages, page_size, 576] replace the batch's (dequantised)."""
    query = torch.cat((batch.q_nope, batch.q_pe), -1) if query is None else query
    cache = torch.cat((batch.ckv, batch.kpe), -1) if cache is None else cache
    qo, kv = batch.qo_indptr.tolist(), batch.kv_indptr.tolist()
    lens = batch.kv_lens.tolist()
    outs, lses = [], []
    for b in range(len(lens)):
        if qo[b + 1] == qo[b]:
            continue
        rows = query[qo[b] : qo[b + 1]].unsqueeze(0)
        table = batch.kv_indices[kv[b] : kv[b + 1]].reshape(1, -1)
        seq = torch.tensor([lens[b]], dtype=torch.int32, device=table.device)
        out, lse = mla_decode_reference(rows, cache, table, seq, sm_scale, causal=causal)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses)


def row_errors(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Relative L2 error of each [total_q, H] row (absolute where the reference row is 0)."""
    diff = (got.double() - want).norm(dim=-1)
    return diff / want.norm(dim=-1).clamp_min(1.0)


def assert_matches(got, want, lse=None, want_lse=None, base_e=False, tolerance=ROW_ERROR_TOLERANCE[torch.bfloat16]):
    """Every output row within ``tolerance``, rows that see no key exactly 0, nothing NaN; the LSE in
    its base, -inf exactly where the reference's is."""
    assert not torch.isnan(got).any(), "NaN in the output"
    errors = row_errors(got, want)
    assert errors.max() <= tolerance, f"row error {errors.max():.3e} > {tolerance}"
    unseen = torch.isneginf(want_lse) if want_lse is not None else None
    if lse is None:
        return
    assert want_lse is not None
    assert lse.dtype == torch.float32 and lse.shape == want_lse.shape
    assert torch.equal(torch.isneginf(lse), unseen), "LSE must be -inf exactly where a row sees no key"
    assert not (got[unseen] != 0).any(), "a row that sees no key must be 0"
    scaled = want_lse if base_e else want_lse * LOG2E
    seen = ~unseen
    torch.testing.assert_close(lse[seen].double(), scaled[seen], rtol=2e-6, atol=1e-5)


def documentation_example(device, num_local_heads=128, batch_size=114, kv_len=999, rope=torch.randn):
    """FlashInfer's class docstring example, keyword by keyword (at its size by default; ``rope``
    fills the rope parts, which the docstring leaves zero). Returns (its batch, o, sm_scale)."""
    from mla_backend import BatchMLAPagedAttentionWrapper

    head_dim_ckv, head_dim_kpe, page_size = 512, 64, 1
    workspace = torch.empty(128 * 1024 * 1024, dtype=torch.int8).to(device)
    mla_wrapper = BatchMLAPagedAttentionWrapper(workspace, backend="fa2")
    q_indptr = torch.arange(0, batch_size + 1).to(device).int()  # for decode, each query length is 1
    kv_lens = torch.full((batch_size,), kv_len, dtype=torch.int32).to(device)
    kv_indptr = torch.arange(0, batch_size + 1).to(device).int() * kv_len
    kv_indices = torch.arange(0, batch_size * kv_len).to(device).int()
    q_nope = torch.randn(batch_size * 1, num_local_heads, head_dim_ckv, dtype=torch.bfloat16, device=device)
    q_pe = rope(batch_size * 1, num_local_heads, head_dim_kpe, dtype=torch.bfloat16, device=device)
    ckv = torch.randn(batch_size * kv_len, 1, head_dim_ckv, dtype=torch.bfloat16, device=device)
    kpe = rope(batch_size * kv_len, 1, head_dim_kpe, dtype=torch.bfloat16, device=device)
    sm_scale = 1.0 / ((128 + 64) ** 0.5)  # use head dimension before matrix absorption
    mla_wrapper.plan(
        q_indptr,
        kv_indptr,
        kv_indices,
        kv_lens,
        num_local_heads,
        head_dim_ckv,
        head_dim_kpe,
        page_size,
        False,  # causal
        sm_scale,
        q_nope.dtype,
        ckv.dtype,
    )
    o = mla_wrapper.run(q_nope, q_pe, ckv, kpe, return_lse=False)
    assert o.shape == torch.Size([batch_size, num_local_heads, head_dim_ckv]) and o.dtype == torch.bfloat16
    return WrapperBatch(q_indptr, kv_indptr, kv_indices, kv_lens, q_nope, q_pe, ckv, kpe, page_size), o, sm_scale
