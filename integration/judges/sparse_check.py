"""Float64 judges of a sparse MLA engine's calls (DeepSeek Sparse Attention): each attention call
recomputed from the indices the indexer chose, and the indexer's top-k against a float64 top-k of its
own inputs.

Attention: a call's logical lists (positions within each token's request, -1 for none) are turned into
cache slots here with the request's block table (independently of vLLM's conversion kernel), the rows
named are gathered from the real cache (fp8_ds_mla rows dequantised exactly) and the call is recomputed
by the float64 reference over the whole list, -1 entries masked (not bounded by vLLM's valid counts,
which the backend relies on). Rows whose list names fewer than MIN_VISIBLE_KEYS keys are not counted.

Indexer: logits = sum over heads of weight x relu(q . k) x k_scale, in float64 from the fp8 query, the
index cache's fp8 keys and scales, and the weights vLLM handed the scorer. The chosen set must be a
top-k of those: as many entries as min(length, k), distinct, inside the row, and none scoring below the
k-th best by more than a tie's width (the indexer's rounding of the same sum).

Verdicts on a run's summary (engines/vllm_sparse_checker.py's SparseChecker.summary, or the worker
check's merge of the ranks'): ``judge_sparse_check`` and, for a run on corrupted outputs,
``judge_sparse_selftest``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from integration.judges.decode_check import LSE_ABS_TOLERANCE, LSE_REL_TOLERANCE, MIN_VISIBLE_KEYS, CallCheck
from mla_backend.reference import sparse_mla_reference

TOKENS_PER_GATHER = 16  # float64 rows of 2048 keys x 576 a chunk: ~150 MB
# Of the row's largest |logit|: the indexer's e4m3 dots on SM90's tensor cores (ours as DeepGEMM's) sum
# their products with fewer bits than fp32 keeps; dev/indexer_precision.py measured 2.4e-4 at V3.2's shape.
TIE_RELATIVE = 1e-3


@dataclass(eq=False)
class SparseCall:
    query: torch.Tensor  # [T, H, 576] bf16
    topk: torch.Tensor  # [T, K] int32 positions in each token's request, -1 for none
    req_ids: torch.Tensor  # [T] int32 request of each token
    block_table: torch.Tensor  # [R, blocks] int32
    block_size: int
    kv_cache: torch.Tensor  # [blocks, block_size, 576] bf16 or [..., 656] uint8 (fp8_ds_mla)
    scale: float
    out: torch.Tensor  # [T, H, 512] what the backend returned
    lse: torch.Tensor | None  # [T, H] natural log, where the backend returned one


def physical_slots(topk: torch.Tensor, req_ids: torch.Tensor, block_table: torch.Tensor, block_size: int):
    """Slot ids (block x block_size + offset) of each position; -1 where the position is -1 or past the table."""
    positions = topk.long()
    blocks = positions.div(block_size, rounding_mode="floor")
    inside = (positions >= 0) & (blocks < block_table.shape[1])
    rows = block_table[req_ids.long()].long()  # [T, blocks]
    block_ids = torch.gather(rows, 1, blocks.clamp(0, block_table.shape[1] - 1))
    return torch.where(inside, block_ids * block_size + positions % block_size, -1)


def check_sparse_call(call: SparseCall) -> CallCheck:
    """Recompute one call in float64 over the rows its lists name; compare rows seeing >= MIN_VISIBLE_KEYS keys."""
    slots = physical_slots(call.topk, call.req_ids, call.block_table, call.block_size)
    return check_sparse_slots(call.query, slots, call.kv_cache, call.scale, call.out, call.lse)


def check_sparse_slots(
    query: torch.Tensor,
    slots: torch.Tensor,
    kv_cache: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
) -> CallCheck:
    """check_sparse_call on lists already turned into cache rows: ``slots`` [T, K] rows of ``kv_cache``
    (any shape whose last dimension is a row: 576 bf16 or 656 fp8_ds_mla bytes), -1 for none."""
    width = kv_cache.shape[-1]
    flat = kv_cache.reshape(-1, width)  # the engine's cache is one dense block of rows per layer
    tokens, heads, _ = query.shape
    errors, lse_deltas, lse_allowed, counted = [], [], [], []
    for start in range(0, tokens, TOKENS_PER_GATHER):
        part = slice(start, start + TOKENS_PER_GATHER)
        chunk = slots[part]
        used, local = torch.unique(chunk.clamp_min(0), return_inverse=True)
        local = torch.where(chunk >= 0, local, -1)
        want, want_lse = sparse_mla_reference(query[part], flat[used], local, scale)
        got = out[part].double()
        seen = (chunk >= 0).sum(dim=1) >= MIN_VISIBLE_KEYS
        counted.append(seen[:, None].expand(-1, heads))
        errors.append((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-300))
        if lse is not None:
            lse_deltas.append((lse[part].double() - want_lse).abs())
            lse_allowed.append(LSE_ABS_TOLERANCE + LSE_REL_TOLERANCE * want_lse.abs())
    rows = torch.cat(counted)
    if not rows.any():
        return CallCheck(0, 0.0, None, True)
    error = torch.cat(errors)[rows]
    out_error = error.max().item() if torch.isfinite(error).all() else float("inf")
    lse_error, lse_ok = None, True
    if lse_deltas:
        delta, allowed = torch.cat(lse_deltas)[rows], torch.cat(lse_allowed)[rows]
        lse_error = delta.max().item() if torch.isfinite(delta).all() else float("inf")
        lse_ok = bool((delta <= allowed).all())
    return CallCheck(int(rows.sum()), out_error, lse_error, lse_ok)


def paged_index_keys(index_cache: torch.Tensor, block_row: torch.Tensor, length: int, dim: int):
    """(keys [length, dim] float64, scales [length] float64) of one request from the paged index cache:
    each block holds block_size x dim fp8 values, then block_size fp32 scales."""
    block_size = index_cache.shape[1]
    blocks = -(-length // block_size)
    pages = index_cache[block_row[:blocks].long()].reshape(blocks, -1)
    values = pages[:, : block_size * dim].contiguous().view(torch.float8_e4m3fn).reshape(-1, dim)
    scales = pages[:, block_size * dim :].contiguous().view(torch.float32).reshape(-1)
    return values[:length].double(), scales[:length].double()


def indexer_logits64(q: torch.Tensor, keys: torch.Tensor, scales: torch.Tensor, weights: torch.Tensor):
    """[R, n] float64 logits of query rows q [R, H, D] (fp8) against keys [n, D] with per-key scales."""
    dots = torch.einsum("rhd,nd->rhn", q.double(), keys)
    return (dots.relu() * weights.double()[:, :, None]).sum(dim=1) * scales[None, :]


def topk_problems(chosen: torch.Tensor, logits: torch.Tensor, lengths: list[int], k: int) -> list[str]:
    """What is wrong with ``chosen`` [R, K] (-1 padded) as the top-k of rows of ``logits`` [R, >= length]
    scoring positions [0, length); [] when each row is a top-k up to ties."""
    problems = []
    for row, length in enumerate(lengths):
        picked = chosen[row][chosen[row] >= 0].long()
        want = min(length, k)
        if picked.numel() != want or picked.unique().numel() != want:
            problems.append(f"row {row}: {picked.numel()} entries ({picked.unique().numel()} distinct), want {want}")
            continue
        if want == 0:
            continue
        if int(picked.max()) >= length:
            problems.append(f"row {row}: position {int(picked.max())} past the row's {length}")
            continue
        scores = logits[row, :length]
        kth = torch.topk(scores, want).values[-1]
        tie = TIE_RELATIVE * scores.abs().max()
        worst = scores[picked].min()
        if worst < kth - tie:
            problems.append(f"row {row}: a chosen logit {worst.item():.6g} is below the k-th best {kth.item():.6g}")
    return problems


def boundary_near_ties(logits: torch.Tensor, lengths: list[int], k: int) -> tuple[int, int]:
    """(rows that select, being longer than k; of them, rows whose k-th and next-best logits lie within a
    tie's width). There the indexer's choice rests on rounding: a run whose upstream layers round a
    little differently (another batch, another attention kernel) may keep a key this run dropped, and in
    a peaked row one key can carry much of the attention."""
    selecting = ties = 0
    for row, length in enumerate(lengths):
        if length <= k:
            continue
        scores = logits[row, :length]
        top = torch.topk(scores, k + 1).values
        selecting += 1
        ties += int(top[-2] - top[-1] <= TIE_RELATIVE * scores.abs().max())
    return selecting, ties


def judge_sparse_check(summary: dict) -> tuple[bool, str]:
    """The sparse calls a run checked in float64: some rows checked, every one within the tolerance,
    the indexer's lists of every judged decode step a top-k, no checker problem."""
    worst = summary["worst_row_error"]
    note = (
        f"sparse calls max rel err {'-' if worst is None else f'{worst:.1e}'} (tol {summary['tolerance']:.0e}; "
        f"{summary['checked_calls']} calls, {summary['mixed_calls_checked']} mixed, {summary['checked_rows']} rows); "
        f"indexer top-k {summary['topk_checked_rows']} rows, failures {summary['topk_failures']}, "
        f"near-ties at the k-th {summary['topk_boundary_ties']} of {summary['topk_selecting_rows']} rows "
        "that select; "
        f"problems {summary['problems']}"
    )
    return bool(summary["ok"]), note


def judge_sparse_selftest(summary: dict) -> tuple[bool, str]:
    """The check on corrupted outputs must fail on the outputs themselves: rows checked, the worst over
    the tolerance. True where it caught the corruption."""
    passed, note = judge_sparse_check(summary)
    worst = summary["worst_row_error"]
    caught = not passed and worst is not None and worst > summary["tolerance"] and summary["checked_rows"] > 0
    return caught, f"check {'failed, as it must' if caught else 'DID NOT CATCH the corruption'}: {note}"


__all__ = [
    "SparseCall",
    "check_sparse_call",
    "check_sparse_slots",
    "indexer_logits64",
    "judge_sparse_check",
    "judge_sparse_selftest",
    "paged_index_keys",
    "physical_slots",
    "topk_problems",
]
