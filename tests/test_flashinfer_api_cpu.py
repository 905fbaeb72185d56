"""FlashInfer's MLA decode API on CPU tensors (the float64 reference path): signatures, conventions,
buffers, split inputs, variable-length queries, cyclic DCP, and every refusal."""

import ast
import importlib.util
import inspect
import math
from pathlib import Path

import pytest
import torch
from oracle import assert_rounded_from, naive_decode

import mla_backend
from mla_backend import batch_mla_paged_attention, mla_decode
from mla_backend.inputs import make_paged_problem

LN2 = math.log(2.0)
# FlashInfer 0.7.2's positional order (the newest release) and main's keyword-only batch_mla_paged_attention.
TRTLLM_PARAMETERS = (
    "query kv_cache workspace_buffer qk_nope_head_dim kv_lora_rank qk_rope_head_dim block_tables seq_lens "
    "max_seq_len sparse_mla_top_k out bmm1_scale bmm2_scale sinks skip_softmax_threshold_scale_factor enable_pdl "
    "backend is_var_seq uses_shared_paged_kv_idx lse return_lse cute_dsl_impl kv_scale_format cum_seq_lens_q "
    "max_q_len multi_ctas_kv_counter_buffer sparse_mla_top_k_lens enable_dcp cp_world cp_rank "
    "causal_seqlens_kv_global use_fp16_softmax return_lse_base"
).split()
BATCH_MLA_PARAMETERS = ["query", "q_nope", "q_pe", "kv_cache", "ckv_cache", "kpe_cache"] + [
    p for p in TRTLLM_PARAMETERS if p not in ("query", "kv_cache")
]
XQA_PARAMETERS = TRTLLM_PARAMETERS[:9] + ["out", "bmm1_scale", "bmm2_scale", "sinks", "enable_pdl"]


def installed_flashinfer_signatures() -> dict[str, list[tuple[str, object]]]:
    """(name, default) of each parameter of the installed FlashInfer's MLA decode functions, read from
    its source (importing flashinfer.mla needs its CUDA-side dependencies)."""
    spec = importlib.util.find_spec("flashinfer")
    assert spec is not None and spec.origin, "flashinfer is installed with vLLM"
    found = {}
    for path in (Path(spec.origin).parent / "mla").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in PUBLIC_NAMES:
                args = node.args
                assert not args.kwonlyargs and not args.posonlyargs, node.name
                defaults = [NO_DEFAULT] * (len(args.args) - len(args.defaults)) + [
                    ast.literal_eval(d) for d in args.defaults
                ]
                found[node.name] = [(a.arg, d) for a, d in zip(args.args, defaults)]
    return found


NO_DEFAULT = object()
PUBLIC_NAMES = ("trtllm_batch_decode_with_kv_cache_mla", "xqa_batch_decode_with_kv_cache_mla")


@pytest.mark.vllm
def test_signatures_match_the_installed_flashinfer():
    """Every parameter of the installed FlashInfer's functions is ours too: same position, default."""
    theirs = installed_flashinfer_signatures()
    assert set(theirs) == set(PUBLIC_NAMES)
    for name, params in theirs.items():
        ours = list(inspect.signature(getattr(mla_backend, name)).parameters.values())
        for position, (param, default) in enumerate(params):
            mine = ours[position]
            assert mine.name == param and mine.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD, (name, param)
            assert mine.default == (inspect.Parameter.empty if default is NO_DEFAULT else default), (name, param)


def test_signatures_match_flashinfer_newest():
    def names(fn, kinds):
        return [n for n, p in inspect.signature(fn).parameters.items() if p.kind in kinds]

    positional = (inspect.Parameter.POSITIONAL_OR_KEYWORD,)
    assert names(mla_backend.trtllm_batch_decode_with_kv_cache_mla, positional) == TRTLLM_PARAMETERS
    assert names(mla_backend.xqa_batch_decode_with_kv_cache_mla, positional)[:14] == XQA_PARAMETERS
    keyword_only = names(batch_mla_paged_attention, (inspect.Parameter.KEYWORD_ONLY,))
    assert keyword_only[: len(BATCH_MLA_PARAMETERS)] == BATCH_MLA_PARAMETERS
    assert names(batch_mla_paged_attention, positional) == []


def documented_call(problem, **overrides):
    """batch_mla_paged_attention called keyword by keyword as FlashInfer documents it, defaults spelled out."""
    args = dict(
        query=problem.query, q_nope=None, q_pe=None, kv_cache=problem.kv_cache, ckv_cache=None, kpe_cache=None,
        workspace_buffer=torch.empty(1024, dtype=torch.uint8), qk_nope_head_dim=128, kv_lora_rank=512,
        qk_rope_head_dim=64, block_tables=problem.block_tables, seq_lens=problem.seq_lens,
        max_seq_len=problem.max_seq_len, sparse_mla_top_k=0, out=None, bmm1_scale=0.06, bmm2_scale=1.5, sinks=None,
        skip_softmax_threshold_scale_factor=None, enable_pdl=None, backend="auto", is_var_seq=True,
        uses_shared_paged_kv_idx=True, lse=None, return_lse=True, cute_dsl_impl="auto", kv_scale_format="auto",
        cum_seq_lens_q=None, max_q_len=None, multi_ctas_kv_counter_buffer=None, sparse_mla_top_k_lens=None,
        enable_dcp=False, cp_world=1, cp_rank=0, causal_seqlens_kv_global=None,
    )  # fmt: skip
    args.update(overrides)
    return batch_mla_paged_attention(**args)


@pytest.fixture(params=[torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def problem(request):
    return make_paged_problem([37, 0, 64, 1], q_len=2, heads=4, page_size=16, dtype=request.param, seed=4)


def oracle(problem, bmm1=0.06, bmm2=1.5):
    return naive_decode(problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens, bmm1, bmm2)


def test_documented_call_matches_the_oracle_with_a_base_2_lse(problem):
    out, lse = documented_call(problem)
    want_out, want_lse = oracle(problem)
    assert_rounded_from(out, (lse.double() * LN2).float(), want_out, want_lse)
    assert torch.isneginf(lse[1]).all() and torch.isneginf(lse[3, 0]).all()  # no key: -inf in any base


def test_aliases_called_keyword_by_keyword_as_flashinfer_documents_them(problem):
    """trtllm_batch_decode_with_kv_cache_mla and xqa_batch_decode_with_kv_cache_mla with every keyword of
    FlashInfer's signatures spelled out: the same result as batch_mla_paged_attention."""
    want = documented_call(problem)
    common = dict(
        query=problem.query, kv_cache=problem.kv_cache, workspace_buffer=torch.empty(1024, dtype=torch.uint8),
        qk_nope_head_dim=128, kv_lora_rank=512, qk_rope_head_dim=64, block_tables=problem.block_tables,
        seq_lens=problem.seq_lens, max_seq_len=problem.max_seq_len, out=None, bmm1_scale=0.06, bmm2_scale=1.5,
        sinks=None, enable_pdl=None,
    )  # fmt: skip
    trtllm = mla_backend.trtllm_batch_decode_with_kv_cache_mla(
        **common, sparse_mla_top_k=0, skip_softmax_threshold_scale_factor=None, backend="auto", is_var_seq=True,
        uses_shared_paged_kv_idx=True, lse=None, return_lse=True, cute_dsl_impl="auto", kv_scale_format="auto",
        cum_seq_lens_q=None, max_q_len=None, multi_ctas_kv_counter_buffer=None, sparse_mla_top_k_lens=None,
        enable_dcp=False, cp_world=1, cp_rank=0, causal_seqlens_kv_global=None, use_fp16_softmax=None,
        return_lse_base=None,
    )  # fmt: skip
    assert torch.equal(trtllm[0], want[0]) and torch.equal(trtllm[1], want[1])
    xqa = mla_backend.xqa_batch_decode_with_kv_cache_mla(**common)
    assert torch.equal(xqa, want[0])


@pytest.mark.parametrize(
    "overrides, natural",
    [
        (dict(return_lse_base="basee"), True),
        (dict(return_lse_base="base2"), False),
        (dict(return_lse_base=None), False),
    ],
)
def test_lse_base(problem, overrides, natural):
    _, lse = documented_call(problem, **overrides)
    _, want_lse = oracle(problem)
    assert_rounded_from(oracle(problem)[0], lse if natural else (lse.double() * LN2).float(), *oracle(problem))
    assert want_lse.shape == lse.shape
    _, native = mla_decode(
        problem.query, problem.kv_cache, None, problem.block_tables, problem.seq_lens, problem.max_seq_len,
        bmm1_scale=0.06, bmm2_scale=1.5, return_lse=True,
    )  # fmt: skip
    assert_rounded_from(oracle(problem)[0], native, *oracle(problem))


@pytest.mark.parametrize("shape", ["flat", "per_token"])
def test_lse_and_out_buffers_are_filled_and_returned(problem, shape):
    rows = (4 * 2, 4) if shape == "flat" else (4, 2, 4)
    lse = torch.full(rows, float("nan"))
    out = torch.full((4, 2, 4, 512), float("nan"), dtype=torch.bfloat16)
    got_out, got_lse = documented_call(problem, lse=lse, out=out, return_lse_base="basee")
    assert got_out is out and got_lse is lse
    assert_rounded_from(out, lse, *oracle(problem))
    lse.fill_(float("nan"))
    only_out = documented_call(problem, lse=lse, return_lse=False, return_lse_base="basee")
    assert isinstance(only_out, torch.Tensor)
    assert_rounded_from(only_out, lse, *oracle(problem))
    with pytest.raises(TypeError, match="lse must be float32"):
        documented_call(problem, lse=torch.empty(rows, dtype=torch.float64))
    with pytest.raises(ValueError, match="lse must have shape"):
        documented_call(problem, lse=torch.empty(3, 4))


def test_split_inputs_equal_the_packed_ones(problem):
    q, kv = problem.query, problem.kv_cache
    want = documented_call(problem)
    forms = [
        dict(q_nope=q[..., :512], q_pe=q[..., 512:], ckv_cache=kv[..., :512], kpe_cache=kv[..., 512:]),
        dict(
            q_nope=q[..., :512].clone(), q_pe=q[..., 512:].clone(),
            ckv_cache=kv[..., :512].clone().unsqueeze(1), kpe_cache=kv[..., 512:].clone().unsqueeze(1),
        ),
    ]  # fmt: skip
    for form in forms:
        got = documented_call(problem, query=None, kv_cache=None, **form)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    both = documented_call(problem, q_nope=q[..., :512].clone(), q_pe=q[..., 512:].clone())
    assert torch.equal(both[0], want[0])
    with pytest.raises(ValueError, match="q_nope and q_pe must be given together"):
        documented_call(problem, q_nope=q[..., :512])
    with pytest.raises(ValueError, match="give kv_cache, or both ckv_cache and kpe_cache"):
        documented_call(problem, kv_cache=None)
    positional = mla_backend.trtllm_batch_decode_with_kv_cache_mla(
        (q[..., :512], q[..., 512:]), (kv[..., :512].clone(), kv[..., 512:].clone()), None, 128, 512, 64,
        problem.block_tables, problem.seq_lens, problem.max_seq_len, bmm1_scale=0.06, bmm2_scale=1.5, return_lse=True,
    )  # fmt: skip
    assert torch.equal(positional[0], want[0]) and torch.equal(positional[1], want[1])


def test_variable_length_queries_equal_each_request_alone():
    """cum_seq_lens_q: each request's rows are its own fixed-q_len decode (natural-log LSE, FlashInfer's
    default on this path), with and without max_q_len."""
    q_lens, seq_lens = [1, 3, 8, 2], [40, 3, 70, 17]
    parts = [make_paged_problem([n], q, 4, 16, seed=i) for i, (q, n) in enumerate(zip(q_lens, seq_lens))]
    offsets = [0]
    for p in parts[:-1]:
        offsets.append(offsets[-1] + p.kv_cache.shape[0])
    width = max(p.block_tables.shape[1] for p in parts)
    table = torch.full((4, width), -1, dtype=torch.int32)
    for i, p in enumerate(parts):
        table[i, : p.block_tables.shape[1]] = torch.where(p.block_tables[0] >= 0, p.block_tables[0] + offsets[i], -1)
    cum = torch.tensor([0, 1, 4, 12, 14], dtype=torch.int32)
    query = torch.cat([p.query[0] for p in parts])
    common = dict(
        query=query, kv_cache=torch.cat([p.kv_cache for p in parts]), block_tables=table,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), max_seq_len=70, cum_seq_lens_q=cum,
    )  # fmt: skip
    for max_q_len in (None, 8):
        out, lse = documented_call(parts[0], **common, max_q_len=max_q_len)
        assert out.shape == (14, 4, 512) and lse.shape == (14, 4)
        for i, p in enumerate(parts):
            rows = slice(int(cum[i]), int(cum[i + 1]))
            assert_rounded_from(out[rows], lse[rows], *oracle(p))
    for bad, match in (
        (dict(max_q_len=9), "max_q_len must be an int in 1..8"),
        (dict(cum_seq_lens_q=torch.tensor([1, 1, 4, 12, 14], dtype=torch.int32)), "must start at 0"),
        (dict(cum_seq_lens_q=torch.tensor([0, 4, 1, 12, 14], dtype=torch.int32)), "never decrease"),
        (dict(cum_seq_lens_q=torch.tensor([0, 1, 4, 12, 13], dtype=torch.int32)), "end at query.size"),
    ):
        with pytest.raises(ValueError, match=match):
            documented_call(parts[0], **{**common, **bad})
    with pytest.raises(ValueError, match="max_q_len is only supported when cum_seq_lens_q"):
        documented_call(parts[0], max_q_len=2)


def rank_cache(global_kv: list[torch.Tensor], world: int, rank: int, page: int = 16):
    """Rank ``rank``'s paged cache of cyclic DCP: global tokens rank, rank + world, ... of each request."""
    local = [kv[rank::world] for kv in global_kv]
    pages = [-(-len(t) // page) for t in local]
    cache = torch.zeros(sum(pages) + 1, page, 576, dtype=global_kv[0].dtype)
    table = torch.full((len(local), max(max(pages), 1)), -1, dtype=torch.int32)
    cursor = 0
    for b, t in enumerate(local):
        for i in range(pages[b]):
            cache[cursor, : len(t[i * page : (i + 1) * page])] = t[i * page : (i + 1) * page]
            table[b, i] = cursor
            cursor += 1
    return cache, table, torch.tensor([len(t) for t in local], dtype=torch.int32)


@pytest.mark.parametrize("q_len", [1, 3])
def test_cyclic_dcp_ranks_merge_to_the_whole_context(q_len):
    world, heads, bmm1 = 3, 4, 0.06
    lengths = [50, 7, 2]
    gen = torch.Generator().manual_seed(q_len)
    global_kv = [torch.randn(n, 576, generator=gen).to(torch.bfloat16) for n in lengths]
    query = torch.randn(len(lengths), q_len, heads, 576, generator=gen).to(torch.bfloat16)
    bound = torch.tensor(lengths, dtype=torch.int32)
    outs, lses = [], []
    for rank in range(world):
        cache, table, local = rank_cache(global_kv, world, rank)
        out, lse = documented_call(
            make_paged_problem([1], 1, 1, 16), query=query, kv_cache=cache, block_tables=table, seq_lens=local,
            max_seq_len=int(local.max()), bmm1_scale=bmm1, bmm2_scale=1.0, enable_dcp=True, cp_world=world,
            cp_rank=rank, causal_seqlens_kv_global=bound,
        )  # fmt: skip
        for b, n in enumerate(lengths):  # this rank alone: global positions it holds, causal in global terms
            for t in range(q_len):
                visible = [g for g in range(rank, n, world) if g < n - (q_len - 1 - t)]
                keys = global_kv[b][visible].double()
                if not visible:
                    assert torch.isneginf(lse[b, t]).all() and not out[b, t].any()
                    continue
                logits = query[b, t].double() @ keys.T * bmm1
                want = torch.softmax(logits, -1) @ keys[:, :512]
                torch.testing.assert_close(out[b, t].double(), want, rtol=2**-8, atol=1e-6)
                torch.testing.assert_close(lse[b, t].double(), torch.logsumexp(logits, -1), rtol=2**-22, atol=1e-6)
        outs.append(out.double())
        lses.append(lse.double())
    merged_lse = torch.logsumexp(torch.stack(lses), 0)
    weights = torch.exp(torch.stack(lses) - merged_lse).nan_to_num(0.0)
    merged = (weights[..., None] * torch.stack(outs)).sum(0)
    for b, n in enumerate(lengths):  # the whole context on one GPU: token t sees global positions < n - (q_len-1-t)
        for t in range(q_len):
            keys = global_kv[b][: n - (q_len - 1 - t)].double()
            if len(keys) == 0:
                assert torch.isneginf(merged_lse[b, t]).all() and not merged[b, t].any()
                continue
            logits = query[b, t].double() @ keys.T * bmm1
            want = torch.softmax(logits, -1) @ keys[:, :512]
            assert ((merged[b, t] - want).norm(dim=-1) / want.norm(dim=-1)).max() < 2**-8  # bf16 rank outputs
            torch.testing.assert_close(merged_lse[b, t], torch.logsumexp(logits, -1), rtol=1e-6, atol=1e-6)


DCP_REFUSALS = {
    "no enable_dcp": (dict(cp_world=2), ValueError, "DCP arguments require enable_dcp=True"),
    "no lse": (dict(enable_dcp=True, cp_world=2, return_lse=False), ValueError, "requires return_lse=True"),
    "rank": (dict(enable_dcp=True, cp_world=2, cp_rank=2), ValueError, "0 <= cp_rank < cp_world"),
    "bound dtype": (dict(enable_dcp=True, cp_world=2, causal_seqlens_kv_global="int64"), ValueError, "int32"),
    "bound missing": (dict(enable_dcp=True, cp_world=2), TypeError, "causal_seqlens_kv_global must be a torch"),
    "trtllm-gen": (
        dict(enable_dcp=True, cp_world=2, backend="trtllm-gen", causal_seqlens_kv_global="bound"),
        ValueError,
        "backend='trtllm-gen'",
    ),
    "varlen": (dict(enable_dcp=True, cp_world=2, cum_seq_lens_q="cum"), ValueError, "does not support cum_seq_lens_q"),
}
REFUSALS = {
    # sparse_mla_top_k > 0 takes the sparse path (tests/test_sparse_cpu.py), which checks its own arguments.
    "sparse bmm2": (dict(sparse_mla_top_k=64), ValueError, "bmm2_scale must be 1.0"),
    "sparse lists": (dict(sparse_mla_top_k=64, bmm2_scale=1.0), ValueError, "block_tables must be the index lists"),
    "sparse top_k": (dict(sparse_mla_top_k=-2), ValueError, "sparse_mla_top_k=-2"),
    "sparse lens": (dict(sparse_mla_top_k_lens=torch.ones(8, dtype=torch.int32)), ValueError, "sparse_mla_top_k_lens"),
    "sinks": (dict(sinks=[torch.zeros(4)]), ValueError, "sinks="),
    "skip softmax": (
        dict(skip_softmax_threshold_scale_factor=0.5),
        ValueError,
        "skip_softmax_threshold_scale_factor=0.5",
    ),
    "3-D page table": (dict(uses_shared_paged_kv_idx=False), ValueError, "uses_shared_paged_kv_idx=False"),
    "cute-dsl": (dict(backend="cute-dsl"), ValueError, "backend='cute-dsl'"),
    "fa3": (dict(backend="fa3"), ValueError, "backend='fa3'"),
    "cutlass": (dict(backend="cutlass"), ValueError, "backend='cutlass'"),
    "sparse backend": (dict(backend="sparse"), ValueError, "backend='sparse'"),
    "cute_dsl_impl": (dict(cute_dsl_impl="bogus"), ValueError, "cute_dsl_impl='bogus'"),
    "kv_scale_format": (dict(kv_scale_format="bogus"), ValueError, "kv_scale_format='bogus'"),
    "fp16 softmax": (dict(use_fp16_softmax=True), ValueError, "use_fp16_softmax=True"),
    "lse base": (dict(return_lse_base="base10"), ValueError, "return_lse_base='base10'"),
    "is_var_seq": (dict(is_var_seq="yes"), TypeError, "is_var_seq must be a bool"),
    "counter type": (dict(multi_ctas_kv_counter_buffer=[0]), TypeError, "multi_ctas_kv_counter_buffer"),
    "kv_lora_rank": (dict(kv_lora_rank=256), ValueError, "kv_lora_rank must be 512"),
    "rope": (dict(qk_rope_head_dim=32), ValueError, "qk_rope_head_dim must be 64"),
    **DCP_REFUSALS,
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_unserved_values_are_refused_by_keyword_before_anything_runs(problem, case, monkeypatch):
    change, exc, match = REFUSALS[case]
    change = dict(change)
    if change.get("causal_seqlens_kv_global") == "int64":
        change["causal_seqlens_kv_global"] = torch.zeros(4, dtype=torch.int64)
    if change.get("causal_seqlens_kv_global") == "bound":
        change["causal_seqlens_kv_global"] = torch.full((4,), 60, dtype=torch.int32)
    if change.get("cum_seq_lens_q") == "cum":
        change["cum_seq_lens_q"] = torch.tensor([0, 2, 4, 6, 8], dtype=torch.int32)
    monkeypatch.setattr(mla_backend.flashinfer_api, "mla_decode", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(exc, match=match):
        documented_call(problem, **change)


def test_hints_without_effect_change_nothing(problem):
    as_float32 = float(torch.tensor([0.06]))  # the device-tensor scale below holds 0.06 rounded to float32
    want = documented_call(problem, bmm1_scale=as_float32)
    for change in (
        dict(is_var_seq=False),
        dict(cute_dsl_impl="modular"),
        dict(kv_scale_format="arbitrary_fp32"),
        dict(multi_ctas_kv_counter_buffer=torch.zeros(64, dtype=torch.uint8)),
        dict(enable_pdl=True),
        dict(use_fp16_softmax=False),
        dict(backend="xqa"),
        dict(bmm1_scale=torch.tensor([0.06]), bmm2_scale=torch.tensor([1.5])),
    ):
        got = documented_call(problem, **{"bmm1_scale": as_float32, **change})
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), change
