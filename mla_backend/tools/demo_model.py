"""The demo's model: a small, seeded DeepSeek-V3 checkpoint (needs transformers).

Real MLA shapes (kv_lora_rank 512, rope 64, nope 128, q_lora) with only dense layers
(first_k_dense_replace past the last layer), so no MoE kernel is needed. Weights use a wide normal
init: with the usual 0.02, attention is nearly uniform and hides decode errors.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

DEMO_MODEL_SETTINGS = dict(
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


def demo_model_settings(heads: int = 16, **overrides) -> dict:
    """The demo model's DeepseekV3Config fields with ``heads`` attention heads: every layer dense, no
    MTP layer (transformers' default of one would claim a layer the checkpoint lacks)."""
    settings = {**DEMO_MODEL_SETTINGS, "num_attention_heads": heads, "num_key_value_heads": heads, **overrides}
    return {**settings, "first_k_dense_replace": settings["num_hidden_layers"], "num_nextn_predict_layers": 0}


def save_deepseek_v3(
    path: str | Path, settings: dict, seed: int = 0, edit: Callable[[Path], None] | None = None
) -> Path:
    """Write a seeded bf16 DeepSeek-V3 checkpoint of ``settings`` to ``path``, reused where one of the
    same settings and seed is there. ``edit(path)`` changes the saved checkpoint before its stamp
    marks it complete (a run cut short in between leaves no stamp, so the next one writes it again)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    path = Path(path)
    stamp_file, stamp = path / "mla_backend_stamp.json", {"seed": seed, **settings}
    if stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp:
        return path
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**settings)).to(torch.bfloat16)
    model.save_pretrained(path)
    if edit is not None:
        edit(path)
    stamp_file.write_text(json.dumps(stamp))
    return path


def save_demo_model(path: str | Path, heads: int = 16) -> Path:
    """The demo's checkpoint with ``heads`` attention heads, written to ``path`` (reused if present)."""
    return save_deepseek_v3(path, demo_model_settings(heads))
