"""Variable-length queries packed as FlashInfer packs them ([total_q, H, D] rows with cumulative
lengths), mapped onto the fixed [B, q_len] grid the kernels take, and back. Shared by the functional
API (``cum_seq_lens_q``) and the wrapper class (``qo_indptr``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedQueries:
    """Variable-length queries packed as [total_q, H, D] with cum_seq_lens_q [B + 1]: each request's
    tokens right-aligned in a [B, max_q_len] grid, so the kernels' fixed-q_len causal rule (token i of
    q_len sees seq_len - q_len + i + 1 keys) gives each real token its own bound; the grid's leading
    slots of a shorter request are computed and dropped."""

    cum: torch.Tensor  # int32 [B + 1]
    max_q_len: int
    total: int

    @property
    def batch(self) -> int:
        return self.cum.shape[0] - 1

    def grid_sources(self) -> torch.Tensor:
        """[B * max_q_len] packed row feeding each grid slot (a request's first row for its unused slots)."""
        cum = self.cum.to(torch.int64)
        slots = torch.arange(self.max_q_len, device=cum.device)
        source = cum[1:, None] - self.max_q_len + slots[None, :]
        return torch.maximum(source, cum[:-1, None]).clamp(0, max(self.total - 1, 0)).reshape(-1)

    def packed_slots(self) -> torch.Tensor:
        """[total_q] grid slot that holds each packed row's result."""
        cum = self.cum.to(torch.int64)
        rows = torch.arange(self.total, device=cum.device)
        request = torch.searchsorted(cum[1:], rows, right=True)
        return request * self.max_q_len + self.max_q_len - (cum[1:][request] - rows)

    def to_grid(self, packed: torch.Tensor) -> torch.Tensor:
        return packed.index_select(0, self.grid_sources()).view(self.batch, self.max_q_len, *packed.shape[1:])

    def from_grid(self, grid: torch.Tensor) -> torch.Tensor:
        return grid.reshape(self.batch * self.max_q_len, *grid.shape[2:]).index_select(0, self.packed_slots())
