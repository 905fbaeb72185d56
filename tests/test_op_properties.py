"""Property tests of the op's input contract (issue #33, item 4).

Hypothesis draws decode calls around a served one and bends them (tests/op_calls.py): unsupported
head counts, page sizes and q_len, wrong dtypes, ranks, devices, strides and alignments
(transposed, broadcast, padded, misaligned views), block tables with ids out of range or junk past
each length, seq_lens of 0 or past what the table covers, scales and ``out``/``lse`` buffers of
every wrong kind, through all four entry points. ``violations`` (tests/op_contract.py) states the
contract on its own, from the documented limits (``batch_mla_paged_attention``'s docstring) and the
layout rules the kernels need, without reading mla_backend.checks; for every draw exactly one of:

(a) the contract holds: the op serves the call into NaN-poisoned ``out``/``lse`` buffers (and,
    where it allocates, into NaN-poisoned memory), returns the caller's buffers, leaves its inputs
    as they were, and matches tests/oracle.py's naive float64 decode on the (dequantised) inputs;
(b) it does not: the op raises ValueError or TypeError, naming in its message an argument the
    contract says is wrong, with the poisoned buffers and the inputs untouched.

Any other exception, a refusal of a served call or a served refusal fails the property. The CPU run
(the float64 reference path: page ids always checked) draws all its examples in CI (Hypothesis
profile "ci", tests/property_budget.py) and fewer in the README's test command; the GPU run drives
the kernels the same way, with page-id validation on so that both sides share one contract.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import pytest
import torch
import torch.utils.deterministic
from hypothesis import HealthCheck, event, given, settings
from op_calls import FAULTS, calls, rows_of
from op_contract import (
    HEAD_DIM,
    LATENT,
    LN2,
    MAX_HEADS,
    MAX_Q_LEN,
    NOPE_HEAD_DIMS,
    ROPE,
    SERVED_DTYPES,
    SERVED_PAGE_SIZES,
    Case,
    pages_view,
    violations,
)
from oracle import naive_decode
from property_budget import examples

from mla_backend import (
    MLABackendConfig,
    batch_mla_paged_attention,
    mla_decode,
    shapes,
    trtllm_batch_decode_with_kv_cache_mla,
    xqa_batch_decode_with_kv_cache_mla,
)
from mla_backend.reference import LSE_ABS_TOLERANCE, LSE_REL_TOLERANCE, ROW_ERROR_TOLERANCE
from mla_backend.targets import bundled_arch


def test_the_stated_contract_is_the_one_the_package_declares():
    """The limits in op_contract.py are written out from the docs; shapes.py must declare the same ones."""
    assert (shapes.DTYPES, shapes.PAGE_SIZES) == (SERVED_DTYPES, SERVED_PAGE_SIZES)
    assert (shapes.MAX_HEADS, shapes.MAX_Q_LEN, shapes.HEAD_DIM) == (MAX_HEADS, MAX_Q_LEN, HEAD_DIM)
    assert (shapes.KV_LORA_RANK, shapes.ROPE_DIM, shapes.QK_NOPE_HEAD_DIMS) == (LATENT, ROPE, NOPE_HEAD_DIMS)


# ---------------------------------------------------------------------------------------------------
# The call and the judgement


def call_op(case: Case, config: MLABackendConfig | None):
    common = dict(
        out=case.out,
        lse=case.lse,
        bmm1_scale=case.bmm1,
        bmm2_scale=case.bmm2,
        return_lse=case.return_lse,
        config=config,
    )
    if case.entry == "mla_decode":
        return mla_decode(
            case.query, case.kv_cache, case.workspace, case.block_tables, case.seq_lens, case.max_seq_len,
            qk_nope_head_dim=case.qk_nope_head_dim, **common,
        )  # fmt: skip
    dims = (case.qk_nope_head_dim, case.kv_lora_rank, case.qk_rope_head_dim)
    tables = (case.block_tables, case.seq_lens, case.max_seq_len)
    if case.entry in ("trtllm", "xqa"):
        op = trtllm_batch_decode_with_kv_cache_mla if case.entry == "trtllm" else xqa_batch_decode_with_kv_cache_mla
        return op(case.query, case.kv_cache, case.workspace, *dims, *tables, return_lse_base=case.lse_base, **common)
    forms: dict[str, Any] = {"query": case.query, "kv_cache": case.kv_cache}
    if case.split_keywords and isinstance(case.query, (tuple, list)) and len(case.query) == 2:
        forms = {"q_nope": case.query[0], "q_pe": case.query[1], "kv_cache": case.kv_cache}
    if case.split_keywords and isinstance(case.kv_cache, (tuple, list)) and len(case.kv_cache) == 2:
        forms = {k: v for k, v in forms.items() if k != "kv_cache"}
        forms.update(ckv_cache=case.kv_cache[0], kpe_cache=case.kv_cache[1])
    for name in case.dropped:
        forms.pop(name)
    return batch_mla_paged_attention(
        **forms, workspace_buffer=case.workspace, qk_nope_head_dim=dims[0], kv_lora_rank=dims[1],
        qk_rope_head_dim=dims[2], block_tables=tables[0], seq_lens=tables[1], max_seq_len=tables[2],
        return_lse_base=case.lse_base, **common,
    )  # fmt: skip


def input_tensors(case: Case) -> list[torch.Tensor]:
    """The call's tensors the op only reads (on the op's device)."""
    found = []
    for arg in (case.query, case.kv_cache, case.block_tables, case.seq_lens, case.bmm1, case.bmm2):
        for t in arg if isinstance(arg, (tuple, list)) else (arg,):
            if isinstance(t, torch.Tensor) and t.device == case.device and t.device.type != "meta":
                found.append(t)
    return found


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``'s elements (NaN-safe, any dtype), on the CPU."""
    flat = t.detach().cpu().reshape(-1).clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


def buffers(case: Case) -> list[torch.Tensor]:
    return [b for b in (case.out, case.lse) if isinstance(b, torch.Tensor) and b.device.type != "meta"]


def names_an_argument(message: str, names) -> bool:
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", message) for n in names)


def whole_inputs(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """The served call's query [B, q_len, H, 576] and cache [P, page, 576], float64 on the CPU."""
    q = case.query
    query = torch.cat([t.cpu().double() for t in q], dim=-1) if isinstance(q, (tuple, list)) else q.cpu().double()
    kv = case.kv_cache
    parts = kv if isinstance(kv, (tuple, list)) else (kv,)
    cache = torch.cat([pages_view(t).cpu().double() for t in parts], dim=-1)
    if cache.shape[0] == 0:  # no page at all (so none read): the oracle's reshape needs one
        cache = cache.new_zeros(1, *cache.shape[1:])
    return query, cache


def scale_value(scale) -> float:
    return float(scale.item()) if isinstance(scale, torch.Tensor) else float(scale)


def assert_served_correctly(case: Case, result, exact: bool) -> None:
    """``result`` is the op's answer to the served ``case``: the caller's buffers, filled, and the
    oracle's values, rounded once (``exact``: the float64 reference on the CPU) or within the kernels'
    tolerances."""
    batch, q_len, heads = rows_of(case)
    if case.return_lse:
        out, lse = result
    else:
        out, lse = result, case.lse
        assert isinstance(out, torch.Tensor), "return_lse=False returns out alone"
    if case.out is not None:
        assert out is case.out, "the caller's out is returned as passed"
    else:
        assert out.shape == (batch, q_len, heads, LATENT) and out.dtype == torch.bfloat16
        assert out.device == case.device
    if case.lse is not None:
        assert lse is case.lse, "the caller's lse is returned as passed"
    elif case.return_lse:
        assert lse.shape == (batch, q_len, heads) and lse.dtype == torch.float32 and lse.device == case.device
    query, cache = whole_inputs(case)
    want_out, want_lse = naive_decode(
        query, cache, case.block_tables.cpu(), case.seq_lens.cpu(), scale_value(case.bmm1), scale_value(case.bmm2)
    )
    got = out.detach().cpu().double().reshape(batch, q_len, heads, LATENT)
    assert not got.isnan().any(), "out has NaN: a row left unwritten (poisoned) or read from poisoned storage"
    empty = torch.isneginf(want_lse)
    assert not got[empty].any(), "a row that sees no key must be zero"
    if exact:  # the float64 reference rounded once to bf16
        off = (got - want_out).abs() > 2.0**-8 * want_out.abs() + 1e-12
        assert not off.any(), (
            f"{int(off.sum())} outputs beyond bf16 rounding of the oracle, first at {off.nonzero()[0].tolist()}"
        )
    else:  # the kernels: each row within the dtype's tolerance
        err = (got - want_out).norm(dim=-1)[~empty]
        scale = want_out.norm(dim=-1)[~empty].clamp_min(1e-30)
        worst = (err / scale).max().item() if err.numel() else 0.0
        assert worst <= ROW_ERROR_TOLERANCE[query_dtype(case)], f"row relative error {worst:.3e}"
    if lse is None:
        return
    natural = lse.detach().cpu().double().reshape(batch, q_len, heads)
    if case.entry != "mla_decode" and case.lse_base != "basee":  # FlashInfer's default here: base 2
        natural = natural * LN2
    assert not natural.isnan().any(), "lse has NaN: a row left unwritten"
    assert torch.equal(torch.isneginf(natural), empty), "LSE is -inf exactly where a row sees no key"
    if exact:
        off = (natural - want_lse).abs()[~empty] > 2.0**-20 * want_lse.abs()[~empty] + 1e-12
        assert not off.any(), f"{int(off.sum())} LSE values beyond fp32 rounding of the oracle"
    else:
        bound = LSE_ABS_TOLERANCE + LSE_REL_TOLERANCE * want_lse[~empty].abs()
        assert ((natural[~empty] - want_lse[~empty]).abs() <= bound).all(), "LSE beyond tolerance"


def query_dtype(case: Case) -> torch.dtype:
    return case.query[0].dtype if isinstance(case.query, (tuple, list)) else case.query.dtype


@pytest.fixture(scope="module")
def poisoned_allocations():
    """Deterministic mode for the module (switching it costs tens of milliseconds), under which
    ``poisoning`` makes every tensor torch allocates start as NaN (integers: all ones)."""
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.utils.deterministic.fill_uninitialized_memory = before[2]


@contextlib.contextmanager
def poisoning():
    """Within: what torch allocates (the op's own out and LSE among it) starts as NaN, so an output
    the op leaves unwritten shows (in deterministic mode: see ``poisoned_allocations``)."""
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = False


def check_call(case: Case, config: MLABackendConfig | None = None) -> bool:
    """The property: served and right, or refused by a clear error naming a wrong argument, nothing
    done. Returns whether the call was refused."""
    wrong = violations(case)
    event("refused" if wrong else "served")
    read_only = [(t, bits(t)) for t in input_tensors(case)]
    poison = [(b, bits(b)) for b in buffers(case)]
    try:
        with poisoning():
            result = call_op(case, config)
    except (ValueError, TypeError) as err:
        assert wrong, f"the op refused a call the contract serves: {type(err).__name__}: {err}"
        names = {n for _, ns in wrong for n in ns}
        assert names_an_argument(str(err), names), (
            f"the error does not name a wrong argument: {type(err).__name__}: {err}\nwrong: {[why for why, _ in wrong]}"
        )
        for buffer, before in poison:
            assert torch.equal(bits(buffer), before), "a refused call wrote into the caller's buffers"
    except Exception as err:
        raise AssertionError(
            f"the op raised {type(err).__name__}, not ValueError/TypeError: {err}\n"
            f"contract: {[why for why, _ in wrong] or 'served'}"
        ) from err
    else:
        assert not wrong, f"the op served a call the contract refuses: {[why for why, _ in wrong]}"
        assert_served_correctly(case, result, exact=case.device.type == "cpu")
    for t, before in read_only:
        assert torch.equal(bits(t), before), "the op changed one of its inputs"
    return bool(wrong)


PROPERTY_SETTINGS = dict(
    deadline=None,
    derandomize=True,  # the same examples on every run: CI is reproducible
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# Faults that may leave a call valid: the other served dtype for both, a 0-d scale, any workspace
# dtype, a strided [B * q_len, H] LSE, a 3-D out at q_len 1, a nope dim of 192, dims mla_decode does
# not take, a shorter max_seq_len no request reaches, a transposed table or strided seq_lens of one
# request.
SOMETIMES_SERVED = {
    ("both dtypes", "bf16"),
    ("both dtypes", "fp8 e4m3"),
    ("scale", "0-d fp32 tensor"),
    ("workspace", "int8"),
    ("lse", "transposed [B * q_len, H]"),
    ("out", "3-D"),
    ("dims", "qk_nope_head_dim"),
    ("dims", "kv_lora_rank"),
    ("dims", "qk_rope_head_dim"),
    ("max_seq_len", "one less"),
    ("max_seq_len", "zero"),
    ("block_tables layout", "transposed"),
    ("seq_lens layout", "every other element"),
}


@settings(max_examples=examples(600, quick=60), **PROPERTY_SETTINGS)
@given(case=calls(device="cpu", other="meta"))
def test_the_op_serves_exactly_the_contract_on_cpu(poisoned_allocations, case):
    check_call(case)


@pytest.mark.parametrize("fault", FAULTS, ids=[f"{name}: {variant}" for name, variant in FAULTS])
def test_each_fault_is_refused_by_name_or_served_right_on_cpu(poisoned_allocations, fault):
    """Every fault and variant, on a few otherwise served calls: the property holds, and the fault
    is refused at least once (so each check of the op is exercised) unless it may keep a call valid."""
    refused = []

    @settings(max_examples=examples(6, quick=3), **PROPERTY_SETTINGS)
    @given(case=calls(device="cpu", other="meta", modes=("one fault",), faults=(fault,)))
    def one_fault(case):
        refused.append(check_call(case))

    one_fault()
    assert any(refused) or fault in SOMETIMES_SERVED, f"{fault} never made a call the contract refuses"


def bundled_kernels_here() -> bool:
    return torch.cuda.is_available() and bundled_arch(torch.cuda.get_device_capability()) is not None


@pytest.mark.gpu
@pytest.mark.skipif(not bundled_kernels_here(), reason="needs a CUDA GPU the bundled kernels serve")
@settings(max_examples=120, **PROPERTY_SETTINGS)
@given(case=calls(device="cuda", other="cpu"))
def test_the_kernels_serve_exactly_the_contract(poisoned_allocations, case):
    """The same property on CUDA tensors: the bundled kernels (backend xqa, whatever the GPU), with
    page ids and seq_lens checked on the host (on GPU tensors only on request: it is a device sync),
    so that the kernels and the CPU path share one contract. "Everything on the other device" moves
    a call to the CPU, where the reference serves it."""
    check_call(case, MLABackendConfig.from_sources({"validate_page_ids": True, "backend": "xqa"}))
