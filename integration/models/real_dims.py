"""DeepSeek-V3's real attention dimensions as a config-only checkpoint (the speed run:
integration/real_dims.py).

A few decoder layers at DeepSeek-V3's sizes (hidden 7168, q_lora_rank 1536, kv_lora_rank 512, rope 64,
nope 128, v 128, vocabulary 129280), with 128 heads or 16 (a GPU's share under TP8). Dense MLPs
(intermediate 18432) stand in for MoE, which never reaches the attention backend. Weights are vLLM's
dummy initialisation (``load_format="dummy"``): speed only.
"""

from __future__ import annotations

from pathlib import Path

LAYERS = 4
REAL_DIMS = dict(
    vocab_size=129280,
    hidden_size=7168,
    intermediate_size=18432,
    num_hidden_layers=LAYERS,
    first_k_dense_replace=LAYERS,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    n_routed_experts=256,
    num_experts_per_tok=8,
    num_nextn_predict_layers=0,
    max_position_embeddings=32768,
    rope_scaling=None,
    tie_word_embeddings=False,
)


def save_config(path: Path, heads: int) -> str:
    """A config-only checkpoint (weights come from load_format="dummy")."""
    from transformers import DeepseekV3Config

    # Without a model class named, vLLM takes a config-only checkpoint for a pooling model.
    config = DeepseekV3Config(**REAL_DIMS, num_attention_heads=heads, num_key_value_heads=heads)
    config.architectures = ["DeepseekV3ForCausalLM"]
    config.save_pretrained(path)
    return str(path)
