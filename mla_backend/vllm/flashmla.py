"""vLLM's FlashMLA dense decode (SM90), called as vLLM's FLASHMLA backend calls it: a scheduler plan per
batch, then the kernel. Outputs come back in our layout (out [tokens, H, 512], LSE
[tokens, H], natural log). Used by `auto`'s engine-best routes (dense decode) and by the benchmark's peer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# The worst relative L2 error of an output row FlashMLA may show against float64 where it serves
# `auto`'s decode: vLLM's accuracy on Hopper, not ours (reference.ROW_ERROR_TOLERANCE, half these).
# Its FP8 kernel rounds P to e4m3 before P.V: rows that see a few hundred keys land at 2.0-2.6e-2 on
# an H100, ours at 2e-3. A broken route (query or LSE layout, scales) is off by 1e-1 and more.
ROW_ERROR_TOLERANCE = {torch.float8_e4m3fn: 5e-2, torch.bfloat16: 1e-2}
TILE_METADATA_WIDTH = 8  # ints per scheduler tile (FlashMLA's TileSchedulerMetaDataSize)


def available() -> tuple[bool, str | None]:
    """(True, None) where vLLM ships FlashMLA's dense decode for this GPU, else (False, why)."""
    try:
        from vllm.v1.attention.ops.flashmla import is_flashmla_dense_supported
    except ImportError as err:
        return False, f"vLLM's FlashMLA ops are not importable ({err})"
    return is_flashmla_dense_supported()


@dataclass
class Schedule:
    """FlashMLA's plan for one decode batch: fp8 caches get (tile metadata, splits) tensors, bf16
    caches a FlashMLASchedMeta the kernel fills on its first call (inside a graph as well)."""

    tile_metadata: Any
    num_splits: torch.Tensor | None


class Scheduler:
    """Plans each decode batch. Under full CUDA graphs the fp8 plan is copied into buffers made
    once here, the ones the captured kernel reads when the graph replays."""

    def __init__(self, heads: int, kv_fp8: bool, graph_buffers: tuple[int, int] | None, device: torch.device):
        """``graph_buffers``: (SM count, most requests per batch) under full CUDA graphs, else None."""
        self.heads = heads
        self.kv_fp8 = kv_fp8
        self.tile_buffer = self.splits_buffer = None
        if kv_fp8 and graph_buffers is not None:
            sms, max_requests = graph_buffers
            self.tile_buffer = torch.zeros(sms, TILE_METADATA_WIDTH, dtype=torch.int32, device=device)
            self.splits_buffer = torch.zeros(max_requests + 1, dtype=torch.int32, device=device)

    def __call__(self, seq_lens: torch.Tensor, q_len: int) -> Schedule:
        from vllm.v1.attention.ops import flashmla as ops

        query_rows = q_len * self.heads  # one KV head: every query row of a request shares it
        if not self.kv_fp8:
            plan, _ = ops.get_mla_metadata(seq_lens, query_rows, 1, is_fp8_kvcache=False)
            return Schedule(plan, None)
        tiles, splits = ops.get_mla_metadata_dense_fp8(seq_lens, query_rows, 1)
        if self.tile_buffer is not None and self.splits_buffer is not None:
            tiles = _into(self.tile_buffer, tiles)
            splits = _into(self.splits_buffer, splits)
        return Schedule(tiles, splits)


def _into(buffer: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    if values.shape[0] > buffer.shape[0]:
        raise RuntimeError(f"FlashMLA plan of {values.shape[0]} rows exceeds its graph buffer of {buffer.shape[0]}")
    buffer[: values.shape[0]].copy_(values)
    return buffer[: values.shape[0]]


def _one_element(scale: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """An FP8 descale as FlashMLA takes it: a one-element fp32 tensor (1 where none is given)."""
    return scale.reshape(1) if scale is not None else torch.ones(1, dtype=torch.float32, device=device)


def decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    schedule: Schedule,
    softmax_scale: float,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    kv_lora_rank: int = 512,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query [requests, q_len, H, 576] (fp8 with the descales, or bf16), kv_cache [pages, 64, 576]
    -> out [requests * q_len, H, kv_lora_rank], lse [requests * q_len, H]."""
    from vllm.v1.attention.ops import flashmla as ops

    requests, q_len, heads, _ = query.shape
    common = dict(
        q=query,
        k_cache=kv_cache.unsqueeze(-2),  # FlashMLA's one KV head
        block_table=block_table,
        cache_seqlens=seq_lens,
        head_dim_v=kv_lora_rank,
        tile_scheduler_metadata=schedule.tile_metadata,
        softmax_scale=softmax_scale,
        causal=True,
    )
    if schedule.num_splits is None:
        out, lse = ops.flash_mla_with_kvcache(**common, is_fp8_kvcache=False)
    else:
        descale_q, descale_k = (_one_element(scale, query.device) for scale in (q_descale, k_descale))
        out, lse = ops.flash_mla_with_kvcache_fp8(
            **common, num_splits=schedule.num_splits, descale_q=descale_q, descale_k=descale_k
        )
    tokens = requests * q_len
    # FlashMLA's LSE is [requests, H, q_len]; ours (and what DCP merges) is [tokens, H].
    return out.reshape(tokens, heads, kv_lora_rank), lse.permute(0, 2, 1).reshape(tokens, heads)
