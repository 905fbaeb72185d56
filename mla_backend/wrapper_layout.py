"""How a ``BatchMLAPagedAttentionWrapper.plan`` maps onto the kernels: which requests the kernels run,
at which q_len, over which ids, with which lengths. Built once per plan, so ``run`` only gathers.

The kernels take every request at one q_len (1..8), causal bottom-right aligned, with pages of a power
of two (1..1024). FlashInfer's plan takes any query lengths and any page size, served here as:

- every request the same qo_len <= 8: the packed query viewed as [B, qo_len, H, D] (no copy);
- other lengths: each request cut into chunks of at most ``q_len = min(max qo_len, 8)`` tokens, each
  chunk a kernel request of its own, right-aligned in a [chunks, q_len] grid (``PackedQueries``) over
  the same KV with seq_len = kv_len - qo_len + chunk_end, so the kernels' causal rule gives each token
  its own bound (causal=False: every chunk sees all kv_len keys);
- a page size the kernels cannot read: page ids turned into token slot ids
  (page * page_size + offset) over a page-size-1 view of the caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import shapes
from .packed_queries import PackedQueries

INT32_LIMIT = 2**31


@dataclass(frozen=True)
class KernelLayout:
    """What ``run`` hands the kernels. ``grid_sources``/``packed_slots`` are None when the packed
    query is viewed in place (every request the same qo_len <= 8)."""

    batch: int  # kernel requests (requests, or chunks of them)
    q_len: int  # the kernels' q_len
    total_q: int  # packed query rows of the plan
    kernel_page_size: int  # the plan's page size, or 1 (token slot ids)
    kv_indptr: torch.Tensor  # int32 [batch + 1] into kv_indices
    kv_indices: torch.Tensor  # int32 ragged page (or slot) ids
    seq_lens: torch.Tensor  # int32 [batch]
    max_seq_len: int
    grid_sources: torch.Tensor | None  # int64 [batch * q_len]: packed row feeding each grid slot
    packed_slots: torch.Tensor | None  # int64 [total_q]: grid slot holding each packed row's result

    @property
    def token_slots(self) -> bool:
        return self.kernel_page_size == 1

    def shape_key(self) -> tuple:
        """What a captured CUDA graph fixes: a later plan must keep it."""
        return (self.batch, self.q_len, self.total_q, self.kernel_page_size, self.grid_sources is None)


def _lengths(bounds: list[int]) -> list[int]:
    return [b - a for a, b in zip(bounds, bounds[1:])]


def _gather_ranges(starts: torch.Tensor, counts: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat positions starts[i] .. starts[i] + counts[i] - 1 for every i, their owner i), on the device."""
    total = sum(counts)
    counts_t = torch.tensor(counts, dtype=torch.int64, device=device)
    owner = torch.repeat_interleave(torch.arange(len(counts), device=device), counts_t, output_size=total)
    first = torch.cumsum(counts_t, 0) - counts_t
    return starts.to(torch.int64)[owner] + torch.arange(total, device=device) - first[owner], owner


def _cum(values: list[int]) -> list[int]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def token_slot_ids(kv_indices: torch.Tensor, kv_bounds: list[int], kv_lens: list[int], page_size: int) -> torch.Tensor:
    """int32 slot ids (page * page_size + offset) of each request's kv_len tokens, ragged by kv_lens."""
    device = kv_indices.device
    starts = torch.tensor(_cum(kv_lens)[:-1], dtype=torch.int64, device=device)
    flat, owner = _gather_ranges(starts, kv_lens, device)
    token = flat - starts[owner]
    page_start = torch.tensor(kv_bounds[:-1], dtype=torch.int64, device=device)
    pages = kv_indices.to(torch.int64)[page_start[owner] + torch.div(token, page_size, rounding_mode="floor")]
    slots = pages * page_size + token % page_size
    if slots.numel() and (int(slots.max()) >= INT32_LIMIT or int(slots.min()) < 0):
        raise ValueError(
            f"page_size={page_size} is served through token slot ids (page * page_size + offset), which "
            "must fit int32: kv_indices names pages beyond 2**31 tokens or negative pages"
        )
    return slots.to(torch.int32)


def build_layout(
    qo_bounds: list[int],
    kv_bounds: list[int],
    kv_indices: torch.Tensor,
    kv_lens: list[int],
    kv_lens_device: torch.Tensor,
    page_size: int,
    causal: bool,
) -> KernelLayout:
    """The kernel layout of a validated plan: host copies of qo_indptr, kv_indptr and kv_len_arr,
    ``kv_indices`` and ``kv_lens_device`` (kv_len_arr) on the plan's device."""
    device = kv_indices.device
    qo_lens = _lengths(qo_bounds)
    total_q = qo_bounds[-1]
    # The page ids the kernels read, as a ragged list: the plan's own, or token slot ids.
    if page_size in shapes.PAGE_SIZES:
        kernel_page_size, units, unit_bounds = page_size, kv_indices, kv_bounds
    else:
        kernel_page_size = 1
        units, unit_bounds = token_slot_ids(kv_indices, kv_bounds, kv_lens, page_size), _cum(kv_lens)
    q_len = min(max(qo_lens), shapes.MAX_Q_LEN)
    if all(n == q_len for n in qo_lens):  # the decode / MTP case: the packed query viewed in place
        indptr = torch.tensor(unit_bounds, dtype=torch.int32, device=device)
        return KernelLayout(
            batch=len(qo_lens),
            q_len=q_len,
            total_q=total_q,
            kernel_page_size=kernel_page_size,
            kv_indptr=indptr,
            kv_indices=units,
            seq_lens=kv_lens_device,
            max_seq_len=max(kv_lens),
            grid_sources=None,
            packed_slots=None,
        )
    # Chunks of at most q_len tokens ([start, end) of the request's tokens); an empty request keeps one.
    chunk_request, chunk_rows, chunk_lens = [], [0], []
    for b, (n, kv_len) in enumerate(zip(qo_lens, kv_lens)):
        ends = list(range(q_len, n, q_len)) + [n]
        for end in ends:
            chunk_request.append(b)
            chunk_rows.append(qo_bounds[b] + end)
            chunk_lens.append(max(0, kv_len - n + end) if causal else kv_len)
    grid = PackedQueries(torch.tensor(chunk_rows, dtype=torch.int32, device=device), q_len, total_q)
    if len(chunk_request) == len(qo_lens):  # one chunk a request: the ids as they are
        chunk_units, chunk_bounds = units, unit_bounds
    else:  # each chunk reads its request's ids (only the pages its length needs), repeated on the device
        counts = [min(-(-length // kernel_page_size), unit_bounds[b + 1] - unit_bounds[b])
                  for b, length in zip(chunk_request, chunk_lens)]  # fmt: skip
        starts = torch.tensor([unit_bounds[b] for b in chunk_request], dtype=torch.int64, device=device)
        positions, _ = _gather_ranges(starts, counts, device)
        chunk_units, chunk_bounds = units[positions], _cum(counts)
    return KernelLayout(
        batch=len(chunk_request),
        q_len=q_len,
        total_q=total_q,
        kernel_page_size=kernel_page_size,
        kv_indptr=torch.tensor(chunk_bounds, dtype=torch.int32, device=device),
        kv_indices=chunk_units,
        seq_lens=torch.tensor(chunk_lens, dtype=torch.int32, device=device),
        max_seq_len=max(chunk_lens),
        grid_sources=grid.grid_sources(),
        packed_slots=grid.packed_slots(),
    )
