"""The lightning indexer's logits as Triton kernels: what ``mla_backend.indexer`` runs on a GPU.

Same calls and results as the torch functions there (see its docstring for the formula, the cache
layout and DeepGEMM's signatures), with two differences that make them fit for serving:

- decode reads each request's length on the device: a CUDA graph captured once scores only the blocks
  a request holds, not the table's width (max_model_len) as the torch version must;
- the e4m3 dot products run on the tensor cores (fp8 inputs, fp32 accumulation), one key block at a
  time, so no [rows, heads, columns] fp32 temporary is ever written to memory.

Decode with ``clean_logits=False`` (vLLM's call) leaves positions past a row's last block unwritten, as
DeepGEMM does (vLLM's top-k reads a row up to its length); the rest of each block a row reaches is
-inf. ``clean_logits=True`` fills the whole row first. Prefill fills -inf outside each row's range.

On CPU tensors the kernels run in Triton's interpreter (the tests' way to check them without a GPU).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

KEY_BLOCK = 64  # prefill keys a program scores per step
# The dot's operands. e4m3 as DeepGEMM: on SM90 the tensor cores sum FP8 products with fewer bits than
# fp32 (2.4e-4 of a row's largest logit at V3.2's shape, dev/indexer_precision.py); "bf16" widens the
# same values exactly and sums in fp32 (1.4e-7), at twice the decode time (H200).
DOT_OPERANDS = "e4m3"
ROW_TARGET = 256  # (token, head) pairs a program holds: the tile's columns (keys-major) or rows
PROGRAMS_PER_SM = 4
# The tile's orientation: False, (token, head) rows by keys; True, keys by (token, head) columns, where
# on SM90 (wgmma) the sum over heads stays within a warp instead of crossing warps through shared
# memory (dev/indexer_tile_layout.py shows which). Keys-major with 256 columns is the faster on the H200
# at every decode and prefill shape timed (dev/indexer_vs_deepgemm.py --keys-major, docs/performance.md).
KEYS_MAJOR = True


@triton.jit
def _head_sum(
    q, k, weights, scale, SLOTS: tl.constexpr, HEADS: tl.constexpr, KEYS: tl.constexpr, KEYS_MAJOR: tl.constexpr
):
    """[SLOTS, KEYS] logits sum_h w * relu(q . k) * scale of q [SLOTS * HEADS, D] (token-major rows),
    k [KEYS, D], weights [SLOTS * HEADS], scale [KEYS]; fp32 dots: the e4m3 products are exact, only the
    sums round. KEYS_MAJOR: the dot's tile turned round (keys its rows), the heads summed along its columns."""
    if KEYS_MAJOR:
        dots = tl.maximum(tl.dot(k, tl.trans(q)), 0.0) * weights[None, :]
        return tl.trans(tl.sum(tl.reshape(dots, [KEYS, SLOTS, HEADS]), axis=2) * scale[:, None])
    dots = tl.maximum(tl.dot(q, tl.trans(k)), 0.0) * weights[:, None]
    return tl.sum(tl.reshape(dots, [SLOTS, HEADS, KEYS]), axis=1) * scale[None, :]


# Integers that change from call to call are not specialised on (Triton compiles a variant for 1 and for
# multiples of 16): a batch size first seen while serving would otherwise stall on a compile.
@triton.jit(do_not_specialize=["splits"])
def _paged_logits_kernel(
    q_ptr,  # [B, NEXT_N, HEADS, DIM] e4m3, contiguous
    cache_ptr,  # [num_blocks, PAGE, 1, DIM + 4] uint8: per block PAGE x DIM e4m3, then PAGE fp32 scales
    weights_ptr,  # [B * NEXT_N, HEADS] fp32, contiguous
    lens_ptr,  # int32 context lengths: [B] (CAUSAL) or [B, NEXT_N] (each row's own; stride 0 for [B, 1])
    table_ptr,  # [B, table_width] int32
    out_ptr,  # [B * NEXT_N, width]
    lens_stride,
    lens_row_stride,
    reach,  # no row scores past min(width, the table's positions)
    block_stride,
    table_stride,
    out_stride,
    width,
    splits,
    CAUSAL: tl.constexpr,  # 1-D lengths: row (b, j) ends at lens[b] - NEXT_N + j + 1
    NEXT_N: tl.constexpr,
    GROUP: tl.constexpr,  # draft tokens a program takes (a power of two)
    SLOTS: tl.constexpr,  # GROUP, or more to give the tensor cores 16 rows
    HEADS: tl.constexpr,
    DIM: tl.constexpr,
    PAGE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # e4m3 operands widened to this before the tensor cores' dot, or None
    KEYS_MAJOR: tl.constexpr,  # the module's KEYS_MAJOR
):
    groups = tl.cdiv(NEXT_N, GROUP)
    b = tl.program_id(0) // groups
    first = (tl.program_id(0) % groups) * GROUP
    split = tl.program_id(1)
    slot = tl.arange(0, SLOTS)
    token = first + slot
    live = (slot < GROUP) & (token < NEXT_N)
    row = tl.arange(0, SLOTS * HEADS)
    row_live = tl.reshape(tl.broadcast_to(live[:, None], [SLOTS, HEADS]), [SLOTS * HEADS])
    q_row = (b * NEXT_N + first + row // HEADS).to(tl.int64) * HEADS + row % HEADS
    d = tl.arange(0, DIM)
    q = tl.load(q_ptr + q_row[:, None] * DIM + d[None, :], mask=row_live[:, None], other=0.0)
    if DOT_DTYPE is not None:
        q = q.to(DOT_DTYPE)
    weights = tl.load(weights_ptr + q_row, mask=row_live, other=0.0)
    if CAUSAL:
        ends = tl.load(lens_ptr + b * lens_stride + 0 * token, mask=live, other=0) - NEXT_N + 1 + token
    else:
        ends = tl.load(lens_ptr + b * lens_stride + token * lens_row_stride, mask=live, other=0)
    ends = tl.where(live, tl.minimum(tl.maximum(ends, 0), reach), 0)
    blocks = tl.cdiv(tl.max(ends, axis=0), PAGE)

    t = tl.arange(0, PAGE)
    values_ptr = cache_ptr.to(tl.pointer_type(tl.float8e4nv))
    out_row = (b * NEXT_N + token).to(tl.int64) * out_stride
    for block in range(split, blocks, splits):
        page = tl.load(table_ptr + b * table_stride + block).to(tl.int64)
        base = page * block_stride
        k = tl.load(values_ptr + base + t[:, None] * DIM + d[None, :])
        scale = tl.load((cache_ptr + base + PAGE * DIM).to(tl.pointer_type(tl.float32)) + t)
        if DOT_DTYPE is not None:
            k = k.to(DOT_DTYPE)
        logits = _head_sum(q, k, weights, scale, SLOTS, HEADS, PAGE, KEYS_MAJOR)
        position = block * PAGE + t
        logits = tl.where(position[None, :] < ends[:, None], logits, float("-inf"))
        mask = live[:, None] & (position[None, :] < width)
        tl.store(out_ptr + out_row[:, None] + position[None, :], logits.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["rows", "out_stride", "width", "splits"])
def _ragged_logits_kernel(
    q_ptr,  # [M, HEADS, DIM] e4m3, contiguous
    k_ptr,  # [N, DIM] e4m3, contiguous
    scale_ptr,  # [N] fp32
    weights_ptr,  # [M, HEADS] fp32, contiguous
    starts_ptr,  # [M] int32, clamped to [0, N]
    ends_ptr,  # [M] int32, clamped to [start, N]
    out_ptr,  # [M, width]
    rows,
    out_stride,
    width,
    splits,
    COMPRESSED: tl.constexpr,  # column j of row t is position start[t] + j (else position j)
    SLOTS: tl.constexpr,  # query rows a program takes
    HEADS: tl.constexpr,
    DIM: tl.constexpr,
    KEYS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    KEYS_MAJOR: tl.constexpr,
):
    slot = tl.arange(0, SLOTS)
    token = tl.program_id(0) * SLOTS + slot
    live = token < rows
    split = tl.program_id(1)
    row = tl.arange(0, SLOTS * HEADS)
    q_row = (tl.program_id(0) * SLOTS + row // HEADS).to(tl.int64)
    row_live = q_row < rows
    d = tl.arange(0, DIM)
    q = tl.load(q_ptr + (q_row * HEADS + row % HEADS)[:, None] * DIM + d[None, :], mask=row_live[:, None], other=0.0)
    if DOT_DTYPE is not None:
        q = q.to(DOT_DTYPE)
    weights = tl.load(weights_ptr + q_row * HEADS + row % HEADS, mask=row_live, other=0.0)
    starts = tl.load(starts_ptr + token, mask=live, other=2147483647)
    ends = tl.load(ends_ptr + token, mask=live, other=0)
    first_block = tl.min(starts, axis=0) // KEYS
    key_end = tl.max(ends, axis=0)  # no row of this program scores a key past it
    last_block = tl.cdiv(key_end, KEYS)

    t = tl.arange(0, KEYS)
    out_row = token.to(tl.int64) * out_stride
    for block in range(first_block + split, last_block, splits):
        position = block * KEYS + t
        in_keys = position < key_end
        k = tl.load(k_ptr + position.to(tl.int64)[:, None] * DIM + d[None, :], mask=in_keys[:, None], other=0.0)
        scale = tl.load(scale_ptr + position, mask=in_keys, other=0.0)
        if DOT_DTYPE is not None:
            k = k.to(DOT_DTYPE)
        logits = _head_sum(q, k, weights, scale, SLOTS, HEADS, KEYS, KEYS_MAJOR)
        inside = (position[None, :] >= starts[:, None]) & (position[None, :] < ends[:, None])
        if COMPRESSED:
            column = position[None, :] - starts[:, None]
            mask = live[:, None] & inside & (column < width)
        else:
            column = position[None, :] + 0 * starts[:, None]
            logits = tl.where(inside, logits, float("-inf"))
            mask = live[:, None] & (column < width)
        tl.store(out_ptr + out_row[:, None] + column, logits.to(out_ptr.dtype.element_ty), mask=mask)


def serves(heads: int, dim: int, page: int = KEY_BLOCK) -> bool:
    """Shapes these kernels take: powers of two (Triton's tiles), 16 or more keys and dims (the tensor
    cores' smallest step). DeepSeek-V3.2 (64 x 128) and GLM-5 (32 x 128), pages of 64, are in."""
    return all(_power_of_two(n) for n in (heads, dim, page)) and dim >= 16 and page >= 16


def paged_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    width: int,
    clean_logits: bool,
    logits_dtype: torch.dtype,
) -> torch.Tensor:
    """[B * next_n, width] decode logits: q [B, next_n, H, D] e4m3, the index cache, weights [B * next_n,
    H] fp32, context_lens [B] (row (b, j) ends at len - next_n + j + 1) or [B, next_n] / [B, 1] (each
    row's end) int32, block_table [B, blocks]. One launch, no other kernel: lengths are read by it."""
    batch, next_n, heads, dim = q.shape
    page = kv_cache.shape[1]
    causal = context_lens.dim() == 1
    if context_lens.dtype != torch.int32:
        context_lens = context_lens.to(torch.int32)
    lens_row_stride = 0 if causal or context_lens.shape[1] == 1 else context_lens.stride(1)
    fill = torch.full if clean_logits else _empty_like_full
    out = fill((batch * next_n, width), float("-inf"), dtype=logits_dtype, device=q.device)
    if batch == 0 or width == 0:
        return out
    group = min(triton.next_power_of_2(next_n), max(1, ROW_TARGET // heads))
    slots = max(group, -(-16 // heads))
    programs = batch * -(-next_n // group)
    splits = max(1, min(-(-width // page), -(-_programs_wanted(q.device) // programs)))
    _kernel(_paged_logits_kernel, q.device)[(programs, splits)](
        q.contiguous(),
        kv_cache,
        weights.contiguous().float(),
        context_lens,
        block_table,
        out,
        context_lens.stride(0),
        lens_row_stride,
        min(width, block_table.shape[1] * page),
        kv_cache.stride(0),
        block_table.stride(0),
        out.stride(0),
        width,
        splits,
        CAUSAL=causal,
        NEXT_N=next_n,
        GROUP=group,
        SLOTS=slots,
        HEADS=heads,
        DIM=dim,
        PAGE=page,
        DOT_DTYPE=_dot_dtype(),
        KEYS_MAJOR=KEYS_MAJOR,
        num_warps=8 if slots * heads >= 128 else 4,
    )
    return out


def ragged_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    k_scale: torch.Tensor,
    weights: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    width: int,
    compressed: bool,
    logits_dtype: torch.dtype,
) -> torch.Tensor:
    """[M, width] prefill logits: q [M, H, D] e4m3, k [N, D] e4m3, k_scale [N] fp32, weights [M, H],
    starts/ends [M] clamped to [0, N] with end >= start; column j is position j, or start + j when
    ``compressed``. -inf outside each row's range."""
    rows, heads, dim = q.shape
    out = torch.full((rows, width), float("-inf"), dtype=logits_dtype, device=q.device)
    if rows == 0 or width == 0:
        return out
    slots = max(1, ROW_TARGET // heads)
    programs = -(-rows // slots)
    splits = max(1, min(-(-k.shape[0] // KEY_BLOCK), -(-_programs_wanted(q.device) // programs)))
    _kernel(_ragged_logits_kernel, q.device)[(programs, splits)](
        q.contiguous(),
        k.contiguous(),
        k_scale.contiguous(),
        weights.contiguous().float(),
        starts.to(torch.int32).contiguous(),
        ends.to(torch.int32).contiguous(),
        out,
        rows,
        out.stride(0),
        width,
        splits,
        COMPRESSED=compressed,
        SLOTS=slots,
        HEADS=heads,
        DIM=dim,
        KEYS=KEY_BLOCK,
        DOT_DTYPE=_dot_dtype(),
        KEYS_MAJOR=KEYS_MAJOR,
        num_warps=8,
    )
    return out


def _dot_dtype():
    return tl.bfloat16 if DOT_OPERANDS == "bf16" else None


def _empty_like_full(shape, value, dtype, device):
    return torch.empty(shape, dtype=dtype, device=device)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _programs_wanted(device: torch.device) -> int:
    return PROGRAMS_PER_SM * (_sm_count(device.index) if device.type == "cuda" else 1)


@functools.cache
def _sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(
        index if index is not None else torch.cuda.current_device()
    ).multi_processor_count


def _kernel(kernel, device: torch.device):
    """The compiled kernel on a GPU; on CPU, Triton's interpreter of the same function."""
    if device.type == "cuda":
        return kernel
    return _interpreted(kernel)


@functools.cache
def _interpreted(kernel):
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(kernel.fn)


__all__ = ["paged_logits", "ragged_logits", "serves"]
