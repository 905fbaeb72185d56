"""The public op on CPU tensors: input validation and the reference path."""

import math

import pytest
import torch
from oracle import assert_rounded_from, naive_decode, naive_decode_problem

from mla_backend import mla_decode, trtllm_batch_decode_with_kv_cache_mla, xqa_batch_decode_with_kv_cache_mla
from mla_backend.inputs import make_paged_problem, vllm_bf16_query_layout

WORKSPACE = torch.empty(1 << 10, dtype=torch.uint8)


def call(problem, op=trtllm_batch_decode_with_kv_cache_mla, **overrides):
    args = dict(
        query=problem.query,
        kv_cache=problem.kv_cache,
        workspace_buffer=WORKSPACE,
        qk_nope_head_dim=128,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        block_tables=problem.block_tables,
        seq_lens=problem.seq_lens,
        max_seq_len=problem.max_seq_len,
    )
    args.update(overrides)
    return op(**args)


@pytest.fixture
def problem():
    return make_paged_problem([37, 5, 64], q_len=2, heads=4, page_size=16, seed=3)


@pytest.mark.parametrize("op", [trtllm_batch_decode_with_kv_cache_mla, xqa_batch_decode_with_kv_cache_mla])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_cpu_op_equals_the_oracle_rounded_to_bf16_with_lse(op, dtype):
    """FlashInfer's names return the LSE in base 2 (FlashInfer's convention for fixed-length queries)."""
    problem = make_paged_problem(
        [37, 0, 64, 1], q_len=2, heads=4, page_size=16, dtype=dtype, seed=4, four_dim_cache=True
    )
    scale = torch.tensor([0.06], dtype=torch.float32)
    out, lse = call(problem, op, bmm1_scale=scale, bmm2_scale=1.5, return_lse=True)
    want_out, want_lse = naive_decode_problem(problem, 0.06, 1.5)
    assert out.dtype == torch.bfloat16 and out.shape == (4, 2, 4, 512)
    assert lse.dtype == torch.float32 and lse.shape == (4, 2, 4)
    assert_rounded_from(out, (lse.double() * math.log(2.0)).float(), want_out, want_lse)
    assert torch.isneginf(lse[1]).all() and not out[1].any()


def test_out_argument_is_filled_and_returned():
    problem = make_paged_problem([20, 7], q_len=1, heads=8, page_size=32, seed=6)
    out3 = torch.full((2, 8, 512), float("nan"), dtype=torch.bfloat16)
    got = call(problem, out=out3, bmm1_scale=0.1)
    assert got is out3 and not torch.isnan(out3).any()
    out4 = torch.full((2, 1, 8, 512), float("nan"), dtype=torch.bfloat16)
    assert call(problem, out=out4, bmm1_scale=0.1) is out4
    torch.testing.assert_close(out4.view(2, 8, 512), out3)


BAD_INPUTS = {
    "query dtype": (dict(query="fp16"), TypeError, "query dtype"),
    "dtype mismatch": (dict(kv_cache="fp8"), TypeError, "must match query dtype"),
    "query rank": (dict(query="3d"), ValueError, "query must be"),
    "query last dim": (dict(query="dim512"), ValueError, "last dim must be 576"),
    "kv_cache last dim": (dict(kv_cache="dim512"), ValueError, "kv_cache last dim"),
    "kv_cache rank": (dict(kv_cache="2d"), ValueError, "kv_cache must be"),
    "kv_lora_rank": (dict(kv_lora_rank=256), ValueError, "kv_lora_rank must be 512"),
    "rope dim": (dict(qk_rope_head_dim=32), ValueError, "qk_rope_head_dim must be 64"),
    "nope dim": (dict(qk_nope_head_dim=64), ValueError, "qk_nope_head_dim"),
    "too many heads": (dict(query="heads256"), ValueError, "number of heads"),
    "q_len 9": (dict(query="qlen9"), ValueError, "q_len"),
    "page size": (dict(kv_cache="page12"), ValueError, "page size .* must be a power of two in 1..1024, got 12"),
    "max_seq_len": (dict(max_seq_len=10_000), ValueError, "exceeds what block_tables can address"),
    "block_tables dtype": (dict(block_tables="int64"), TypeError, "block_tables must be int32"),
    "seq_lens dtype": (dict(seq_lens="int64"), TypeError, "seq_lens must be int32"),
    "seq_lens shape": (dict(seq_lens="short"), ValueError, "seq_lens must be"),
    "block_tables batch": (dict(block_tables="short"), ValueError, "block_tables must be"),
    "query rows not contiguous": (dict(query="strided"), ValueError, "query rows must be contiguous"),
    "query misaligned": (dict(query="misaligned"), ValueError, "query must start at a 16-byte aligned"),
    "query strides": (dict(query="odd_stride"), ValueError, "query strides must be multiples of 16 bytes"),
    "split query pe dim": (dict(query="pe32"), ValueError, r"q_pe must be \[batch, q_len, heads, 64\]"),
    "split query shapes": (dict(query="pe_heads"), ValueError, "must agree in batch, q_len, heads"),
    "split query dtypes": (dict(query="pe_fp8"), TypeError, "q_pe dtype"),
    "split query triple": (dict(query="triple"), TypeError, "pair of tensors"),
    "non-contiguous cache rows": (dict(kv_cache="strided"), ValueError, "kv_cache token rows must be contiguous"),
    "kv_cache misaligned": (dict(kv_cache="misaligned"), ValueError, "kv_cache must start at a 16-byte aligned"),
    "kv_cache page stride": (dict(kv_cache="odd_stride"), ValueError, "page strides must be multiples of 16 bytes"),
    "kv_cache token stride": (dict(kv_cache="token_stride"), ValueError, r"got \(18560, 1160, 2\) bytes"),
    "device mismatch": (dict(block_tables="meta"), ValueError, "is on meta"),
    "sinks": (dict(sinks=[torch.zeros(4)]), ValueError, "sinks"),
    "out dtype": (dict(out="fp32"), TypeError, "out must be bfloat16"),
    "out shape": (dict(out="wrong"), ValueError, "out must have shape"),
    "scale dtype": (dict(bmm1_scale="fp64"), TypeError, "bmm1_scale tensor must be float32"),
    "scale size": (dict(bmm2_scale="two"), ValueError, "bmm2_scale tensor must have one element"),
    "scale type": (dict(bmm1_scale="text"), TypeError, "bmm1_scale must be a float"),
    "page id out of range": (dict(block_tables="bad_id"), ValueError, "names page"),
    "seq_len above max_seq_len": (dict(max_seq_len=40), ValueError, "outside 0..max_seq_len"),
    "sparse": (dict(sparse_mla_top_k=64), ValueError, "sparse"),
    "negative page id": (dict(block_tables="negative_id"), ValueError, "names page -1"),
    "negative seq_len": (dict(seq_lens="negative"), ValueError, r"seq_lens\[1\] = -1 is outside"),
    "zero heads": (dict(query="heads0"), ValueError, r"number of heads \(query.shape\[2\]\) must be 1..128, got 0"),
    "zero q_len": (dict(query="qlen0"), ValueError, "q_len .* must be 1..8, got 0"),
    "out not contiguous": (dict(out="transposed"), ValueError, "out must be contiguous"),
    "workspace not contiguous": (
        dict(workspace_buffer="strided_bytes"),
        ValueError,
        "workspace_buffer must be contiguous",
    ),
    "scale on another device": (dict(bmm1_scale="meta_scale"), ValueError, "bmm1_scale is on meta"),
    "4-D cache dim 1": (dict(kv_cache="two_heads"), ValueError, "4-D kv_cache must have size 1 in dim 1"),
    "split query nope dim": (dict(query="nope256"), ValueError, r"q_nope must be \[batch, q_len, heads, 512\]"),
    "split query devices": (dict(query="pe_meta"), ValueError, "q_pe is on meta"),
    "query type": (dict(query="not_a_tensor"), TypeError, "query must be a torch.Tensor or a"),
    "kv_cache type": (
        dict(kv_cache="not_a_tensor"),
        TypeError,
        "kv_cache must be a torch.Tensor or a .*, got str",
    ),
    "split cache triple": (dict(kv_cache="nested_list"), TypeError, r"pair of tensors \(ckv_cache, kpe_cache\)"),
    "split cache rope dim": (dict(kv_cache="kpe32"), ValueError, r"kpe_cache must be \[pages, page_size, 64\]"),
    "split cache pages": (dict(kv_cache="kpe_one_page"), ValueError, "must agree in pages and page size"),
    "split cache dtypes": (dict(kv_cache="kpe_fp8"), TypeError, "kpe_cache dtype"),
    "split cache devices": (dict(kv_cache="kpe_meta"), ValueError, "kpe_cache is on meta"),
    "split cache rows strided": (dict(kv_cache="ckv_strided"), ValueError, "ckv_cache token rows must be contiguous"),
    "workspace type": (dict(workspace_buffer="not_a_tensor"), TypeError, "workspace_buffer must be a torch.Tensor"),
    "out type": (dict(out="not_a_tensor"), TypeError, "out must be a torch.Tensor, got str"),
    "max_seq_len float": (dict(max_seq_len=64.0), TypeError, "max_seq_len must be a non-negative int"),
    "max_seq_len negative": (dict(max_seq_len=-1), TypeError, "max_seq_len must be a non-negative int"),
    "nope dim float": (dict(qk_nope_head_dim=128.0), ValueError, "qk_nope_head_dim must be one of"),
    "scale not finite": (dict(bmm1_scale=float("inf")), ValueError, "bmm1_scale must be finite, got inf"),
    "query on a device nothing serves": (dict(query="on_meta"), ValueError, "query is on meta: the op runs on CUDA"),
    "block_tables rows strided": (dict(block_tables="every_other"), ValueError, "block_tables rows must be contig"),
    "seq_lens strided": (dict(seq_lens="every_other"), ValueError, "seq_lens must be contiguous"),
    "max_seq_len one past the table": (dict(max_seq_len=81), ValueError, "exceeds what block_tables can address"),
    "bad id in a partial last page": (dict(block_tables="bad_last_page"), ValueError, "names page 10000"),
}


def corrupt(problem, key, how):
    """The named bad version of argument ``key``."""
    q, kv, bt, sl = problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens
    makers = {
        "fp16": lambda: q.to(torch.float16),
        "fp8": lambda: kv.to(torch.float8_e4m3fn),
        "3d": lambda: q[:, 0],
        "dim512": lambda: (q if key == "query" else kv)[..., :512].contiguous(),
        "2d": lambda: kv[0],
        "heads256": lambda: q[:, :, :1].expand(-1, -1, 256, -1).contiguous(),
        "qlen9": lambda: q[:, :1].expand(-1, 9, -1, -1).contiguous(),
        "page12": lambda: kv[:, :12],
        "int64": lambda: (bt if key == "block_tables" else sl).long(),
        "short": lambda: (bt if key == "block_tables" else sl)[:2],
        "strided": lambda: torch.cat([q, q] if key == "query" else [kv, kv], dim=-1)[..., ::2],
        "kpe32": lambda: (kv[..., :512], kv[..., 512:544]),
        "token_stride": lambda: torch.cat([kv, kv[..., :4]], dim=-1)[..., :576],  # page stride 16 x 1160 bytes
        "kpe_one_page": lambda: (kv[..., :512], kv[:1, ..., 512:]),
        "kpe_fp8": lambda: (kv[..., :512], kv[..., 512:].to(torch.float8_e4m3fn)),
        "kpe_meta": lambda: (kv[..., :512], kv[..., 512:].to("meta")),
        "ckv_strided": lambda: (torch.cat([kv, kv], dim=-1)[..., :1024:2], kv[..., 512:]),
        "misaligned": lambda: (
            torch.cat([q, q], dim=-1)[..., 1:577]
            if key == "query"
            else torch.cat([kv.new_zeros(1), kv.flatten()])[1:].view(kv.shape)
        ),
        "odd_stride": lambda: (
            torch.cat([q, q[..., :1]], dim=-1)[..., :576]
            if key == "query"
            else kv.new_zeros(kv.shape[0] * (kv.shape[1] * 576 + 1)).as_strided(
                kv.shape, (kv.shape[1] * 576 + 1, 576, 1)
            )
        ),
        "pe32": lambda: (q[..., :512], q[..., 512:544]),
        "pe_heads": lambda: (q[..., :512], q[:, :, :1, 512:]),
        "pe_fp8": lambda: (q[..., :512], q[..., 512:].to(torch.float8_e4m3fn)),
        "triple": lambda: (q[..., :512], q[..., 512:], q),
        "meta": lambda: bt.to("meta"),
        "on_meta": lambda: q.to("meta"),
        "fp32": lambda: torch.empty(3, 2, 4, 512),
        "wrong": lambda: torch.empty(3, 4, 512, dtype=torch.bfloat16),
        "fp64": lambda: torch.ones(1, dtype=torch.float64),
        "two": lambda: torch.ones(2),
        "text": lambda: "1.0",
        "bad_id": lambda: bt.clone().index_fill_(1, torch.tensor([0]), 10_000),
        "negative_id": lambda: bt.clone().index_fill_(1, torch.tensor([0]), -1),
        "negative": lambda: sl.clone().index_fill_(0, torch.tensor([1]), -1),
        "heads0": lambda: q[:, :, :0],
        "qlen0": lambda: q[:, :0],
        "transposed": lambda: torch.empty(3, 4, 2, 512, dtype=torch.bfloat16).transpose(1, 2),
        "strided_bytes": lambda: torch.empty(2048, dtype=torch.uint8)[::2],
        "meta_scale": lambda: torch.ones(1, device="meta"),
        "bad_last_page": lambda: bt.clone().index_put_(
            (torch.tensor([0]), torch.tensor([2])), torch.tensor([10_000], dtype=torch.int32)
        ),
        "nope256": lambda: (q[..., :256], q[..., 512:]),
        "pe_meta": lambda: (q[..., :512], q[..., 512:].to("meta")),
        "not_a_tensor": lambda: "not a tensor",
        "nested_list": lambda: kv.tolist(),
        "every_other": lambda: (
            torch.stack([bt, bt], dim=-1).flatten(1)[:, ::2]
            if key == "block_tables"
            else torch.stack([sl, sl], dim=-1)[:, 0]
        ),
        "two_heads": lambda: kv.view(kv.shape[0], 1, kv.shape[1], 576).expand(-1, 2, -1, -1),
    }
    return makers[how]()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_split_query_pair_equals_the_whole_query(dtype):
    problem = make_paged_problem([37, 64], q_len=2, heads=4, page_size=16, dtype=dtype, seed=8)
    nope, pe = vllm_bf16_query_layout(problem.query)  # strided views, as vLLM hands them over
    assert not nope.is_contiguous() and not pe.is_contiguous()
    whole_out, whole_lse = call(problem, bmm1_scale=0.1, return_lse=True)
    pair_out, pair_lse = call(problem, query=(nope, pe), bmm1_scale=0.1, return_lse=True)
    assert torch.equal(pair_out, whole_out) and torch.equal(pair_lse, whole_lse)


def test_the_stride_of_a_size_one_dim_does_not_matter():
    problem = make_paged_problem([37], q_len=1, heads=4, page_size=16, seed=9)
    odd = torch.as_strided(problem.query, problem.query.shape, (3, 7, 576, 1))  # strides of size-1 dims
    torch.testing.assert_close(call(problem, query=odd, bmm1_scale=0.1), call(problem, bmm1_scale=0.1))


def test_junk_page_ids_past_seq_len_are_ignored(problem):
    assert (problem.block_tables[:, -1] < 0).any() or (problem.block_tables[:, -1] > 1000).any()
    call(problem, bmm1_scale=0.1)  # the factory put junk ids past each length: no error


def raising_sites() -> set[int]:
    """Line of every check in checks.py: each ``_require(...)`` call and each ``raise`` outside it."""
    import ast
    import inspect

    from mla_backend import checks

    tree = ast.parse(inspect.getsource(checks))
    sites = set()
    for func in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != "_require"):
        for node in ast.walk(func):
            if isinstance(node, ast.Raise) or (
                isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_require"
            ):
                sites.add(node.lineno)
    return sites


def raising_line(err: BaseException) -> int | None:
    """The checks.py line that raised (the innermost checks.py frame outside ``_require``), or None
    for a check made elsewhere (decode.py's own)."""
    from mla_backend import checks

    lines = [
        frame.lineno
        for frame in __import__("traceback").extract_tb(err.__traceback__)
        if frame.filename == checks.__file__ and frame.name != "_require"
    ]
    return lines[-1] if lines else None


def call_ragged(problem, **overrides):
    indices, indptr = problem.ragged_ids()
    args = dict(block_tables=indices, kv_indptr=indptr, bmm1_scale=0.1)
    args.update(overrides)
    block_tables = args.pop("block_tables")
    p = problem
    return mla_decode(p.query, p.kv_cache, None, block_tables, p.seq_lens, p.max_seq_len, **args)


RAGGED_BAD_INPUTS = {
    "kv_indptr type": (dict(kv_indptr=[0, 3, 4, 8]), TypeError, "kv_indptr must be a torch.Tensor"),
    "kv_indptr dtype": (dict(kv_indptr="int64"), TypeError, "kv_indptr must be int32"),
    "kv_indptr shape": (dict(kv_indptr="short"), ValueError, r"kv_indptr must be a contiguous \[batch \+ 1 = 4\]"),
    "kv_indptr device": (dict(kv_indptr="meta"), ValueError, "kv_indptr is on meta"),
    "kv_indptr decreasing": (dict(kv_indptr="decreasing"), ValueError, "kv_indptr must be non-decreasing"),
    "kv_indptr past the ids": (dict(kv_indptr="past"), ValueError, "<= kv_indices.numel"),
    "ragged ids with a 2-D table": (dict(block_tables="dense"), ValueError, "block_tables holds the ragged page ids"),
    "too few ids for seq_len": (dict(kv_indptr="short_request"), ValueError, r"needs 3 pages of 16, request 0 has 2"),
    "ragged id out of range": (dict(block_tables="bad_id"), ValueError, "kv_indices of request.0. names page 10000"),
    "causal not a bool": (dict(causal=1), TypeError, "causal must be a bool"),
    "positions past int32": (dict(block_tables="huge"), ValueError, "more than int32 holds"),
}


def corrupt_ragged(problem, key, how):
    indices, indptr = problem.ragged_ids()
    makers = {
        "int64": lambda: indptr.long(),
        "short": lambda: indptr[:3],
        "meta": lambda: indptr.to("meta"),
        "decreasing": lambda: indptr.flip(0),
        "past": lambda: torch.cat([indptr[:-1], indptr[-1:] + 1]),
        "dense": lambda: problem.block_tables,
        "short_request": lambda: torch.cat([indptr[:1], indptr[1:] - 1]),
        "bad_id": lambda: indices.clone().index_fill_(0, torch.tensor([0]), 10_000),
        "huge": lambda: torch.zeros(1, dtype=torch.int32).expand(1 << 27),
    }
    return makers[how]()


# Each table of bad inputs with how its arguments are corrupted and how the op is called.
BAD_INPUT_SUITES = {
    "table": (BAD_INPUTS, corrupt, call),
    "ragged": (RAGGED_BAD_INPUTS, corrupt_ragged, call_ragged),
}


def call_bad(problem, suite: str, case: str):
    cases, corrupt_arg, call_op = BAD_INPUT_SUITES[suite]
    change = cases[case][0]
    overrides = {k: corrupt_arg(problem, k, v) if isinstance(v, str) else v for k, v in change.items()}
    return call_op(problem, **overrides)


@pytest.mark.parametrize(
    "suite, case", [(suite, case) for suite, (cases, _, _) in BAD_INPUT_SUITES.items() for case in cases]
)
def test_bad_input_raises_clear_error(problem, suite, case):
    _, exc, fragment = BAD_INPUT_SUITES[suite][0][case]
    with pytest.raises(exc, match=fragment):
        call_bad(problem, suite, case)


@pytest.mark.parametrize("causal", [True, False])
def test_ragged_ids_give_the_table_s_result(problem, causal):
    """Ragged kv_indices/kv_indptr address the same pages as the table: the same result, bit for bit;
    causal=False lets every query token see all seq_len keys."""
    dense = mla_decode(*problem.decode_args(None), bmm1_scale=0.1, return_lse=True, causal=causal)
    assert all(torch.equal(a, b) for a, b in zip(call_ragged(problem, return_lse=True, causal=causal), dense))
    want_out, want_lse = naive_decode_problem(problem, 0.1, 1.0, causal=causal)
    assert_rounded_from(*dense, want_out, want_lse)


def test_page_size_one_is_a_token_indexed_cache(problem):
    """Pages of one token: block_tables holds a slot id a token, and the result is the paged one's."""
    page = problem.kv_cache.shape[-2]
    first_slots = problem.block_tables.clamp(0, problem.kv_cache.shape[0] - 1).long() * page
    slots = first_slots[:, :, None] + torch.arange(page)
    tokens = slots.flatten(1).to(torch.int32)
    token_cache = problem.kv_cache.reshape(-1, 1, problem.kv_cache.shape[-1])
    paged = mla_decode(*problem.decode_args(None), bmm1_scale=0.1, return_lse=True)
    one = mla_decode(
        problem.query, token_cache, None, tokens, problem.seq_lens, problem.max_seq_len, bmm1_scale=0.1,
        return_lse=True,
    )  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(one, paged))


def test_every_check_in_checks_py_is_hit_by_a_bad_input(problem):
    """A check nothing triggers could be deleted unnoticed; a new check needs a BAD_INPUTS case."""
    hit = set()
    for suite, (cases, _, _) in BAD_INPUT_SUITES.items():
        for case, (_, exc, _) in cases.items():
            try:
                call_bad(problem, suite, case)
            except exc as err:
                hit.add(raising_line(err))
    missing = sorted(raising_sites() - hit)
    assert not missing, f"checks.py lines no bad input reaches: {missing}"


@pytest.mark.parametrize("damage", ["out x 1.01", "out one row", "lse + 1e-4", "lse one -inf"])
def test_the_oracle_comparison_fails_on_a_damaged_result(damage):
    problem = make_paged_problem([37, 64], q_len=2, heads=4, page_size=16, seed=11)
    out, lse = call(problem, bmm1_scale=0.06, return_lse=True, return_lse_base="basee")
    want_out, want_lse = naive_decode_problem(problem, 0.06, 1.0)
    assert_rounded_from(out, lse, want_out, want_lse)
    if damage == "out x 1.01":
        out = (out.double() * 1.01).to(torch.bfloat16)
    elif damage == "out one row":
        out = out.clone()
        out[1, 0, 2] = out[1, 0, 3]
    elif damage == "lse + 1e-4":
        lse = lse + 1e-4
    else:
        lse = lse.clone()
        lse[0, 0, 0] = float("-inf")
    with pytest.raises(AssertionError):
        assert_rounded_from(out, lse, want_out, want_lse)


def test_trtllm_gen_route_hands_flashinfer_the_whole_query_and_converts_its_base_2_lse(monkeypatch):
    """The trtllm-gen route runs only on SM100 with FlashInfer; its plumbing runs here against a
    stand-in for flashinfer.mla that computes the contract in FlashInfer's conventions."""
    import sys
    import types

    from mla_backend import decode
    from mla_backend.checks import check_decode_inputs

    seen = {}

    def fake_trtllm(
        query,
        kv_cache,
        workspace,
        qk_nope,
        kv_lora,
        rope,
        block_tables,
        seq_lens,
        max_seq_len,
        out,
        bmm1_scale,
        bmm2_scale,
        enable_pdl,
        backend,
        return_lse,
    ):
        seen.update(
            contiguous=query.is_contiguous(),
            shape=tuple(query.shape),
            nope=qk_nope,
            backend=backend,
            pdl=enable_pdl,
            dims=(kv_lora, rope),
        )
        want_out, want_lse = naive_decode(query, kv_cache, block_tables, seq_lens, bmm1_scale, bmm2_scale)
        out.copy_(want_out)
        return (out, want_lse / math.log(2.0)) if return_lse else out

    flashinfer = types.ModuleType("flashinfer")
    flashinfer.mla = types.SimpleNamespace(trtllm_batch_decode_with_kv_cache_mla=fake_trtllm)
    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer)
    monkeypatch.setitem(sys.modules, "flashinfer.mla", flashinfer.mla)
    problem = make_paged_problem([37, 64], q_len=2, heads=4, page_size=16, seed=12)
    want_out, want_lse = naive_decode_problem(problem, 0.06, 1.0)
    strided = torch.cat([problem.query, problem.query], dim=-1)[..., :576]  # rows 16-byte aligned, not contiguous
    for query in (vllm_bf16_query_layout(problem.query), strided):
        checked = check_decode_inputs(
            query,
            problem.kv_cache,
            WORKSPACE,
            192,
            problem.block_tables,
            problem.seq_lens,
            problem.max_seq_len,
            None,
            0.06,
            1.0,
        )
        lse = torch.full((2, 2, 4), float("nan"))
        decode._run_flashinfer_trtllm_gen(checked, WORKSPACE, True, lse)
        assert seen == dict(
            contiguous=True, shape=(2, 2, 4, 576), nope=192, backend="trtllm-gen", pdl=True, dims=(512, 64)
        )
        assert_rounded_from(checked.out, lse, want_out, want_lse)
        checked.out.fill_(float("nan"))
        decode._run_flashinfer_trtllm_gen(checked, WORKSPACE, None, None)
        assert_rounded_from(checked.out, None, want_out, None)


@pytest.mark.parametrize(
    "capability, flashinfer, configured, backend, want",
    [
        ((12, 0), False, "auto", "auto", "bundled"),
        ((10, 0), True, "auto", "auto", "trtllm-gen"),
        ((10, 0), True, "auto", "xqa", "bundled"),  # the argument overrides auto's choice
        ((10, 0), True, "xqa", "auto", "bundled"),  # "auto" as the argument keeps the configured backend
        ((12, 0), True, "xqa", "trtllm-gen", "needs compute capability 10.0 or 10.3"),
        ((9, 0), False, "auto", "trtllm-gen", "needs compute capability 10.0 or 10.3"),
        ((10, 0), False, "auto", "trtllm-gen", "needs FlashInfer"),
        ((8, 0), False, "auto", "auto", "no MLA decode kernel here"),
        ((8, 0), False, "auto", "xqa", "backend='xqa' needs compute capability"),
    ],
)
def test_the_backend_argument_picks_the_kernel_for_gpu_tensors(
    capability, flashinfer, configured, backend, want, monkeypatch
):
    """Which kernel a CUDA tensor's call reaches (resolved before any launch; no GPU needed here)."""
    from mla_backend import route as route_module
    from mla_backend.config import BackendUnavailableError, MLABackendConfig
    from mla_backend.decode import call_kernel

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(route_module, "flashinfer_available", lambda: flashinfer)
    device = torch.device("cuda", 0)
    settings = MLABackendConfig(backend=configured)
    if want in ("bundled", "trtllm-gen"):
        assert call_kernel(device, settings, backend, None) == want
    else:
        with pytest.raises(BackendUnavailableError, match=want):
            call_kernel(device, settings, backend, None)


def test_cpu_tensors_run_the_reference_whatever_the_backend_but_a_bad_name_is_refused(problem):
    want_out, want_lse = naive_decode_problem(problem, 0.06, 1.0)
    for backend in ("auto", "xqa", "trtllm-gen"):
        out, lse = call(problem, bmm1_scale=0.06, return_lse=True, backend=backend, return_lse_base="basee")
        assert_rounded_from(out, lse, want_out, want_lse)
    with pytest.raises(ValueError, match="backend"):
        call(problem, backend="flashmla")


def test_the_capability_override_decides_for_gpu_tensors(monkeypatch):
    """``device_capability`` makes the op choose as on another GPU: on an RTX 5090 told it is SM 8.0, no kernel."""
    from mla_backend.config import BackendUnavailableError, MLABackendConfig
    from mla_backend.decode import call_kernel

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 0))
    device = torch.device("cuda", 0)
    assert call_kernel(device, MLABackendConfig(), "auto", None) == "bundled"
    with pytest.raises(BackendUnavailableError, match="8.0"):
        call_kernel(device, MLABackendConfig(device_capability="8.0"), "auto", None)
