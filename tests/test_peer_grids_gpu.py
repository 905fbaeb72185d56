"""The bundled kernels on our peers' own test grids, judged by their own accuracy rules (GPU only).

FlashMLA's dense-decoding grid (every batch, q_len, length, head count and variable-length case that
MLA's single KV head allows; decode is causal) in bf16 and fp8, through ``mla_decode`` (natural-log
LSE, as FlashMLA's); FlashInfer's trtllm-gen grid through ``trtllm_batch_decode_with_kv_cache_mla``
called as FlashInfer's tests call it (``lse=`` buffer, float and device-tensor scales, PDL on, off
and auto), its grouped-heads and odd-heads grids, variable-length queries and split inputs. Every
LSE is held to FlashMLA's LSE rule (1e-6 absolute or 8/65536 relative). Outputs are poisoned first.
``PEER_GRID_REPORT=path`` appends one JSON line per case (the errors) for docs/validation.md.
"""

import json
import math
import os

import pytest
import torch
from peer_grids import (
    FLASHINFER_TOL,
    FLASHMLA_LSE,
    FLASHMLA_OUT,
    Problem,
    flashinfer_problem,
    flashmla_problem,
    flashmla_rule,
    reference,
)

from mla_backend import batch_mla_paged_attention, mla_decode, trtllm_batch_decode_with_kv_cache_mla

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
LN2 = math.log(2.0)


@pytest.fixture(scope="module")
def workspace():
    return torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")


def report(**fields) -> None:
    path = os.environ.get("PEER_GRID_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(fields) + "\n")


def poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def judge_lse(grid: str, case: str, got_lse: torch.Tensor, want_lse: torch.Tensor, **extra) -> None:
    verdict = flashmla_rule(got_lse, want_lse, **FLASHMLA_LSE)
    report(grid=grid, case=case, part="lse", passed=verdict.passed, max_abs=verdict.max_abs, **extra)
    assert verdict.passed, f"LSE: {verdict.why} (largest error {verdict.max_abs:.2e})"


# --- FlashMLA's dense-decoding grid --------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
@pytest.mark.parametrize("heads", [1, 3, 9, 63, 64, 126, 128])
@pytest.mark.parametrize("s_k", [20, 140, 4096])
@pytest.mark.parametrize("q_len", [1, 2, 4])
@pytest.mark.parametrize("batch", [1, 2, 6, 64])
def test_flashmla_dense_decoding_grid(workspace, batch, q_len, s_k, heads, varlen, dtype):
    if heads * q_len > 128 * 8:
        pytest.skip("beyond the kernels' rows")
    p = flashmla_problem(batch, q_len, s_k, heads, varlen, DTYPES[dtype], seed=batch * 7 + q_len * 3 + s_k + heads)
    scale = 576**-0.5
    out = poisoned((batch, q_len, heads, 512), torch.bfloat16)
    lse = poisoned((batch, q_len, heads), torch.float32)
    mla_decode(
        p.query, p.kv_cache, workspace, p.block_tables, p.seq_lens, p.max_seq_len, out=out, lse=lse, bmm1_scale=scale
    )
    want_out, want_lse = reference(p, scale)
    case = f"b{batch} q{q_len} s{s_k} h{heads} {'varlen' if varlen else 'fixed'} {dtype}"
    verdict = flashmla_rule(out, want_out, **FLASHMLA_OUT)
    report(grid="flashmla", case=case, part="out", passed=verdict.passed, max_abs=verdict.max_abs)
    assert verdict.passed, f"out: {verdict.why}"
    judge_lse("flashmla", case, lse, want_lse)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("heads", [1, 3, 9, 63, 64, 126, 128])
def test_flashmla_grid_with_zero_length_requests(workspace, heads, dtype):
    """FlashMLA's corner case: 128 requests, q_len 2, about half of them of length 0. Their LSE is
    -inf (FlashMLA's own API says +inf; this package keeps FlashInfer's -inf) and their output 0."""
    p = flashmla_problem(128, 2, 4096, heads, True, DTYPES[dtype], seed=heads, zero_lengths=True)
    out = poisoned((128, 2, heads, 512), torch.bfloat16)
    out_, lse = mla_decode(
        p.query, p.kv_cache, workspace, p.block_tables, p.seq_lens, p.max_seq_len, out=out, return_lse=True,
        bmm1_scale=576**-0.5,
    )  # fmt: skip
    want_out, want_lse = reference(p, 576**-0.5)
    assert (p.seq_lens == 0).any() and out_ is out
    assert flashmla_rule(out, want_out, **FLASHMLA_OUT).passed
    judge_lse("flashmla-zero", f"h{heads} {dtype}", lse, want_lse)


# --- lengths from 1 key to 64k, q_len 1-8 causal, split-KV merged or not -------------------------


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("splits", [None, 1, 3, 64])
@pytest.mark.parametrize("q_len", [1, 2, 5, 8])
def test_lse_exact_from_one_key_to_64k(workspace, q_len, splits, dtype, monkeypatch):
    import mla_backend.decode as decode_module
    from mla_backend import MLABackendConfig

    config = MLABackendConfig.from_sources({"num_kv_splits": splits} if splits else {})
    monkeypatch.setattr(decode_module, "default_config", lambda: config)
    lengths = [q_len, q_len + 1, q_len + 2, 100, 65536]
    gen = torch.Generator(device="cuda").manual_seed(q_len * 11 + (splits or 0))
    pages = sum(-(-n // 64) for n in lengths)
    cache = (torch.randn(pages, 64, 576, device="cuda", generator=gen) / 10).clamp(-1, 1).to(DTYPES[dtype])
    table = torch.full((len(lengths), 1024), -1, dtype=torch.int32, device="cuda")
    order, cursor = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32), 0
    for b, n in enumerate(lengths):
        table[b, : -(-n // 64)] = order[cursor : cursor + -(-n // 64)]
        cursor += -(-n // 64)
    query = (torch.randn(len(lengths), q_len, 16, 576, device="cuda", generator=gen) / 10).clamp(-1, 1)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    p = Problem(query.to(DTYPES[dtype]), cache, table, seq_lens, max(lengths))
    lse = poisoned((len(lengths), q_len, 16), torch.float32)
    out = mla_decode(p.query, p.kv_cache, workspace, p.block_tables, p.seq_lens, p.max_seq_len, lse=lse, bmm1_scale=0.3)
    want_out, want_lse = reference(p, 0.3, block=1)
    assert flashmla_rule(out, want_out, **FLASHMLA_OUT).passed
    judge_lse("lengths", f"q{q_len} splits {splits} {dtype}", lse, want_lse)


# --- FlashInfer's trtllm-gen MLA grids -----------------------------------------------------------


def flashinfer_call(p, workspace, bmm1, *, pdl, tensor_scales, lse_shape, split=False, **extra):
    batch, q_len, heads, _ = p.query.shape
    device_scale = lambda v: torch.tensor([v], dtype=torch.float32, device="cuda")  # noqa: E731
    bmm1_scale = device_scale(bmm1) if tensor_scales else bmm1
    bmm2_scale = device_scale(1.0) if tensor_scales else 1.0
    out = poisoned((batch, q_len, heads, 512), torch.bfloat16)
    lse = poisoned(lse_shape, torch.float32)
    if split:  # the tensor-first form with separate halves (independent tensors, read in place)
        result = batch_mla_paged_attention(
            q_nope=p.query[..., :512].clone(), q_pe=p.query[..., 512:].clone(),
            ckv_cache=p.kv_cache[..., :512].clone(), kpe_cache=p.kv_cache[..., 512:].clone(),
            workspace_buffer=workspace, qk_nope_head_dim=128, kv_lora_rank=512, qk_rope_head_dim=64,
            block_tables=p.block_tables, seq_lens=p.seq_lens, max_seq_len=p.max_seq_len, out=out,
            bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale, enable_pdl=pdl, lse=lse, return_lse=True, **extra,
        )  # fmt: skip
    else:
        result = trtllm_batch_decode_with_kv_cache_mla(
            query=p.query, kv_cache=p.kv_cache, workspace_buffer=workspace, qk_nope_head_dim=128,
            kv_lora_rank=512, qk_rope_head_dim=64, block_tables=p.block_tables, seq_lens=p.seq_lens,
            max_seq_len=p.max_seq_len, out=out, bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale, enable_pdl=pdl,
            backend="auto", lse=lse, return_lse=True, **extra,
        )  # fmt: skip
    assert result[0] is out and result[1] is lse
    return out, lse


def judge_flashinfer(grid, case, p, out, lse_base2, bmm1, dtype):
    want_out, want_lse = reference(p, bmm1)
    tol = FLASHINFER_TOL[dtype]
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.double(), want_out.to(torch.bfloat16).double(), rtol=tol, atol=tol)
    judge_lse(grid, case, lse_base2.view(want_lse.shape) * LN2, want_lse)


@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("page", [32, 64])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("scale", [1.0, 0.5])
@pytest.mark.parametrize("batch", [1, 2, 4, 16, 32, 64, 128, 256, 512, 768, 1024])
def test_flashinfer_trtllm_gen_grid(workspace, batch, scale, dtype, page, q_len):
    cycle = batch.bit_length() + page + q_len
    p = flashinfer_problem(batch, q_len, 128, page, 1024, DTYPES[dtype], seed=cycle)
    bmm1 = scale / math.sqrt(128 + 64)
    lse_shape = (batch * q_len, 128) if cycle % 2 else (batch, q_len, 128)
    out, lse = flashinfer_call(
        p, workspace, bmm1, pdl=(True, False, None)[cycle % 3], tensor_scales=scale == 0.5, lse_shape=lse_shape
    )
    judge_flashinfer("flashinfer", f"b{batch} x{scale} {dtype} p{page} q{q_len}", p, out, lse, bmm1, DTYPES[dtype])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("heads", [6, 8, 12, 16, 20, 24, 32, 48])
@pytest.mark.parametrize("q_len", [1, 2, 3, 4, 5, 6, 7, 8])
def test_flashinfer_grouped_and_odd_head_grids(workspace, q_len, heads, dtype):
    """FlashInfer's grouped-MLA (8-32 heads x q_len 2-8) and odd-heads (6-48) grids, here as one
    cross product, half of them through the split (q_nope, q_pe, ckv, kpe) form."""
    p = flashinfer_problem(16, q_len, heads, 64, 1024, DTYPES[dtype], seed=heads * 9 + q_len)
    bmm1 = 1 / math.sqrt(192)
    out, lse = flashinfer_call(
        p, workspace, bmm1, pdl=None, tensor_scales=False, lse_shape=(16 * q_len, heads), split=heads % 3 == 0
    )
    judge_flashinfer("flashinfer-heads", f"h{heads} q{q_len} {dtype}", p, out, lse, bmm1, DTYPES[dtype])


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_flashinfer_variable_length_queries(workspace, dtype):
    """cum_seq_lens_q: packed [total_q, H, 576] queries, q_len 1-8 per request; each request's rows
    equal that request run alone at its own q_len (FlashInfer's natural-log LSE on this path)."""
    q_lens = [1, 3, 8, 2, 5, 1, 7, 4]
    heads = 16
    parts = [flashinfer_problem(1, n, heads, 64, 900, DTYPES[dtype], seed=i) for i, n in enumerate(q_lens)]
    pages = [t.kv_cache for t in parts]
    offsets = torch.tensor([0] + [c.shape[0] for c in pages[:-1]]).cumsum(0).tolist()
    width = max(t.block_tables.shape[1] for t in parts)
    table = torch.full((len(parts), width), -1, dtype=torch.int32, device="cuda")
    for i, t in enumerate(parts):
        table[i, : t.block_tables.shape[1]] = t.block_tables[0] + offsets[i]
    cache = torch.cat(pages)
    query = torch.cat([t.query[0] for t in parts])  # [total_q, H, 576]
    cum = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    seq_lens = torch.cat([t.seq_lens for t in parts])
    out = poisoned((query.shape[0], heads, 512), torch.bfloat16)
    lse = poisoned((query.shape[0], heads), torch.float32)
    got, got_lse = batch_mla_paged_attention(
        query=query, kv_cache=cache, workspace_buffer=workspace, qk_nope_head_dim=128, kv_lora_rank=512,
        qk_rope_head_dim=64, block_tables=table, seq_lens=seq_lens, max_seq_len=int(seq_lens.max()), out=out,
        bmm1_scale=0.07, lse=lse, return_lse=True, cum_seq_lens_q=cum, max_q_len=max(q_lens),
    )  # fmt: skip
    assert got is out and got_lse is lse
    for i, t in enumerate(parts):
        rows = slice(int(cum[i]), int(cum[i + 1]))
        want_out, want_lse = reference(t, 0.07)
        torch.testing.assert_close(out[rows].double(), want_out[0].to(torch.bfloat16).double(), rtol=1e-2, atol=1e-2)
        judge_lse("flashinfer-varlen", f"request {i} {dtype}", lse[rows], want_lse[0])
