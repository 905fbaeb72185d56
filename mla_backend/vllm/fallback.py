"""The portable route: vLLM's own Triton MLA decode (``decode_attention_fwd``), for GPUs the
bundled kernels do not serve. Same inputs and outputs as TRITON_MLA's ``forward_mqa``, plus
uniform multi-token queries (speculative decoding), which that kernel does not take directly."""

from __future__ import annotations

import torch
from vllm.v1.attention.backends.mla.triton_mla import _compute_num_kv_splits
from vllm.v1.attention.ops.triton_decode_attention import decode_attention_fwd
from vllm.v1.worker.workspace import current_workspace_manager, is_workspace_manager_initialized


def logits_shape(tokens: int, heads: int, max_seq_len: int, sm_count: int, kv_lora_rank: int):
    """Shape of the split-KV scratch decode_attention_fwd needs (the +1 holds each split's LSE)."""
    return (tokens, heads, _compute_num_kv_splits(max_seq_len, sm_count), kv_lora_rank + 1)


def reserve_workspace(max_tokens: int, heads: int, max_model_len: int, sm_count: int, kv_lora_rank: int) -> None:
    """Size vLLM's shared workspace for the worst case before it is locked (as TRITON_MLA does)."""
    if is_workspace_manager_initialized():
        shape = logits_shape(max_tokens, heads, max_model_len, sm_count, kv_lora_rank)
        current_workspace_manager().get_simultaneous((shape, torch.float32))


def per_token_requests(block_table: torch.Tensor, seq_lens: torch.Tensor, q_len: int):
    """Rows for q_len query tokens per request: token i of a request sees seq_len - q_len + i + 1 keys.

    decode_attention_fwd takes one query token per request, so each token becomes its own request
    over the same pages. Device ops only: safe inside a CUDA graph."""
    offsets = torch.arange(1 - q_len, 1, device=seq_lens.device, dtype=seq_lens.dtype)
    token_lens = (seq_lens[:, None] + offsets).clamp_min(0).reshape(-1)
    rows = block_table.repeat_interleave(q_len, dim=0, output_size=block_table.shape[0] * q_len)
    return rows, token_lens


def triton_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    q_len: int,
    sm_scale: float,
    k_scale: torch.Tensor,
    sm_count: int,
    kv_lora_rank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [tokens, H, 576] bf16 (tokens = requests x q_len) -> (out [tokens, H, 512], lse [tokens, H] float32).

    The LSE is kept in float32 (TRITON_MLA keeps it in the query's dtype): decode context parallelism
    weighs each rank's part by it, and bf16 rounds an LSE of 30 by up to 0.06 nats."""
    tokens, heads, _ = q.shape
    if q_len > 1:
        block_table, seq_lens = per_token_requests(block_table, seq_lens, q_len)
    out = torch.zeros(tokens, heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    lse = torch.zeros(tokens, heads, dtype=torch.float32, device=q.device)
    shape = logits_shape(tokens, heads, max_seq_len, sm_count, kv_lora_rank)
    if is_workspace_manager_initialized():
        (attn_logits,) = current_workspace_manager().get_simultaneous((shape, torch.float32))
    else:
        attn_logits = torch.empty(shape, dtype=torch.float32, device=q.device)
    cache = kv_cache.unsqueeze(2)  # [pages, page_size, 1 kv head, 576]
    decode_attention_fwd(
        q,
        cache,
        cache[..., :kv_lora_rank],
        out,
        lse,
        block_table,
        seq_lens,
        attn_logits,
        shape[2],
        sm_scale,
        cache.size(1),
        k_scale=k_scale,
        v_scale=k_scale,
        is_mla=True,
    )
    return out, lse
