"""Kimi-Linear's small checkpoint, a hybrid of KDA (linear attention) and MLA layers
(families.KIMI_LINEAR_HYBRID), as vLLM 0.26 and SGLang 0.5.17 load it.

Not every transformers on the machines here has Kimi-Linear (SGLang 0.5.17's 5.12.1 has none), so
DeepSeek-V3's classes write the MLA layers and dense MLPs, under the names both engines' Kimi-Linear
loaders take (q_proj without q_lora, kv_a_proj_with_mqa, ...: vLLM models/kimi_linear.py load_weights,
SGLang models/kimi_linear.py:759), and each KDA layer's attention is then replaced by seeded KDA weights
under the released checkpoints' names (transformers' conversion_mapping "kimi_linear" names the same).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

TRANSFORMERS_TYPE = "deepseek_v3"  # the transformers classes that write the MLA layers and MLPs


def add_kda_layers(path: Path, config: dict, seed: int) -> None:
    """Replace the attention of each KDA layer by seeded KDA weights under the released checkpoints'
    names (models/kimi_linear.py:759, load_weights, maps them; transformers' conversion_mapping "kimi_linear"
    names the same), initialised as transformers' KimiLinear initialises them."""
    from integration.models.tiny_model import edited_weights

    linear = config["linear_attn_config"]
    gen = torch.Generator().manual_seed(seed + 2)
    with edited_weights(path) as tensors:
        for layer in (n - 1 for n in linear["kda_layers"]):
            prefix = f"model.layers.{layer}.self_attn."
            if prefix + "A_log" in tensors:
                continue  # written before
            for name in [n for n in tensors if n.startswith(prefix)]:
                del tensors[name]
            kda = seeded_kda(linear, config["hidden_size"], config["initializer_range"], gen)
            tensors.update({prefix + k: v.contiguous() for k, v in kda.items()})


def seeded_kda(linear: dict, hidden: int, std: float, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One KDA layer's attention weights, by their names under ``self_attn.``."""
    heads, head_dim = linear["num_heads"], linear["head_dim"]
    width = heads * head_dim

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)

    kda = {f"{p}_proj.weight": normal(width, hidden) for p in "qkv"}
    kda |= {"b_proj.weight": normal(heads, hidden), "o_proj.weight": normal(hidden, width)}
    kda |= {f"{g}_a_proj.weight": normal(head_dim, hidden) for g in "fg"}
    kda |= {f"{g}_b_proj.weight": normal(width, head_dim) for g in "fg"}
    bound = linear["short_conv_kernel_size"] ** -0.5  # torch's default init of a depthwise conv
    conv = [(torch.rand(width, 1, linear["short_conv_kernel_size"], generator=gen) * 2 - 1) * bound for _ in "qkv"]
    kda |= {f"{p}_conv1d.weight": c.to(torch.bfloat16) for p, c in zip("qkv", conv)}
    kda["A_log"] = (torch.rand(1, 1, heads, 1, generator=gen) * 15 + 1).log()  # decay rates in [1, 16]
    low, high = math.log(1e-3), math.log(0.1)
    dt = torch.exp(torch.rand(width, generator=gen) * (high - low) + low)
    kda["dt_bias"] = dt + torch.log(-torch.expm1(-dt))  # the inverse softplus of a step in [1e-3, 0.1]
    kda["o_norm.weight"] = torch.ones(head_dim, dtype=torch.bfloat16)
    return kda
