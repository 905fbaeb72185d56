"""A small, seeded DeepSeek-V3 checkpoint for the demo and the end-to-end runs (needs transformers).

Real MLA shapes (kv_lora_rank 512, rope 64, nope 128, q_lora) with only dense layers
(first_k_dense_replace = num_hidden_layers), so no MoE kernel is needed. Weights use a wide
normal init: with the usual 0.02, attention is nearly uniform and hides decode errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

TINY_DEFAULTS = dict(
    vocab_size=2048,
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=2,
    q_lora_rank=384,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    max_position_embeddings=8192,
    initializer_range=0.1,
    rope_scaling=None,
    tie_word_embeddings=False,
)


def save_tiny_deepseek_v3(path: str | Path, heads: int = 16, seed: int = 0, **overrides) -> Path:
    """Write a bf16 DeepSeek-V3 checkpoint with ``heads`` attention heads to ``path`` (reused if present)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    path = Path(path)
    settings = {**TINY_DEFAULTS, "num_attention_heads": heads, "num_key_value_heads": heads, **overrides}
    settings["first_k_dense_replace"] = settings["num_hidden_layers"]
    stamp = {"seed": seed, **settings}
    if (path / "mla_backend_stamp.json").exists() and json.loads(
        (path / "mla_backend_stamp.json").read_text()
    ) == stamp:
        return path
    torch.manual_seed(seed)
    config = DeepseekV3Config(**settings)
    model = DeepseekV3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    (path / "mla_backend_stamp.json").write_text(json.dumps(stamp))
    return path
