"""Random paged decode problems for tests, the benchmark and the demo.

Block tables are shuffled and entries past each request's length hold junk page ids (-1 and
ids past the cache), so any kernel that reads them fails loudly instead of passing by luck.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .shapes import HEAD_DIM, KV_LORA_RANK, ROPE_DIM

JUNK_PAGE_IDS = (-1, 1 << 30)


@dataclass
class PagedProblem:
    query: torch.Tensor
    kv_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    max_seq_len: int

    def decode_args(self, workspace: torch.Tensor | None) -> tuple:
        """``mla_decode``'s positional arguments for this problem."""
        return (self.query, self.kv_cache, workspace, self.block_tables, self.seq_lens, self.max_seq_len)

    def ragged_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(kv_indices, kv_indptr): each request's used page ids of the table, packed as FlashInfer's ragged ids."""
        page = self.kv_cache.shape[-2]
        used = [-(-n // page) for n in self.seq_lens.tolist()]
        indices = torch.cat([row[:n] for row, n in zip(self.block_tables, used)])
        indptr = torch.tensor([0] + used, device=indices.device).cumsum(0).to(torch.int32)
        return indices, indptr

    def step_plan(self, workspace: torch.Tensor | None, config=None, buffer: torch.Tensor | None = None):
        """``plan_decode`` for this problem's step (None where its calls plan for themselves)."""
        from .step_plan import plan_decode

        _, q_len, heads, _ = self.query.shape
        return plan_decode(
            self.seq_lens,
            self.block_tables,
            self.kv_cache.shape[-2],
            heads=heads,
            q_len=q_len,
            kv_dtype=self.kv_cache.dtype,
            workspace_buffer=workspace,
            buffer=buffer,
            config=config,
        )


# Elements drawn per step on the GPU: the float32 scratch stays small and is allocated after the
# result, so the result sits where a plain allocation of its size would (kernel times depend on it).
DRAW_CHUNK_ELEMENTS = 1 << 26


def _random_fp(shape, dtype, device, generator, scale: float) -> torch.Tensor:
    device = torch.device(device)
    if device.type == "cuda":  # drawn on the GPU: gigabyte caches take seconds on the CPU
        seed = int(torch.randint(2**62, (1,), generator=generator))
        on_device = torch.Generator(device=device).manual_seed(seed)
        out = torch.empty(shape, dtype=dtype, device=device)
        flat = out.view(-1)
        for start in range(0, flat.numel(), DRAW_CHUNK_ELEMENTS):
            part = flat[start : start + DRAW_CHUNK_ELEMENTS]
            part.copy_(torch.randn(part.numel(), generator=on_device, device=device).mul_(scale))
        return out
    data = torch.randn(shape, generator=generator, dtype=torch.float32) * scale
    return data.to(dtype)


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
        table[b, :n] = order[cursor : cursor + n].to(torch.int32)
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


def vllm_bf16_query_layout(query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The values of ``query`` [B, q_len, H, 576] laid out as vLLM's MLA hands a bf16 decode over:
    ql_nope, the transposed [H, T, 512] output of the W_UK bmm, and q_pe, a slice of the [T, H, 192]
    query projection (head stride 192). Both are strided views, shaped [B, q_len, H, 512 / 64]."""
    batch, q_len, heads, _ = query.shape
    tokens, nope_head_dim = batch * q_len, 128  # the projection's rows: 128 nope + 64 rope per head
    flat = query.reshape(tokens, heads, HEAD_DIM)
    nope = torch.empty(heads, tokens, KV_LORA_RANK, dtype=query.dtype, device=query.device)
    nope.copy_(flat[..., :KV_LORA_RANK].transpose(0, 1))
    projection = torch.randn(tokens, heads, nope_head_dim + ROPE_DIM, device=query.device).to(query.dtype)
    projection[..., nope_head_dim:] = flat[..., KV_LORA_RANK:]
    return (
        nope.transpose(0, 1).view(batch, q_len, heads, KV_LORA_RANK),
        projection[..., nope_head_dim:].view(batch, q_len, heads, ROPE_DIM),
    )
