"""Property tests of the op's input contract (issue #33, item 4).

Hypothesis draws decode calls around a served one and bends them: unsupported head counts, page
sizes and q_len, wrong dtypes, ranks, devices, strides and alignments (transposed, broadcast,
padded, misaligned views), block tables with ids out of range or junk past each length, seq_lens
of 0 or past what the table covers, scales and ``out``/``lse`` buffers of every wrong kind, through
all four entry points. ``violations`` states the contract on its own, from the documented limits
(``batch_mla_paged_attention``'s docstring) and the layout rules the kernels need, without reading
mla_backend.checks; for every draw exactly one of:

(a) the contract holds: the op serves the call into NaN-poisoned ``out``/``lse`` buffers (and,
    where it allocates, into NaN-poisoned memory), returns the caller's buffers, leaves its inputs
    as they were, and matches tests/oracle.py's naive float64 decode on the (dequantised) inputs;
(b) it does not: the op raises ValueError or TypeError, naming in its message an argument the
    contract says is wrong, with the poisoned buffers and the inputs untouched.

Any other exception, a refusal of a served call or a served refusal fails the property. The CPU run
(the float64 reference path: page ids always checked) runs in CI; the GPU run drives the kernels
the same way, with page-id validation on so that both sides share one contract.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.utils.deterministic
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from oracle import naive_decode

from mla_backend import (
    MLABackendConfig,
    batch_mla_paged_attention,
    mla_decode,
    shapes,
    trtllm_batch_decode_with_kv_cache_mla,
    xqa_batch_decode_with_kv_cache_mla,
)
from mla_backend.config import xqa_supported
from mla_backend.reference import LSE_ABS_TOLERANCE, LSE_REL_TOLERANCE, ROW_ERROR_TOLERANCE

# The served problems, as the docs state them ("bf16 or fp8 e4m3, 1-128 heads, q_len 1-8, pages of
# 16/32/64/128 tokens, scales as floats or one-element fp32 device tensors").
SERVED_DTYPES = (torch.bfloat16, torch.float8_e4m3fn)
SERVED_PAGE_SIZES = (16, 32, 64, 128)
MAX_HEADS = 128
MAX_Q_LEN = 8
LATENT, ROPE = 512, 64
HEAD_DIM = LATENT + ROPE
NOPE_HEAD_DIMS = (128, 192)  # the model's pre-absorption nope dim (DeepSeek-V3: 128; FlashInfer also takes 192)
CHUNK_BYTES = 16  # the kernels copy rows in 16-byte chunks: every row they step to starts 16-byte aligned

QUERY_NAMES = ("query", "q_nope", "q_pe")
KV_NAMES = ("kv_cache", "ckv_cache", "kpe_cache")
ENTRIES = ("mla_decode", "trtllm", "xqa", "batch_mla")
JUNK_PAGE_IDS = (-1, 1 << 30, -(1 << 31), (1 << 31) - 1)  # past a request's length: never read
LN2 = math.log(2.0)
NAN = float("nan")


def test_the_stated_contract_is_the_one_the_package_declares():
    """The limits below are written out from the docs; shapes.py must declare the same ones."""
    assert (shapes.DTYPES, shapes.PAGE_SIZES) == (SERVED_DTYPES, SERVED_PAGE_SIZES)
    assert (shapes.MAX_HEADS, shapes.MAX_Q_LEN, shapes.HEAD_DIM) == (MAX_HEADS, MAX_Q_LEN, HEAD_DIM)
    assert (shapes.KV_LORA_RANK, shapes.ROPE_DIM, shapes.QK_NOPE_HEAD_DIMS) == (LATENT, ROPE, NOPE_HEAD_DIMS)


# ---------------------------------------------------------------------------------------------------
# A drawn call


@dataclass
class Case:
    """One call of the op: its arguments as drawn, and how they were drawn (``steps``)."""

    entry: str
    device: torch.device  # where the query lives (the op's device)
    other: torch.device  # a device the op must refuse to mix in
    query: Any
    kv_cache: Any
    block_tables: Any
    seq_lens: Any
    max_seq_len: Any
    workspace: Any = None
    out: Any = None
    lse: Any = None
    bmm1: Any = 1.0
    bmm2: Any = 1.0
    qk_nope_head_dim: Any = 128
    kv_lora_rank: Any = LATENT
    qk_rope_head_dim: Any = ROPE
    return_lse: bool = False
    lse_base: str | None = None
    split_keywords: bool = False  # batch_mla_paged_attention(q_nope=, q_pe=, ckv_cache=, kpe_cache=)
    dropped: tuple[str, ...] = ()  # split keywords left out of such a call
    steps: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        args = {
            "entry": self.entry,
            "query": self.query,
            "kv_cache": self.kv_cache,
            "block_tables": self.block_tables,
            "seq_lens": self.seq_lens,
            "max_seq_len": self.max_seq_len,
            "workspace_buffer": self.workspace,
            "out": self.out,
            "lse": self.lse,
            "bmm1_scale": self.bmm1,
            "bmm2_scale": self.bmm2,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "return_lse": self.return_lse,
            "return_lse_base": self.lse_base,
            "split_keywords": self.split_keywords,
            "dropped": self.dropped,
        }
        lines = [f"    {k}={describe(v)}" for k, v in args.items()]
        return "Case(\n" + ",\n".join(lines) + f",\n    steps={self.steps},\n)"

    def _repr_pretty_(self, printer, cycle) -> None:  # how Hypothesis prints a falsifying example
        printer.text(repr(self))


def describe(x) -> str:
    """A tensor as dtype, shape, strides, start alignment, device (and values when small and integer)."""
    if isinstance(x, torch.Tensor):
        kind = str(x.dtype).removeprefix("torch.")
        text = f"{kind}{list(x.shape)} strides={x.stride()} start%16={x.data_ptr() % 16}"
        if x.device.type != "cpu":
            text += f" on {x.device}"
        if not x.dtype.is_floating_point and x.device.type != "meta" and x.numel() <= 48:
            text += f" = {x.tolist()}"
        return text
    if isinstance(x, (tuple, list)) and len(x) <= 4:
        inner = ", ".join(describe(t) for t in x)
        return f"({inner})" if isinstance(x, tuple) else f"[{inner}]"
    text = repr(x)
    return text if len(text) < 80 else text[:77] + "..."


# ---------------------------------------------------------------------------------------------------
# The contract, stated independently of mla_backend.checks


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def layout_faults(t: torch.Tensor, stepped_dims) -> list[str]:
    """Why the kernels cannot read ``t`` in place, a row of its last dim at a time in 16-byte chunks:
    the row must be contiguous and every row they step to (along each of ``stepped_dims`` that has
    more than one entry) must start 16-byte aligned."""
    size, faults = t.element_size(), []
    if t.stride(-1) != 1:
        faults.append(f"last-dim stride {t.stride(-1)}")
    odd = [d for d in stepped_dims if t.shape[d] > 1 and t.stride(d) * size % CHUNK_BYTES]
    if odd:
        faults.append(f"strides of dims {odd} not whole 16-byte chunks")
    if t.data_ptr() % CHUNK_BYTES:
        faults.append(f"start {t.data_ptr() % CHUNK_BYTES} bytes past a 16-byte boundary")
    return faults


def pages_view(t: torch.Tensor) -> torch.Tensor:
    return t.squeeze(1) if t.dim() == 4 else t


def violations(case: Case) -> list[tuple[str, tuple[str, ...]]]:
    """What is wrong with the call, each with the argument names an error message may use for it;
    [] for a call the op must serve."""
    found: list[tuple[str, tuple[str, ...]]] = []

    def flag(why: str, *names: str) -> None:
        found.append((why, names))

    # FlashInfer's keywords of its own
    if case.entry != "mla_decode":
        if case.kv_lora_rank != LATENT:
            flag(f"kv_lora_rank {case.kv_lora_rank!r} is not {LATENT}", "kv_lora_rank")
        if case.qk_rope_head_dim != ROPE:
            flag(f"qk_rope_head_dim {case.qk_rope_head_dim!r} is not {ROPE}", "qk_rope_head_dim")
    if case.dropped:
        flag(f"split keywords {case.dropped} left out", *case.dropped, *QUERY_NAMES, *KV_NAMES)
    if not (is_int(case.qk_nope_head_dim) and case.qk_nope_head_dim in NOPE_HEAD_DIMS):
        flag(f"qk_nope_head_dim {case.qk_nope_head_dim!r} not in {NOPE_HEAD_DIMS}", "qk_nope_head_dim")

    # query: [B, q_len, H, 576], or (q_nope [.., 512], q_pe [.., 64]) agreeing in B, q_len, H, dtype, device
    q, q_parts, rows, q_dtype, device = case.query, [], None, None, case.device
    if isinstance(q, (tuple, list)):
        if len(q) != 2 or not all(isinstance(t, torch.Tensor) for t in q):
            flag("query is a sequence but not a pair of tensors", *QUERY_NAMES)
        else:
            nope, pe = q
            q_dtype, device = nope.dtype, nope.device
            for name, t, dim in (("q_nope", nope, LATENT), ("q_pe", pe, ROPE)):
                if t.dim() != 4 or t.shape[-1] != dim:
                    flag(f"{name} is not [B, q_len, H, {dim}]", name)
                else:
                    q_parts.append((name, t))
            if len(q_parts) == 2:
                rows = tuple(nope.shape[:3])
                if tuple(pe.shape[:3]) != rows:
                    flag("q_nope and q_pe disagree in B, q_len, H", "q_nope", "q_pe")
            if pe.dtype != nope.dtype:
                flag("q_pe and q_nope dtypes differ", "q_pe", "q_nope")
            if pe.device != nope.device:
                flag("q_pe and q_nope devices differ", "q_pe", "q_nope")
    elif isinstance(q, torch.Tensor):
        q_dtype, device = q.dtype, q.device
        if q.dim() != 4 or q.shape[-1] != HEAD_DIM:
            flag(f"query is not [B, q_len, H, {HEAD_DIM}]", "query")
        else:
            q_parts.append(("query", q))
            rows = tuple(q.shape[:3])
    else:
        flag("query is not a tensor or a pair", *QUERY_NAMES)
    if q_dtype is not None and q_dtype not in SERVED_DTYPES:
        flag(f"query dtype {q_dtype} is not served", *QUERY_NAMES)
    if device.type not in ("cpu", "cuda"):  # CUDA runs the kernels, the CPU the reference: nothing else
        flag(f"query is on {device}, neither a CPU nor a CUDA device", *QUERY_NAMES)
    if rows is not None:
        batch, q_len, heads = rows
        if not 1 <= q_len <= MAX_Q_LEN:
            flag(f"q_len {q_len} outside 1..{MAX_Q_LEN}", *QUERY_NAMES, "q_len")
        if not 1 <= heads <= MAX_HEADS:
            flag(f"{heads} heads outside 1..{MAX_HEADS}", *QUERY_NAMES, "heads")
    for name, t in q_parts:  # read in place: contiguous rows, every row 16-byte aligned
        for fault in layout_faults(t, range(3)):
            flag(f"{name}: {fault}", name)

    # kv_cache: [P, page, 576] / [P, 1, page, 576], or (ckv [.., 512], kpe [.., 64]) of such caches
    kv, kv_parts, kv_dtype, pages = case.kv_cache, [], None, None
    if isinstance(kv, (tuple, list)):
        if len(kv) != 2 or not all(isinstance(t, torch.Tensor) for t in kv):
            flag("kv_cache is a sequence but not a pair of tensors", *KV_NAMES)
        else:
            kv_dtype = kv[0].dtype
            for name, t, dim in (("ckv_cache", kv[0], LATENT), ("kpe_cache", kv[1], ROPE)):
                if t.dim() not in (3, 4) or (t.dim() == 4 and t.shape[1] != 1) or t.shape[-1] != dim:
                    flag(f"{name} is not [P, page, {dim}] or [P, 1, page, {dim}]", name)
                else:
                    kv_parts.append((name, pages_view(t)))
            if len(kv_parts) == 2:
                pages = tuple(kv_parts[0][1].shape[:2])
                if tuple(kv_parts[1][1].shape[:2]) != pages:
                    flag("ckv_cache and kpe_cache disagree in pages, page size", "ckv_cache", "kpe_cache")
            if kv[1].dtype != kv[0].dtype:
                flag("kpe_cache and ckv_cache dtypes differ", "kpe_cache", "ckv_cache")
            if kv[1].device != kv[0].device:
                flag("kpe_cache and ckv_cache devices differ", "kpe_cache", "ckv_cache")
            if kv[0].device != device:
                flag("kv_cache is not on the query's device", *KV_NAMES)
    elif isinstance(kv, torch.Tensor):
        kv_dtype = kv.dtype
        if kv.dim() not in (3, 4) or (kv.dim() == 4 and kv.shape[1] != 1) or kv.shape[-1] != HEAD_DIM:
            flag(f"kv_cache is not [P, page, {HEAD_DIM}] or [P, 1, page, {HEAD_DIM}]", "kv_cache")
        else:
            kv_parts.append(("kv_cache", pages_view(kv)))
            pages = tuple(kv_parts[0][1].shape[:2])
        if kv.device != device:
            flag("kv_cache is not on the query's device", "kv_cache")
    else:
        flag("kv_cache is not a tensor or a pair", *KV_NAMES)
    if kv_dtype is not None and q_dtype is not None and kv_dtype != q_dtype:
        flag(f"kv_cache dtype {kv_dtype} differs from the query's {q_dtype}", *KV_NAMES)
    if pages is not None and pages[1] not in SERVED_PAGE_SIZES:
        flag(f"page size {pages[1]} not in {SERVED_PAGE_SIZES}", *KV_NAMES, "page size")
    for name, t in kv_parts:  # copied a token row at a time: contiguous rows, 16-byte aligned
        for fault in layout_faults(t, (0, 1)):
            flag(f"{name}: {fault}", name)

    # block_tables int32 [B, max_pages] (rows contiguous); seq_lens int32 [B] (contiguous); max_seq_len
    bt, sl, msl = case.block_tables, case.seq_lens, case.max_seq_len
    bt_ok = sl_ok = False
    if not isinstance(bt, torch.Tensor):
        flag("block_tables is not a tensor", "block_tables")
    else:
        bt_ok = bt.dim() == 2 and (rows is None or bt.shape[0] == rows[0]) and bt.device == device
        if bt.dtype != torch.int32:
            flag(f"block_tables dtype {bt.dtype} is not int32", "block_tables")
        if bt.dim() != 2 or (rows is not None and bt.shape[0] != rows[0]):
            flag(f"block_tables shape {tuple(bt.shape)} is not [B, max_pages]", "block_tables")
        elif bt.stride(1) != 1:
            flag("block_tables rows are not contiguous", "block_tables")
        if bt.device != device:
            flag("block_tables is not on the query's device", "block_tables")
    if not isinstance(sl, torch.Tensor):
        flag("seq_lens is not a tensor", "seq_lens")
    else:
        sl_ok = sl.dim() == 1 and (rows is None or sl.shape[0] == rows[0]) and sl.device == device
        if sl.dtype != torch.int32:
            flag(f"seq_lens dtype {sl.dtype} is not int32", "seq_lens")
        if not sl_ok and sl.device == device:
            flag(f"seq_lens shape {tuple(sl.shape)} is not [B]", "seq_lens")
        if not sl.is_contiguous():
            flag("seq_lens is not contiguous", "seq_lens")
        if sl.device != device:
            flag("seq_lens is not on the query's device", "seq_lens")
    if not is_int(msl) or msl < 0:
        flag(f"max_seq_len {msl!r} is not a non-negative int", "max_seq_len")
    elif bt_ok and pages is not None and msl > bt.shape[1] * pages[1]:
        flag("max_seq_len exceeds what block_tables addresses", "max_seq_len", "block_tables")
    # every request: 0 <= seq_len <= max_seq_len, and the pages it reads exist
    values_readable = bt_ok and sl_ok and bt.shape[0] == sl.shape[0] and device.type in ("cpu", "cuda")
    values_readable = values_readable and not bt.dtype.is_floating_point and not sl.dtype.is_floating_point
    if values_readable and pages is not None and pages[1] > 0 and is_int(msl):
        table = bt.tolist()
        for b, n in enumerate(sl.tolist()):
            if not 0 <= n <= msl:
                flag(f"seq_lens[{b}] = {n} outside 0..max_seq_len", "seq_lens", "max_seq_len")
            used = table[b][: -(-max(n, 0) // pages[1])]
            if any(not 0 <= page < pages[0] for page in used):
                flag(f"block_tables[{b}] names a page outside the cache", "block_tables")

    # buffers, workspace, scales
    if case.out is not None:
        out = case.out
        if not isinstance(out, torch.Tensor):
            flag("out is not a tensor", "out")
        else:
            if out.dtype != torch.bfloat16:
                flag(f"out dtype {out.dtype} is not bfloat16", "out")
            if rows is not None:
                allowed = [(*rows, LATENT)] + ([(rows[0], rows[2], LATENT)] if rows[1] == 1 else [])
                if tuple(out.shape) not in allowed:
                    flag(f"out shape {tuple(out.shape)} not in {allowed}", "out")
            if not out.is_contiguous():
                flag("out is not contiguous", "out")
            if out.device != device:
                flag("out is not on the query's device", "out")
    if case.lse is not None:
        lse = case.lse
        if not isinstance(lse, torch.Tensor):
            flag("lse is not a tensor", "lse")
        else:
            if lse.dtype != torch.float32:
                flag(f"lse dtype {lse.dtype} is not float32", "lse")
            if rows is not None and tuple(lse.shape) not in (rows, (rows[0] * rows[1], rows[2])):
                flag(f"lse shape {tuple(lse.shape)} is not [B, q_len, H] or [B * q_len, H]", "lse")
            if lse.device != device:
                flag("lse is not on the query's device", "lse")
    ws = case.workspace
    if ws is not None:
        if not isinstance(ws, torch.Tensor):
            flag("workspace_buffer is not a tensor", "workspace_buffer")
        else:
            if not ws.is_contiguous():
                flag("workspace_buffer is not contiguous", "workspace_buffer")
            if ws.device != device:
                flag("workspace_buffer is not on the query's device", "workspace_buffer")
    for name, scale in (("bmm1_scale", case.bmm1), ("bmm2_scale", case.bmm2)):
        if isinstance(scale, torch.Tensor):
            if scale.dtype != torch.float32 or scale.numel() != 1 or scale.device != device:
                flag(f"{name} is a tensor but not one float32 on the query's device", name)
        elif not isinstance(scale, (int, float)) or isinstance(scale, bool):
            flag(f"{name} {scale!r} is not a float", name)
    return found


# ---------------------------------------------------------------------------------------------------
# Drawing calls


def poisoned(shape, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.full(shape, NAN if dtype.is_floating_point else 0, dtype=dtype, device=device)


def laid_out(values: torch.Tensor, layout: str, pad: int, swap: tuple[int, int]) -> torch.Tensor:
    """``values`` in ``layout``; storage the view leaves out is NaN, so reading it shows in the result."""
    shape, dim, device = values.shape, values.shape[-1], values.device
    if layout == "contiguous":
        return values.clone()
    if layout == "padded_rows":  # rows dim + pad elements apart
        buf = poisoned((*shape[:-1], dim + pad), values.dtype, device)
        buf[..., :dim] = values
        return buf[..., :dim]
    if layout == "offset":  # starting pad elements into its buffer
        buf = poisoned((values.numel() + pad,), values.dtype, device)
        view = buf[pad:].view(shape)
        view.copy_(values)
        return view
    if layout == "swapped":  # two leading dims swapped in storage (heads-major query, page-major cache)
        return values.transpose(*swap).contiguous().transpose(*swap)
    if layout == "broadcast":  # one leading dim of stride 0 (every head, or every page, the same)
        index = [slice(None)] * values.dim()
        index[swap[1]] = slice(0, 1)
        return values[tuple(index)].expand(shape)
    if layout == "strided_last":  # elements two apart
        buf = poisoned((*shape[:-1], 2 * dim), values.dtype, device)
        buf[..., ::2] = values
        return buf[..., ::2]
    if layout == "last_swapped":  # the last dim strided by the size of the one before
        return values.transpose(-1, -2).contiguous().transpose(-1, -2)
    raise AssertionError(layout)


# Layouts the contract serves, with pads of whole 16-byte chunks; and three faults of each part's
# layout: a misaligned start, misaligned row strides (8 elements align bf16 rows, not fp8 ones), a
# last dim that is not contiguous.
SERVED_LAYOUTS = ("contiguous", "swapped", "broadcast", "padded_rows", "offset")
PADS = (1, 4, 8, 12)


def layouts(pick, dtype: torch.dtype, part: str):
    chunk = CHUNK_BYTES // dtype.itemsize
    odd_pads = [p for p in PADS if p % chunk]
    faults = {
        "start": st.tuples(st.just("offset"), st.sampled_from(odd_pads)),
        "strides": st.tuples(st.just("padded_rows"), st.sampled_from(odd_pads)),
        "last dim": st.tuples(st.sampled_from(["strided_last", "last_swapped"]), st.just(0)),
    }
    served = st.tuples(st.sampled_from(SERVED_LAYOUTS), st.sampled_from([0, chunk, 2 * chunk]))
    return pick(f"{part} layout", served, faults, one_in=5)


@st.composite
def mostly(draw, valid, invalid, one_in: int = 10):
    """``valid``, or ``invalid`` one draw in ``one_in`` (shrinking towards ``valid``)."""
    return draw(invalid if draw(st.integers(0, one_in - 1)) == one_in - 1 else valid)


def vllm_query_layout(query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The query as vLLM's MLA hands it over: q_nope a transposed [H, B*q_len, 512] bmm output, q_pe a
    slice of the [B*q_len, H, 192] projection (head stride 192); the rest of the projection is NaN."""
    batch, q_len, heads, _ = query.shape
    flat = query.reshape(batch * q_len, heads, HEAD_DIM)
    nope = flat[..., :LATENT].transpose(0, 1).contiguous().transpose(0, 1)
    projection = poisoned((batch * q_len, heads, 128 + ROPE), query.dtype, query.device)
    projection[..., 128:] = flat[..., LATENT:]
    return nope.view(batch, q_len, heads, LATENT), projection[..., 128:].view(batch, q_len, heads, ROPE)


@st.composite
def calls(draw, device: str, other: str, max_len: int = 40, modes=("served", "one fault", "wild"), faults=None) -> Case:
    """A decode call on ``device`` (``other``: a device not to mix in), drawn in one of three modes:
    "served" (supported sizes and layouts, buffers of the right kinds), "one fault" (such a call with
    one of ``faults``: an unsupported size or layout, or a bent argument; half the draws) and "wild"
    (each size and layout unsupported one draw in ten or five, and up to two bent arguments)."""
    device_, other_ = torch.device(device), torch.device(other)
    mode = draw(st.sampled_from(modes if len(modes) == 1 else ("one fault",) + modes))  # one fault: half
    fault = draw(st.sampled_from(faults or FAULTS)) if mode == "one fault" else None

    def pick(name, valid, variants: dict, one_in=10):
        """``name``'s draw: the fault's variant when it is the one fault, any variant one draw in
        ``one_in`` when wild, else ``valid``."""
        if mode == "wild":
            return mostly(valid, st.one_of(*variants.values()), one_in)
        return variants[fault[1]] if fault and fault[0] == name else valid

    def size(name, valid):
        return pick(name, valid, {variant: st.just(value) for variant, value in SIZE_FAULTS[name].items()})

    dtype = draw(st.sampled_from(SERVED_DTYPES))
    heads = draw(size("heads", st.sampled_from([1, 2, 3, 4, 8, 16, 128])))
    q_len = draw(size("q_len", st.integers(1, MAX_Q_LEN)))
    page = draw(size("page size", st.sampled_from(SERVED_PAGE_SIZES)))
    batch = draw(mostly(st.integers(1, 3), st.just(0), one_in=12))
    if heads * max(q_len, 1) > 64:  # keep the naive oracle quick
        batch, max_len = min(batch, 1), 8
    # lengths of 0 (no key: zero rows, LSE -inf) and below q_len (the first tokens see none) included
    length = mostly(st.one_of(st.integers(1, max_len), st.integers(max_len // 2, max_len)), st.just(0), one_in=6)
    seq_lens = draw(st.lists(length, min_size=batch, max_size=batch))

    # the paged cache and a shuffled block table with junk past each request's pages
    used = [-(-n // page) for n in seq_lens]
    width = max(used, default=0) + draw(st.integers(0, 2))
    num_pages = sum(used) + draw(st.integers(0, 2))
    order = draw(st.permutations(range(num_pages)))
    junk = draw(
        st.lists(st.sampled_from(JUNK_PAGE_IDS + (0, num_pages)), min_size=batch * width, max_size=batch * width)
    )
    table = [junk[b * width : (b + 1) * width] for b in range(batch)]
    cursor = 0
    for b, n in enumerate(used):
        table[b][:n] = order[cursor : cursor + n]
        cursor += n
    longest = max(seq_lens, default=0)
    max_seq_len = longest + draw(st.integers(0, width * page - longest))

    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q_values = torch.randn(batch, q_len, heads, HEAD_DIM, generator=gen).to(dtype).to(device_)
    kv_values = torch.randn(num_pages, page, HEAD_DIM, generator=gen).to(dtype).to(device_)

    steps = [f"mode: {mode}" + (f" ({fault[0]}: {fault[1]})" if fault else "")]
    split_fault = fault is not None and fault[0] == "split keywords"  # needs a pair passed by keyword
    query_form = draw(
        st.sampled_from(
            ["pair of views", "pair", "vllm"] if split_fault else ["whole", "pair of views", "pair", "vllm"]
        )
    )
    if query_form == "vllm":
        query = vllm_query_layout(q_values)
        steps.append("query: vLLM's split layout")
    elif query_form == "pair":
        (l1, p1), (l2, p2) = draw(layouts(pick, dtype, "query")), draw(layouts(pick, dtype, "query"))
        query = (
            laid_out(q_values[..., :LATENT].contiguous(), l1, p1, (1, 2)),
            laid_out(q_values[..., LATENT:].contiguous(), l2, p2, (1, 2)),
        )
        steps.append(f"query: pair, q_nope {l1} (pad {p1}), q_pe {l2} (pad {p2})")
    else:
        layout, pad = draw(layouts(pick, dtype, "query"))
        whole = laid_out(q_values, layout, pad, (1, 2))
        query = whole if query_form == "whole" else (whole[..., :LATENT], whole[..., LATENT:])
        steps.append(f"query: {query_form}, {layout} (pad {pad})")

    if isinstance(query, tuple) and draw(st.integers(0, 4)) == 0:
        query = list(query)  # a list is a pair too
        steps[-1] += ", as a list"

    kv_form = draw(st.sampled_from(["whole", "whole 4-D", "pair of views", "pair"]))
    four_d = draw(st.booleans())
    if kv_form == "pair":
        (l1, p1), (l2, p2) = draw(layouts(pick, dtype, "kv_cache")), draw(layouts(pick, dtype, "kv_cache"))
        kv_cache = (
            laid_out(kv_values[..., :LATENT].contiguous(), l1, p1, (0, 1)),
            laid_out(kv_values[..., LATENT:].contiguous(), l2, p2, (0, 1)),
        )
        if four_d:
            kv_cache = (kv_cache[0].unsqueeze(1), kv_cache[1])
        steps.append(f"kv_cache: pair, ckv {l1} (pad {p1}){' 4-D' * four_d}, kpe {l2} (pad {p2})")
    else:
        layout, pad = draw(layouts(pick, dtype, "kv_cache"))
        whole = laid_out(kv_values, layout, pad, (0, 1))
        if kv_form == "whole 4-D":
            whole = whole.unsqueeze(1)
        kv_cache = whole if kv_form.startswith("whole") else (whole[..., :LATENT], whole[..., LATENT:])
        steps.append(f"kv_cache: {kv_form}, {layout} (pad {pad})")

    if isinstance(kv_cache, tuple) and draw(st.integers(0, 4)) == 0:
        kv_cache = list(kv_cache)
        steps[-1] += ", as a list"

    bt_values = torch.tensor(table, dtype=torch.int32).reshape(batch, width).to(device_)
    bt_layout = draw(size("block_tables layout", st.sampled_from(["contiguous", "column slice"])))
    if bt_layout == "column slice":
        block_tables = torch.cat([bt_values, bt_values.new_full((batch, 3), -7)], dim=1)[:, :width]
    elif bt_layout == "transposed":
        block_tables = bt_values.t().contiguous().t()
    elif bt_layout == "every other column":
        block_tables = torch.stack([bt_values, bt_values], dim=-1).flatten(1)[:, ::2]
    else:
        block_tables = bt_values
    steps.append(f"block_tables: {bt_layout}")
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=device_)
    if draw(size("seq_lens layout", st.just(False))):
        seq_lens_t = torch.stack([seq_lens_t, seq_lens_t.neg()], dim=-1)[:, 0]
        steps.append("seq_lens: every other element")

    entry = "batch_mla" if split_fault else draw(st.sampled_from(ENTRIES))
    rows = (batch, q_len, heads)
    out_kind = draw(st.sampled_from(["none", "4-D", "3-D"]))
    out = None
    if out_kind == "4-D" or (out_kind == "3-D" and q_len != 1):
        out = poisoned((*rows, LATENT), torch.bfloat16, device_)
    elif out_kind == "3-D":
        out = poisoned((batch, heads, LATENT), torch.bfloat16, device_)
    lse_kind = draw(st.sampled_from(["none", "rows", "flat", "strided rows"]))
    lse = {
        "none": lambda: None,
        "rows": lambda: poisoned(rows, torch.float32, device_),
        "flat": lambda: poisoned((batch * q_len, heads), torch.float32, device_),
        "strided rows": lambda: poisoned((batch, heads, q_len), torch.float32, device_).transpose(1, 2),
    }[lse_kind]()
    scales = mostly(
        st.sampled_from([0.06, 1 / math.sqrt(192), 0.02, 1.5]),
        st.one_of(
            st.sampled_from([0, 1]),  # Python ints are numbers too
            st.sampled_from([(1,), (), (1, 1)]).map(
                lambda shape: torch.full(shape, 0.05, dtype=torch.float32, device=device_)
            ),
        ),
        one_in=3,
    )
    case = Case(
        entry=entry,
        device=device_,
        other=other_,
        query=query,
        kv_cache=kv_cache,
        block_tables=block_tables,
        seq_lens=seq_lens_t,
        max_seq_len=max_seq_len,
        workspace=torch.zeros(1 << 10, dtype=torch.uint8, device=device_) if draw(st.booleans()) else None,
        out=out,
        lse=lse,
        bmm1=draw(scales),
        bmm2=draw(scales),
        qk_nope_head_dim=draw(st.sampled_from(NOPE_HEAD_DIMS)),
        return_lse=draw(st.booleans()),
        lse_base=None if entry == "mla_decode" else draw(st.sampled_from([None, "base2", "basee"])),
        split_keywords=entry == "batch_mla" and (split_fault or draw(st.booleans())),
        steps=steps,
    )
    bends = [fault] if fault and fault[0] in BENDS else []
    if mode == "wild":
        bends = draw(st.lists(st.sampled_from(BEND_FAULTS), max_size=2))
    for name, variant in bends:
        case.steps.append(f"{name} ({variant}): {BENDS[name][0](draw, case, variant)}")
    return case


# Bends: each changes one argument of a drawn call (in place), the way its variant ``how`` names, and
# says what it did. Whether the call is still served is for ``violations`` to say: some bends keep it
# valid (a dtype bent to the other served one, a page id bent into range).

DTYPES_BY_NAME = {
    "fp16": torch.float16,
    "fp32": torch.float32,
    "fp8 e5m2": torch.float8_e5m2,
    "int8": torch.int8,
    "bf16": torch.bfloat16,
    "fp8 e4m3": torch.float8_e4m3fn,
}
NOTHING = "an earlier bend left nothing to bend"


def query_tensors(case) -> bool:
    """The query is still a tensor or a pair of tensors (a bend that needs one can apply)."""
    q = case.query
    if isinstance(q, (tuple, list)):
        return len(q) == 2 and all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in q)
    return isinstance(q, torch.Tensor) and q.dim() == 4


def kv_tensors(case) -> bool:
    """The cache is still a [P, page, D] (or [P, 1, page, D]) tensor or a pair of them."""
    paged = lambda t: isinstance(t, torch.Tensor) and (t.dim() == 3 or (t.dim() == 4 and t.shape[1] == 1))  # noqa: E731
    kv = case.kv_cache
    return len(kv) == 2 and all(map(paged, kv)) if isinstance(kv, (tuple, list)) else paged(kv)


def parts_of(x) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(latent part, rope part, the whole tensor or else the latent part) of a tensor or a pair."""
    if isinstance(x, torch.Tensor):
        return x[..., :LATENT], x[..., LATENT:], x
    return x[0], x[1], x[0]


def rows_of(case) -> tuple[int, int, int] | None:
    q = case.query
    lead = q[0] if isinstance(q, (tuple, list)) and q and isinstance(q[0], torch.Tensor) else q
    return tuple(lead.shape[:3]) if isinstance(lead, torch.Tensor) and lead.dim() >= 3 else None


def bend_query_dtype(draw, case, how):
    if not query_tensors(case):
        return NOTHING
    dtype = DTYPES_BY_NAME[how]
    if isinstance(case.query, (tuple, list)):
        which = draw(st.sampled_from([0, 1]))
        parts = list(case.query)
        parts[which] = parts[which].to(dtype)
        case.query = tuple(parts)
        return f"{QUERY_NAMES[which + 1]} to {dtype}"
    case.query = case.query.to(dtype)
    return f"to {dtype}"


def bend_kv_dtype(draw, case, how):
    if not kv_tensors(case):
        return NOTHING
    dtype, kv = DTYPES_BY_NAME[how], case.kv_cache
    if isinstance(kv, (tuple, list)):
        both = draw(st.booleans())
        case.kv_cache = (kv[0].to(dtype), kv[1].to(dtype) if both else kv[1])
        return f"{'both parts' if both else 'ckv_cache'} to {dtype}"
    case.kv_cache = kv.to(dtype)
    return f"to {dtype}"


def bend_both_dtypes(draw, case, how):
    """Query and cache in one dtype, served or not (an fp16 or fp32 model, fp8 e5m2)."""
    if not (query_tensors(case) and kv_tensors(case)):
        return NOTHING
    dtype = DTYPES_BY_NAME[how]
    to = lambda x: tuple(t.to(dtype) for t in x) if isinstance(x, (tuple, list)) else x.to(dtype)  # noqa: E731
    case.query, case.kv_cache = to(case.query), to(case.kv_cache)
    return f"both to {dtype}"


def bend_query_shape(draw, case, how):
    if not query_tensors(case):
        return NOTHING
    nope, pe, whole = parts_of(case.query)
    pair = isinstance(case.query, (tuple, list))
    if how == "last dim":
        made = {
            "pe dim 32": lambda: (nope, pe[..., :32]),
            "nope dim 256": lambda: (nope[..., :256], pe),
            "whole dim 512": lambda: whole[..., :512].contiguous(),
            "whole dim 575": lambda: whole[..., :575].contiguous(),
            "whole dim 640": lambda: torch.cat([whole, whole[..., :64]], dim=-1),
        }
        choice = draw(st.sampled_from(list(made)[:2] if pair else list(made)[2:]))
    elif how == "rank":
        made = {
            "3-D parts": lambda: (nope.flatten(1, 2), pe.flatten(1, 2)),
            "3-D": lambda: whole.flatten(1, 2),
            "5-D": lambda: whole.unsqueeze(0),
        }
        choice = "3-D parts" if pair else draw(st.sampled_from(["3-D", "5-D"]))
    else:  # "parts disagree": a pair whose parts differ in batch, q_len or heads
        made = {
            "pe one head": lambda: (nope, pe[:, :, :1]),
            "pe one token": lambda: (nope, pe[:, :1]),
            "pe one request": lambda: (nope, pe[:1]),
        }
        choice = draw(st.sampled_from(list(made)))
    case.query = made[choice]()
    return choice


def bend_query_kind(draw, case, how):
    if not query_tensors(case):
        return NOTHING
    nope, pe, whole = parts_of(case.query)
    case.query = {
        "string": lambda: "query",
        "None": lambda: None,
        "triple": lambda: (nope, pe, whole),
        "single": lambda: (whole,),
        "nested list": lambda: [[1.0] * 4, [2.0] * 4],
        "pe on other device": lambda: (nope, pe.to(case.other)),
    }[how]()
    return how


def bend_kv_shape(draw, case, how):
    if not kv_tensors(case):
        return NOTHING
    ckv, kpe, whole = parts_of(case.kv_cache)
    pair = isinstance(case.kv_cache, (tuple, list))
    view = pages_view(whole)
    if how == "last dim":
        made = {
            "kpe dim 32": lambda: (ckv, kpe[..., :32]),
            "ckv dim 576": lambda: (torch.cat([pages_view(ckv), pages_view(ckv)[..., :ROPE]], dim=-1), kpe),
            "whole dim 512": lambda: view[..., :512].contiguous(),
            "whole dim 640": lambda: torch.cat([view, view[..., :64]], dim=-1),
        }
        choice = draw(st.sampled_from(list(made)[:2] if pair else list(made)[2:]))
    elif how == "rank":
        made = {
            "2-D ckv": lambda: (pages_view(ckv).flatten(0, 1), kpe),
            "2-D": lambda: view.flatten(0, 1),
            "5-D": lambda: view.unsqueeze(1).unsqueeze(1),
        }
        choice = "2-D ckv" if pair else draw(st.sampled_from(["2-D", "5-D"]))
    elif how == "4-D with 2 in dim 1":
        made = {
            "ckv 4-D with 2 in dim 1": lambda: (pages_view(ckv).unsqueeze(1).expand(-1, 2, -1, -1), kpe),
            "4-D with 2 in dim 1": lambda: view.unsqueeze(1).expand(-1, 2, -1, -1),
        }
        choice = list(made)[0 if pair else 1]
    else:  # "parts disagree": a pair whose parts differ in pages or page size
        made = {
            "kpe one page fewer": lambda: (ckv, pages_view(kpe)[1:]),
            "kpe half the page size": lambda: (ckv, pages_view(kpe)[:, ::2]),
        }
        choice = draw(st.sampled_from(list(made)))
    case.kv_cache = made[choice]()
    return choice


def bend_kv_kind(draw, case, how):
    if not kv_tensors(case):
        return NOTHING
    kv = case.kv_cache
    ckv, kpe, whole = parts_of(kv)
    case.kv_cache = {
        "string": lambda: "kv_cache",
        "None": lambda: None,
        "triple": lambda: (ckv, kpe, whole),
        "on other device": lambda: kv.to(case.other) if whole is kv else (ckv.to(case.other), kpe.to(case.other)),
        "kpe on other device": lambda: (ckv, kpe.to(case.other)),
    }[how]()
    return how


def bend_block_tables(draw, case, how):
    bt = case.block_tables
    if not isinstance(bt, torch.Tensor) or bt.dim() != 2:
        return NOTHING
    case.block_tables = {
        "int64": lambda: bt.long(),
        "int16": lambda: bt.clamp(-(1 << 15), (1 << 15) - 1).to(torch.int16),
        "float32": lambda: bt.float(),
        "one row more": lambda: torch.cat([bt, bt[:1] if bt.shape[0] else bt.new_zeros(1, bt.shape[1])]),
        "one row fewer": lambda: bt[1:],
        "1-D": lambda: bt.reshape(-1),
        "3-D": lambda: bt.unsqueeze(0),
        "list": lambda: bt.tolist(),
        "on other device": lambda: bt.to(case.other),
    }[how]()
    return how


def bend_page_id(draw, case, how):
    """A page id that a request reads, negative or past the cache's pages."""
    bt, sl = case.block_tables, case.seq_lens
    if not (kv_tensors(case) and isinstance(bt, torch.Tensor) and isinstance(sl, torch.Tensor) and bt.dim() == 2):
        return NOTHING
    pages = pages_view(parts_of(case.kv_cache)[2]).shape
    lengths = sl.reshape(-1).tolist()[: bt.shape[0]]
    reads = [(b, i) for b, n in enumerate(lengths) for i in range(min(-(-int(n) // pages[1]), bt.shape[1]))]
    if not reads:
        return "no request reads a page: nothing to bend"
    b, i = draw(st.sampled_from(reads))
    values = [-1, -(1 << 31)] if how == "negative" else [pages[0], pages[0] + 1, 1 << 30]
    value = draw(st.sampled_from(values))
    case.block_tables = bt.clone()
    case.block_tables[b, i] = value
    return f"block_tables[{b}, {i}] = {value}"


def bend_seq_lens(draw, case, how):
    sl = case.seq_lens
    if not isinstance(sl, torch.Tensor) or sl.dim() != 1:
        return NOTHING
    case.seq_lens = {
        "int64": lambda: sl.long(),
        "float32": lambda: sl.float(),
        "one more": lambda: torch.cat([sl, sl.new_zeros(1)]),
        "one fewer": lambda: sl[1:],
        "2-D": lambda: sl.unsqueeze(0),
        "list": lambda: sl.tolist(),
        "on other device": lambda: sl.to(case.other),
    }[how]()
    return how


def bend_seq_len_value(draw, case, how):
    """One request's length negative, past max_seq_len, or past what the table covers (max_seq_len
    raised with it). Lengths stay below 2**20: were a check missing, the reference's scratch stays small."""
    sl, msl, bt = case.seq_lens, case.max_seq_len, case.block_tables
    if not (isinstance(sl, torch.Tensor) and sl.dim() == 1 and is_int(msl) and kv_tensors(case)):
        return NOTHING
    if sl.numel() == 0:
        return "no request: nothing to bend"
    page = pages_view(parts_of(case.kv_cache)[2]).shape[1]
    capacity = bt.shape[1] * page if isinstance(bt, torch.Tensor) and bt.dim() == 2 else msl
    b = draw(st.integers(0, sl.numel() - 1))
    if how == "negative":
        value = draw(st.sampled_from([-1, -(1 << 31)]))
    elif how == "past max_seq_len":
        value = draw(st.sampled_from([msl + 1, max(capacity, msl + 1), 1 << 20]))
    else:  # "past the table", with max_seq_len raised to it
        value = msl = draw(st.sampled_from([capacity + 1, capacity + page, 1 << 20]))
    case.seq_lens, case.max_seq_len = sl.clone(), msl
    case.seq_lens[b] = value
    return f"seq_lens[{b}] = {value}, max_seq_len {msl}"


def bend_max_seq_len(draw, case, how):
    msl = case.max_seq_len if is_int(case.max_seq_len) else 64
    page = pages_view(parts_of(case.kv_cache)[2]).shape[1] if kv_tensors(case) else 16
    bt = case.block_tables
    capacity = bt.shape[1] * page if isinstance(bt, torch.Tensor) and bt.dim() == 2 else msl
    case.max_seq_len = {
        "negative": lambda: -1,
        "past the table": lambda: capacity + 1,
        "float": lambda: float(msl),
        "bool": lambda: True,
        "None": lambda: None,
        "string": lambda: str(msl),
        "tensor": lambda: torch.tensor(msl),
        "one less": lambda: max(msl - 1, 0),  # served unless a request is that long
        "zero": lambda: 0,
    }[how]()
    return repr(case.max_seq_len)


def bend_scale(draw, case, how):
    name = draw(st.sampled_from(["bmm1", "bmm2"]))
    made = {
        "fp64 tensor": lambda: torch.tensor([0.05], dtype=torch.float64, device=case.device),
        "fp16 tensor": lambda: torch.tensor([0.05], dtype=torch.float16, device=case.device),
        "int tensor": lambda: torch.tensor([1], dtype=torch.int32, device=case.device),
        "two elements": lambda: torch.tensor([0.05, 0.05], device=case.device),
        "no element": lambda: torch.zeros(0, device=case.device),
        "bool": lambda: True,
        "string": lambda: "0.05",
        "None": lambda: None,
        "on other device": lambda: torch.tensor([0.05], device=case.other),
        "0-d fp32 tensor": lambda: torch.tensor(0.05, device=case.device),  # served
    }[how]()
    setattr(case, name, made)
    return f"{name}_scale: {how}"


def bend_out(draw, case, how):
    rows = rows_of(case)
    if rows is None:
        return NOTHING
    batch, q_len, heads = rows
    full = (*rows, LATENT)
    case.out = {
        "fp32": lambda: poisoned(full, torch.float32, case.device),
        "fp16": lambda: poisoned(full, torch.float16, case.device),
        "one head more": lambda: poisoned((batch, q_len, heads + 1, LATENT), torch.bfloat16, case.device),
        "3-D": lambda: poisoned((batch, heads, LATENT), torch.bfloat16, case.device),  # served for q_len 1
        "flat": lambda: poisoned((batch * q_len * heads * LATENT,), torch.bfloat16, case.device),
        "transposed": lambda: poisoned((batch, heads, q_len, LATENT), torch.bfloat16, case.device).transpose(1, 2),
        "on other device": lambda: poisoned(full, torch.bfloat16, case.other),
        "list": lambda: [0.0] * 4,
        "2-D rows": lambda: poisoned((batch * q_len * heads, LATENT), torch.bfloat16, case.device),
    }[how]()
    return how


def bend_lse(draw, case, how):
    rows = rows_of(case)
    if rows is None:
        return NOTHING
    batch, q_len, heads = rows
    case.lse = {
        "fp64": lambda: poisoned(rows, torch.float64, case.device),
        "bf16": lambda: poisoned(rows, torch.bfloat16, case.device),
        "one head more": lambda: poisoned((batch, q_len, heads + 1), torch.float32, case.device),
        "[B, q_len * H]": lambda: poisoned((batch, q_len * heads), torch.float32, case.device),
        "on other device": lambda: poisoned(rows, torch.float32, case.other),
        "list": lambda: [0.0],
        "transposed [B * q_len, H]": lambda: poisoned((heads, batch * q_len), torch.float32, case.device).t(),  # served
    }[how]()
    return how


def bend_workspace(draw, case, how):
    case.workspace = {
        "strided": lambda: torch.zeros(1 << 12, dtype=torch.uint8, device=case.device)[::2],
        "on other device": lambda: torch.zeros(1 << 12, dtype=torch.uint8, device=case.other),
        "bytes object": lambda: bytes(16),
        "int8": lambda: torch.zeros(1 << 12, dtype=torch.int8, device=case.device),  # served: any dtype
    }[how]()
    return how


def bend_dims(draw, case, how):
    wrong = {
        "qk_nope_head_dim": [64, 256, 512, 576, "128", None, 192],
        "kv_lora_rank": [256, 576, 0],
        "qk_rope_head_dim": [32, 128, 0],
    }[how]
    value = draw(st.sampled_from(wrong))
    setattr(case, how, value)
    unused = case.entry == "mla_decode" and how != "qk_nope_head_dim"
    return f"{how}={value!r}" + (" (mla_decode takes no such argument)" if unused else "")


def bend_device(draw, case, how):
    """Every tensor of the call on the other device (GPU run: the CPU, served by the reference; CPU
    run: the meta device, which nothing serves)."""
    move = lambda x: x.to(case.other) if isinstance(x, torch.Tensor) else x  # noqa: E731
    for name in ("query", "kv_cache"):
        value = getattr(case, name)
        setattr(case, name, tuple(map(move, value)) if isinstance(value, (tuple, list)) else move(value))
    for name in ("block_tables", "seq_lens", "workspace", "out", "lse", "bmm1", "bmm2"):
        setattr(case, name, move(getattr(case, name)))
    case.device, case.other = case.other, case.device
    return f"all on {case.device}"


def bend_split_keywords(draw, case, how):
    """batch_mla_paged_attention with one keyword of a split pair left out."""
    if case.entry != "batch_mla" or not case.split_keywords:
        return "not a split-keyword call: nothing to bend"
    names = []
    if isinstance(case.query, (tuple, list)) and len(case.query) == 2:
        names += ["q_nope", "q_pe"]
    if isinstance(case.kv_cache, (tuple, list)) and len(case.kv_cache) == 2:
        names += ["ckv_cache", "kpe_cache"]
    if not names:
        return "no pair passed by keyword: nothing to bend"
    case.dropped = (draw(st.sampled_from(names)),)
    return f"{case.dropped[0]} left out"


# name: (bend, its variants)
BENDS = {
    "query dtype": (bend_query_dtype, ("fp16", "fp32", "fp8 e5m2", "int8", "bf16", "fp8 e4m3")),
    "kv_cache dtype": (bend_kv_dtype, ("fp16", "fp32", "fp8 e5m2", "int8", "bf16", "fp8 e4m3")),
    "both dtypes": (bend_both_dtypes, ("fp16", "fp32", "fp8 e5m2", "bf16", "fp8 e4m3")),
    "query shape": (bend_query_shape, ("last dim", "rank", "parts disagree")),
    "query kind": (bend_query_kind, ("string", "None", "triple", "single", "nested list", "pe on other device")),
    "kv_cache shape": (bend_kv_shape, ("last dim", "rank", "4-D with 2 in dim 1", "parts disagree")),
    "kv_cache kind": (bend_kv_kind, ("string", "None", "triple", "on other device", "kpe on other device")),
    "block_tables": (
        bend_block_tables,
        ("int64", "int16", "float32", "one row more", "one row fewer", "1-D", "3-D", "list", "on other device"),
    ),
    "page id": (bend_page_id, ("negative", "past the cache")),
    "seq_lens": (bend_seq_lens, ("int64", "float32", "one more", "one fewer", "2-D", "list", "on other device")),
    "seq_len value": (bend_seq_len_value, ("negative", "past max_seq_len", "past the table")),
    "max_seq_len": (
        bend_max_seq_len,
        ("negative", "past the table", "float", "bool", "None", "string", "tensor", "one less", "zero"),
    ),
    "scale": (
        bend_scale,
        (
            "fp64 tensor",
            "fp16 tensor",
            "int tensor",
            "two elements",
            "no element",
            "bool",
            "string",
            "None",
            "on other device",
            "0-d fp32 tensor",
        ),
    ),  # fmt: skip
    "out": (
        bend_out,
        ("fp32", "fp16", "one head more", "3-D", "flat", "transposed", "on other device", "list", "2-D rows"),
    ),
    "lse": (
        bend_lse,
        ("fp64", "bf16", "one head more", "[B, q_len * H]", "on other device", "list", "transposed [B * q_len, H]"),
    ),
    "workspace": (bend_workspace, ("strided", "on other device", "bytes object", "int8")),
    "dims": (bend_dims, ("qk_nope_head_dim", "kv_lora_rank", "qk_rope_head_dim")),
    "split keywords": (bend_split_keywords, ("one left out",)),
    "device": (bend_device, ("everything on the other device",)),
}

# Faults of the drawn call itself (name: variant: the value drawn instead of a served one)
LAYOUT_FAULTS = ("start", "strides", "last dim")  # see layouts()
SIZE_FAULTS = {
    "heads": {"0": 0, "129": 129},
    "q_len": {"0": 0, f"{MAX_Q_LEN + 1}": MAX_Q_LEN + 1},
    "page size": {"8": 8, "24": 24, "256": 256},
    "block_tables layout": {"transposed": "transposed", "every other column": "every other column"},
    "seq_lens layout": {"every other element": True},
}
# Every (fault, variant) of a "one fault" call: an unsupported size or layout, or a bend.
BEND_FAULTS = [(name, variant) for name, (_, variants) in BENDS.items() for variant in variants]
FAULTS = (
    [(name, variant) for name, variants in SIZE_FAULTS.items() for variant in variants]
    + [(f"{part} layout", fault) for part in ("query", "kv_cache") for fault in LAYOUT_FAULTS]
    + BEND_FAULTS
)


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


@settings(max_examples=600, **PROPERTY_SETTINGS)
@given(case=calls(device="cpu", other="meta"))
def test_the_op_serves_exactly_the_contract_on_cpu(poisoned_allocations, case):
    check_call(case)


@pytest.mark.parametrize("fault", FAULTS, ids=[f"{name}: {variant}" for name, variant in FAULTS])
def test_each_fault_is_refused_by_name_or_served_right_on_cpu(poisoned_allocations, fault):
    """Every fault and variant, on a few otherwise served calls: the property holds, and the fault
    is refused at least once (so each check of the op is exercised) unless it may keep a call valid."""
    refused = []

    @settings(max_examples=6, **PROPERTY_SETTINGS)
    @given(case=calls(device="cpu", other="meta", modes=("one fault",), faults=(fault,)))
    def one_fault(case):
        refused.append(check_call(case))

    one_fault()
    assert any(refused) or fault in SOMETIMES_SERVED, f"{fault} never made a call the contract refuses"


def bundled_kernels_here() -> bool:
    return torch.cuda.is_available() and xqa_supported(torch.cuda.get_device_capability())


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
