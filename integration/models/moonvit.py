"""The MoonViT vision tower and projector of the zoo's Kimi wrappers (Kimi-VL, Kimi-K2.5), seeded, under
the tensor names their released checkpoints use (published_configs.json): the tower's blocks (wqkv, wo,
mlp.fc0/fc1, norm0/norm1), patch_embed and final_layernorm alike in both; the projector Kimi-VL's
multi_modal_projector.{pre_norm,linear_1,linear_2} and Kimi-K2.5's mm_projector.{pre_norm,proj.0,proj.2}.
vLLM's kimi_vl / kimi_k25 classes load them as named; SGLang 0.5.17 renames wqkv and wo to its
VisionAttention's attn.qkv_proj and attn.proj. The tower is shrunk as the text model is
(families.KIMI_VL_VISION, KIMI_K25_VISION): it never reaches the MLA backend, and the zoo's prompts are
text, but an engine that builds the tower loads every weight of it.
"""

from __future__ import annotations

import math

import torch

# The projector's norm and two linears, by the wrapper's model_type.
PROJECTORS = {
    "kimi_vl": ("multi_modal_projector.pre_norm", "multi_modal_projector.linear_1", "multi_modal_projector.linear_2"),
    "kimi_k25": ("mm_projector.pre_norm", "mm_projector.proj.0", "mm_projector.proj.2"),
}


def tower_sizes(vision: dict) -> tuple[int, int, int]:
    """(width, MLP width, blocks) of the tower: Kimi-K2.5's config names them vt_*, Kimi-VL's not."""
    if "vt_hidden_size" in vision:
        return vision["vt_hidden_size"], vision["vt_intermediate_size"], vision["vt_num_hidden_layers"]
    return vision["hidden_size"], vision["intermediate_size"], vision["num_hidden_layers"]


def vision_weights(model_type: str, vision: dict, text_hidden: int, std: float, seed: int) -> dict[str, torch.Tensor]:
    """The tower's and the projector's tensors for ``vision`` (config.json's vision_config), in bf16."""
    hidden, inner, blocks = tower_sizes(vision)
    patch = vision["patch_size"]
    merged = hidden * math.prod(vision["merge_kernel_size"])  # the projector reads 2 x 2 patches at once
    grid = (vision["init_pos_emb_height"], vision["init_pos_emb_width"])
    norm, first, second = PROJECTORS[model_type]
    shapes = {
        "vision_tower.patch_embed.proj.weight": (hidden, 3, patch, patch),
        "vision_tower.patch_embed.proj.bias": (hidden,),
        "vision_tower.patch_embed.pos_emb.weight": (*grid, hidden),
        "vision_tower.encoder.final_layernorm.weight": (hidden,),
        "vision_tower.encoder.final_layernorm.bias": (hidden,),
        f"{norm}.weight": (hidden,),
        f"{norm}.bias": (hidden,),
        f"{first}.weight": (merged, merged),
        f"{first}.bias": (merged,),
        f"{second}.weight": (text_hidden, merged),
        f"{second}.bias": (text_hidden,),
    }
    for block in range(blocks):
        prefix = f"vision_tower.encoder.blocks.{block}"
        for block_norm in ("norm0", "norm1"):
            shapes[f"{prefix}.{block_norm}.weight"] = shapes[f"{prefix}.{block_norm}.bias"] = (hidden,)
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
