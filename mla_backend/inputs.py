"""Random paged decode problems for tests, the benchmark and the demo.

Block tables are shuffled and entries past each request's length hold junk page ids (-1 and
ids past the cache), so any kernel that reads them fails loudly instead of passing by luck.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .shapes import HEAD_DIM

JUNK_PAGE_IDS = (-1, 1 << 30)


@dataclass
class PagedProblem:
    query: torch.Tensor
    kv_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    max_seq_len: int


def _random_fp(shape, dtype, device, generator, scale: float) -> torch.Tensor:
    data = torch.randn(shape, generator=generator, device="cpu", dtype=torch.float32) * scale
    return data.to(dtype).to(device)


def make_paged_problem(
    seq_lens: list[int],
    q_len: int,
    heads: int,
    page_size: int,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    seed: int = 0,
    extra_pages: int = 3,
    q_scale: float = 1.0,
    kv_scale: float = 1.0,
    four_dim_cache: bool = False,
) -> PagedProblem:
    """Random query/cache for the given per-request KV lengths (which include the q_len new tokens)."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(seq_lens)
    pages_per_req = [-(-n // page_size) for n in seq_lens]
    max_pages = max(max(pages_per_req, default=0) + 1, 1)  # one junk column at least
    total_pages = sum(pages_per_req) + extra_pages
    order = torch.randperm(total_pages, generator=gen)
    table = torch.empty(batch, max_pages, dtype=torch.int32)
    junk = torch.tensor(JUNK_PAGE_IDS, dtype=torch.int32)
    table.copy_(junk[torch.randint(len(JUNK_PAGE_IDS), (batch, max_pages), generator=gen)])
    cursor = 0
    for b, n in enumerate(pages_per_req):
        table[b, :n] = order[cursor:cursor + n].to(torch.int32)
        cursor += n
    cache_shape = (total_pages, 1, page_size, HEAD_DIM) if four_dim_cache else (total_pages, page_size, HEAD_DIM)
    kv_cache = _random_fp(cache_shape, dtype, device, gen, kv_scale)
    query = _random_fp((batch, q_len, heads, HEAD_DIM), dtype, device, gen, q_scale)
    return PagedProblem(
        query=query,
        kv_cache=kv_cache,
        block_tables=table.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        max_seq_len=max(seq_lens, default=0),
    )
