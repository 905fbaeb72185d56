"""Kimi-VL's vision tower (MoonViT) and projector for the zoo's checkpoint, seeded, under the tensor
names its released checkpoints use: vLLM's kimi_vl / moonvit classes load them as named (wqkv, wo,
mlp.fc0/fc1, norm0/norm1, patch_embed, multi_modal_projector), SGLang 0.5.17's renames wqkv and wo to
its VisionAttention's attn.qkv_proj and attn.proj (models/kimi_vl.py, load_weights). The tower is
shrunk as the text model is (families.KIMI_VL_VISION): it never reaches the MLA backend, and the zoo's
prompts are text, but an engine that builds the tower loads every weight of it.
"""

from __future__ import annotations

import math

import torch


def vision_weights(vision: dict, text_hidden: int, std: float, seed: int) -> dict[str, torch.Tensor]:
    """The tower's and the projector's tensors for ``vision`` (config.json's vision_config), in bf16."""
    hidden, inner, patch = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"]
    merged = hidden * math.prod(vision["merge_kernel_size"])  # the projector reads 2 x 2 patches at once
    grid = (vision["init_pos_emb_height"], vision["init_pos_emb_width"])
    shapes = {
        "vision_tower.patch_embed.proj.weight": (hidden, 3, patch, patch),
        "vision_tower.patch_embed.proj.bias": (hidden,),
        "vision_tower.patch_embed.pos_emb.weight": (*grid, hidden),
        "vision_tower.encoder.final_layernorm.weight": (hidden,),
        "vision_tower.encoder.final_layernorm.bias": (hidden,),
        "multi_modal_projector.pre_norm.weight": (hidden,),
        "multi_modal_projector.pre_norm.bias": (hidden,),
        "multi_modal_projector.linear_1.weight": (merged, merged),
        "multi_modal_projector.linear_1.bias": (merged,),
        "multi_modal_projector.linear_2.weight": (text_hidden, merged),
        "multi_modal_projector.linear_2.bias": (text_hidden,),
    }
    for block in range(vision["num_hidden_layers"]):
        prefix = f"vision_tower.encoder.blocks.{block}"
        for norm in ("norm0", "norm1"):
            shapes[f"{prefix}.{norm}.weight"] = shapes[f"{prefix}.{norm}.bias"] = (hidden,)
        shapes |= {
            f"{prefix}.wqkv.weight": (3 * hidden, hidden),
            f"{prefix}.wqkv.bias": (3 * hidden,),
            f"{prefix}.wo.weight": (hidden, hidden),
            f"{prefix}.wo.bias": (hidden,),
            f"{prefix}.mlp.fc0.weight": (inner, hidden),
            f"{prefix}.mlp.fc0.bias": (inner,),
            f"{prefix}.mlp.fc1.weight": (hidden, inner),
            f"{prefix}.mlp.fc1.bias": (hidden,),
        }
    generator = torch.Generator().manual_seed(seed + 2)
    weights = {}
    for name, shape in sorted(shapes.items()):
        if "norm" in name:  # layer norms start as the identity, as torch's do
            weights[name] = (torch.ones if name.endswith("weight") else torch.zeros)(shape)
        else:
            weights[name] = torch.randn(shape, generator=generator) * std
    return {name: tensor.to(torch.bfloat16) for name, tensor in weights.items()}
