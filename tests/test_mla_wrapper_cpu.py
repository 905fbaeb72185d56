"""BatchMLAPagedAttentionWrapper on CPU tensors (the float64 reference runs): FlashInfer's signatures,
its documentation example, results against a per-request float64 judge, and every refusal."""

import inspect
import math

import pytest
import torch
from wrapper_cases import assert_matches, documentation_example, make_batch, reference

import mla_backend
from mla_backend import BatchMLAPagedAttentionWrapper
from mla_backend.reference import ROW_ERROR_TOLERANCE

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


def workspace() -> torch.Tensor:
    return torch.empty(1024, dtype=torch.int8)


def planned(batch, causal=True, **init):
    wrapper = BatchMLAPagedAttentionWrapper(workspace(), **init)
    wrapper.plan(*batch.plan_args(causal))
    return wrapper


# --- FlashInfer's signatures ---------------------------------------------------------------------


def parameters(function) -> list[tuple]:
    """(name, kind, default) of each parameter; inspect.signature sees through FlashInfer's decorator."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


# FlashInfer main's run has the keyword-only ckv_scale_arr between ckv_scale and kpe_scale; an
# installed release without it (0.6.14) is compared with it left out.
NEWER_THAN_RELEASE = {"run": ("ckv_scale_arr", inspect.Parameter.KEYWORD_ONLY, None)}
# What FlashInfer 0.7 (vLLM 0.33's) added and this class does not take: plan's metadata-driven form
# (where every classic argument defaults to None) and keyword-only arguments of plan and run. The
# classic calls keep their names, order, kinds and defaults.
FLASHINFER_07_ADDITIONS = {
    "plan": {
        "metadata", "cum_seq_lens_q", "block_tables", "seq_lens", "max_q_len", "query_layout",
        "kv_cache_layout", "lse_mode", "output_dtype", "output_scale", "scale_mode", "skip_softmax",
        "enable_pdl", "use_sinks",
    },
    "run": {"query", "kv_cache", "sinks", "skip_softmax_threshold_scale_factor", "bmm1_scale", "bmm2_scale"},
}  # fmt: skip


@pytest.mark.parametrize("method", ["__init__", "plan", "run"])
def test_signature_is_flashinfers(method):
    flashinfer_mla = pytest.importorskip("flashinfer.mla")
    added = FLASHINFER_07_ADDITIONS.get(method, set())
    theirs = [p for p in parameters(getattr(flashinfer_mla.BatchMLAPagedAttentionWrapper, method)) if p[0] not in added]
    ours = parameters(getattr(BatchMLAPagedAttentionWrapper, method))
    newer = NEWER_THAN_RELEASE.get(method)
    if newer is not None and newer not in theirs:
        names = [p[0] for p in ours]
        assert names[names.index(newer[0]) - 1 : names.index(newer[0]) + 2] == ["ckv_scale", *newer[:1], "kpe_scale"]
        ours.remove(newer)
    assert [p[:2] for p in ours] == [p[:2] for p in theirs]
    for (name, _, default), (_, _, their_default) in zip(ours, theirs):
        required = default is inspect.Parameter.empty
        # A classic argument FlashInfer 0.7 defaults to None (its metadata form) is required here.
        assert default == their_default or (required and their_default is None), name


def test_exported_from_the_package():
    assert "BatchMLAPagedAttentionWrapper" in mla_backend.__all__


# --- FlashInfer's documentation example, smaller, on CPU -----------------------------------------


def test_flashinfer_docstring_example():
    batch, o, sm_scale = documentation_example("cpu", num_local_heads=8, batch_size=6, kv_len=37, rope=torch.zeros)
    assert_matches(o, reference(batch, causal=False, sm_scale=sm_scale)[0])


# --- results against the float64 judge -----------------------------------------------------------

KV_LENS = [0, 7, 45]  # an empty request, one shorter than the longest queries, several pages
QUERY_LENGTHS = {
    "decode": [1, 1, 1],
    "mtp4": [4, 4, 4],
    "uneven": [3, 1, 6],
    "chunked11": [11, 2, 11],  # more than the kernels' 8: causal chunks
}


@pytest.mark.parametrize("page_size", [1, 16, 64, 3])
@pytest.mark.parametrize("queries", list(QUERY_LENGTHS))
@pytest.mark.parametrize("causal", [True, False])
def test_matches_reference(page_size, queries, causal):
    batch = make_batch(QUERY_LENGTHS[queries], KV_LENS, page_size, seed=page_size)
    wrapper = planned(batch, causal)
    out, lse = wrapper.run(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, return_lse=True)
    want, want_lse = reference(batch, causal)
    assert out.shape == batch.q_nope.shape and out.dtype == BF16
    assert_matches(out, want, lse, want_lse)


@pytest.mark.parametrize("queries", ["decode", "uneven", "chunked11"])
@pytest.mark.parametrize("base_e", [False, True])
def test_lse_bases_and_caller_buffers(queries, base_e):
    batch = make_batch(QUERY_LENGTHS[queries], KV_LENS, 16, heads=3)
    wrapper = planned(batch)
    out = torch.full(batch.q_nope.shape, math.nan, dtype=BF16)
    lse = torch.full(batch.q_nope.shape[:2], math.nan)
    got_out, got_lse = wrapper.run(
        batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, out=out, lse=lse, return_lse=True, return_lse_base_on_e=base_e
    )
    assert got_out is out and got_lse is lse
    want, want_lse = reference(batch, True)
    assert_matches(out, want, lse, want_lse, base_e=base_e)
    # A given lse is filled without return_lse (FlashInfer's run passes it to the kernel either way).
    lse.fill_(math.nan)
    assert wrapper.run(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, lse=lse) is not lse
    assert_matches(out, want, lse, want_lse)


def test_non_contiguous_out_buffer_is_filled():
    batch = make_batch([2, 2, 2], KV_LENS, 16, heads=2)
    wrapper = planned(batch)
    storage = torch.full((batch.q_nope.shape[0], 2 * batch.heads, 512), math.nan, dtype=BF16)
    out = storage[:, ::2]
    assert wrapper.run(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, out=out) is out
    assert_matches(out, reference(batch, True)[0])


def test_a_corrupted_result_is_caught():
    """The judge can fail: one output row nudged by 2 % of its norm, or one LSE, is caught."""
    batch = make_batch(QUERY_LENGTHS["uneven"], KV_LENS, 16)
    out, lse = planned(batch).run(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, return_lse=True)
    want, want_lse = reference(batch, True)
    assert_matches(out, want, lse, want_lse)
    bad = out.clone()
    bad[-1, 0, 0] += 0.02 * float(want[-1, 0].norm())
    with pytest.raises(AssertionError, match="row error"):
        assert_matches(bad, want, lse, want_lse)
    bad_lse = lse.clone()
    bad_lse[-1, 0] += 1e-3
    with pytest.raises(AssertionError):
        assert_matches(out, want, bad_lse, want_lse)
    with pytest.raises(AssertionError, match="-inf"):
        assert_matches(out, want, lse.nan_to_num(neginf=0.0), want_lse)


@pytest.mark.parametrize("queries", ["decode", "chunked11"])
def test_fp8_kv_with_flashinfers_scales(queries):
    """FP8 KV, ckv_scale != kpe_scale, bf16 query: judged against the float64 reference on the
    dequantised caches, with the query quantised as the contract says (one per-tensor e4m3 scale,
    amax / 448, over q_nope and q_pe * kpe_scale / ckv_scale)."""
    ckv_scale, kpe_scale = 0.05, 0.2
    batch = make_batch(QUERY_LENGTHS[queries], KV_LENS, 16, heads=2)
    batch.ckv, batch.kpe = batch.ckv.float().to(FP8), batch.kpe.float().to(FP8)
    wrapper = BatchMLAPagedAttentionWrapper(workspace())
    wrapper.plan(*batch.plan_args(True, kv_dtype=FP8))
    out = wrapper.run(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, ckv_scale=ckv_scale, kpe_scale=kpe_scale)

    ratio = kpe_scale / ckv_scale
    nope, rope = batch.q_nope.float(), batch.q_pe.float() * ratio
    q_scale = torch.maximum(nope.abs().max(), rope.abs().max()) / 448
    nope8, rope8 = (nope / q_scale).to(FP8), (rope / q_scale).to(FP8)
    query = torch.cat((nope8.double() * q_scale, rope8.double() * q_scale / ratio), -1)
    cache = torch.cat((batch.ckv.double() * ckv_scale, batch.kpe.double() * kpe_scale), -1)
    assert_matches(out, reference(batch, True, query=query, cache=cache)[0])
    # Against the unquantised bf16 query: e4m3's 3 mantissa bits (relative error <= 2^-4 an element,
    # averaging down over 576 dims) keep each row within the fp8 kernel tolerance.
    cache_only = reference(batch, True, cache=cache)[0]
    assert_matches(out, cache_only, tolerance=ROW_ERROR_TOLERANCE[FP8])


# --- CUDA-graph mode's fixed buffers (CPU tensors: the bookkeeping, not a capture) ----------------


def graph_wrapper(batch, ids=4096):
    def buffer(n):
        return torch.full((n,), -1, dtype=torch.int32)

    return BatchMLAPagedAttentionWrapper(
        workspace(),
        use_cuda_graph=True,
        qo_indptr=buffer(batch.qo_indptr.numel()),
        kv_indptr=buffer(batch.kv_indptr.numel()),
        kv_indices=buffer(ids),
        kv_len_arr=buffer(batch.kv_lens.numel()),
    )


@pytest.mark.parametrize("queries", ["decode", "uneven", "chunked11"])
@pytest.mark.parametrize("page_size", [16, 3])
def test_graph_mode_replans_at_fixed_addresses(queries, page_size):
    warmup = make_batch(QUERY_LENGTHS[queries], [0, 0, 0], page_size)
    batch = make_batch(QUERY_LENGTHS[queries], KV_LENS, page_size)
    wrapper = graph_wrapper(batch)
    wrapper.plan(*warmup.plan_args(True))
    first = wrapper._layout
    wrapper.plan(*batch.plan_args(True))
    second = wrapper._layout
    for name in ("kv_indices", "kv_indptr", "seq_lens", "grid_sources", "packed_slots"):
        a, b = getattr(first, name), getattr(second, name)
        assert (a is None and b is None) or a.data_ptr() == b.data_ptr(), name
    assert first.max_seq_len == second.max_seq_len
    out, lse = wrapper.run(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, return_lse=True)
    assert_matches(out, *reference(batch, True)[:1], lse, reference(batch, True)[1])
    assert torch.equal(wrapper._kv_len_arr_buf, batch.kv_lens)  # FlashInfer's buffers hold the plan


def test_graph_mode_refuses_a_new_layout():
    batch = make_batch([1, 1, 1], KV_LENS, 16)
    wrapper = graph_wrapper(batch)
    wrapper.plan(*batch.plan_args(True))
    other = make_batch([2, 2, 2], KV_LENS, 16)
    with pytest.raises(ValueError, match="differs from the first plan"):
        wrapper.plan(*other.plan_args(True))
    bigger = make_batch([1, 1, 1, 1], KV_LENS + [3], 16)
    with pytest.raises(ValueError, match="fixes the batch size"):
        wrapper.plan(*bigger.plan_args(True))


# --- refusals, each with its message -------------------------------------------------------------


def _batch():
    return make_batch([1, 2], [5, 20], 16)


INIT_REFUSALS = [
    (dict(backend="cutlass"), ValueError, "backend='cutlass'.*kv_len and page_table"),
    (dict(backend="trtllm-gen"), ValueError, r"backend='trtllm-gen'.*\('auto', 'fa2', 'fa3'\)"),
    (dict(use_cuda_graph=True), ValueError, "use_cuda_graph=True needs.*qo_indptr, kv_indptr, kv_indices, kv_len_arr"),
]


@pytest.mark.parametrize("kwargs, error, message", INIT_REFUSALS)
def test_init_refusals(kwargs, error, message):
    with pytest.raises(error, match=message):
        BatchMLAPagedAttentionWrapper(workspace(), **kwargs)


def _plan_with(**changes):
    batch = _batch()
    names = ["qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr", "num_heads", "head_dim_ckv", "head_dim_kpe",
             "page_size", "causal", "sm_scale", "q_data_type", "kv_data_type"]  # fmt: skip
    args = dict(zip(names, batch.plan_args(True)))
    args.update(changes)
    BatchMLAPagedAttentionWrapper(workspace()).plan(**args)


I32 = torch.int32
PLAN_REFUSALS = [
    (dict(use_profiler=True), ValueError, "use_profiler=True"),
    (dict(head_dim_ckv=256), ValueError, "head_dim_ckv must be 512"),
    (dict(head_dim_kpe=0), ValueError, "head_dim_kpe must be 64"),
    (dict(num_heads=0), ValueError, r"num_heads must be an int in 1..128"),
    (dict(num_heads=129), ValueError, r"num_heads must be an int in 1..128"),
    (dict(page_size=0), ValueError, "page_size must be a positive int"),
    (dict(causal=1), TypeError, "causal must be a bool"),
    (dict(sm_scale=math.inf), ValueError, "sm_scale must be a finite float"),
    (dict(q_data_type=torch.float16, kv_data_type=torch.float16), ValueError, r"\(q_data_type, kv_data_type\)"),
    (dict(q_data_type=FP8), ValueError, r"\(q_data_type, kv_data_type\).*one of"),
    (dict(qo_indptr=torch.tensor([1, 2, 3], dtype=I32)), ValueError, "qo_indptr must start at 0"),
    (dict(kv_indptr=torch.tensor([0, 2, 1], dtype=I32)), ValueError, "kv_indptr must start at 0 and never decrease"),
    (dict(kv_indptr=torch.tensor([0, 1, 9], dtype=I32)), ValueError, "kv_indptr.-1. = 9 exceeds kv_indices"),
    (dict(kv_len_arr=torch.tensor([5, 40], dtype=I32)), ValueError, r"kv_len_arr\[1\] = 40 must be in 0..32"),
    (dict(kv_len_arr=torch.tensor([5], dtype=I32)), ValueError, "kv_len_arr .batch_size."),
    (dict(kv_indices=torch.arange(3)), ValueError, "kv_indices must be a 1-D int32 tensor"),
    (dict(qo_indptr=torch.tensor([0, 0, 0], dtype=I32)), ValueError, "no query token"),
]


@pytest.mark.parametrize("changes, error, message", PLAN_REFUSALS)
def test_plan_refusals(changes, error, message):
    with pytest.raises(error, match=message):
        _plan_with(**changes)


def _run_with(kv_dtype=BF16, page_size=16, **changes):
    batch = make_batch([1, 2], [5, 20], page_size)
    if kv_dtype == FP8:
        batch.ckv, batch.kpe = batch.ckv.float().to(FP8), batch.kpe.float().to(FP8)
    wrapper = BatchMLAPagedAttentionWrapper(workspace())
    wrapper.plan(*batch.plan_args(True, kv_dtype=kv_dtype))
    args = dict(q_nope=batch.q_nope, q_pe=batch.q_pe, ckv_cache=batch.ckv, kpe_cache=batch.kpe)
    args.update(changes)
    return wrapper.run(**args)


def _tensor(*shape, dtype=BF16):
    return torch.zeros(shape, dtype=dtype)


RUN_REFUSALS = [
    (dict(o_scale=1.0), ValueError, "o_scale is only taken by FlashInfer's cutlass backend"),
    (dict(kv_len=_tensor(2, dtype=I32)), ValueError, "kv_len is only taken by FlashInfer's cutlass backend"),
    (dict(page_table=_tensor(2, 2, dtype=I32)), ValueError, "page_table is only taken"),
    (dict(profiler_buffer=_tensor(8)), ValueError, "profiler_buffer is not supported"),
    (dict(q_nope=_tensor(3, 2, 512, dtype=FP8)), ValueError, "q_nope.dtype=.* does not match the planned q_data_type"),
    (dict(kpe_cache=_tensor(5, 16, 64, dtype=FP8)), ValueError, "kpe_cache.dtype=.*planned kv_data_type"),
    (dict(q_nope=_tensor(3, 4, 512)), ValueError, r"q_nope must be .*\(3, 2, 512\)"),
    (dict(q_pe=_tensor(2, 2, 64)), ValueError, r"q_pe must be .*\(3, 2, 64\)"),
    (dict(ckv_cache=_tensor(5, 8, 512)), ValueError, r"ckv_cache must be .*\(5, 16, 512\)"),
    (dict(out=_tensor(3, 2, 512, dtype=torch.float32)), ValueError, "out must be torch.bfloat16"),
    (dict(lse=_tensor(3, 2, 1, dtype=torch.float32)), ValueError, r"lse must be torch.float32 \(3, 2\)"),
    (dict(ckv_scale=1.0), ValueError, "only valid when kv_data_type is FP8"),
    (dict(kv_dtype=FP8), ValueError, "Exactly one of ckv_scale or ckv_scale_arr"),
    (dict(kv_dtype=FP8, ckv_scale=1.0, ckv_scale_arr=_tensor(1)), ValueError, "Exactly one of ckv_scale"),
    (dict(kv_dtype=FP8, ckv_scale_arr=_tensor(1), kpe_scale=1.0), ValueError, "ckv_scale_arr .* is not supported"),
    (dict(kv_dtype=FP8, ckv_scale=1.0), ValueError, "kpe_scale is required"),
    (dict(kv_dtype=FP8, ckv_scale=-1.0, kpe_scale=1.0), ValueError, "ckv_scale must be a finite positive"),
    (dict(kv_dtype=FP8, ckv_scale=1.0, kpe_scale=math.nan), ValueError, "kpe_scale must be a finite positive"),
]


@pytest.mark.parametrize("changes, error, message", RUN_REFUSALS)
def test_run_refusals(changes, error, message):
    with pytest.raises(error, match=message):
        _run_with(**changes)


def test_run_before_plan_is_refused():
    batch = _batch()
    with pytest.raises(ValueError, match="before plan"):
        BatchMLAPagedAttentionWrapper(workspace()).run(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe)


def test_token_slots_need_a_viewable_cache():
    """Page size 3 runs through token slot ids over a [pages * 3, 1, dim] view; a cache whose pages
    are not back to back cannot be viewed so, and is refused by name."""
    batch = make_batch([1, 2], [5, 20], 3)
    padded = torch.zeros(batch.ckv.shape[0], 4, 512, dtype=BF16)
    padded[:, :3] = batch.ckv
    wrapper = planned(batch)
    with pytest.raises(ValueError, match="ckv_cache: a page size the kernels cannot read"):
        wrapper.run(batch.q_nope, batch.q_pe, padded[:, :3], batch.kpe)
