"""The op's input contract, stated on its own for the property tests (tests/test_op_properties.py).

The served problems as the docs state them, a drawn call (``Case``) and ``violations``: what is wrong
with a call, from the documented limits and the layout rules the kernels need, without reading
mla_backend.checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

# The served problems, as the docs state them ("bf16 or fp8 e4m3, 1-128 heads, q_len 1-8, pages of
# any power of two from 1 to 1024 tokens, scales as floats or one-element fp32 device tensors").
SERVED_DTYPES = (torch.bfloat16, torch.float8_e4m3fn)
SERVED_PAGE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
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
