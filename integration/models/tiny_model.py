"""The seeded tiny DeepSeek-V3 of the end-to-end runs: the demo's model (mla_backend.tools.demo_model)
with what the runs add to it, and the helpers the zoo's checkpoints share.

``dense_layers`` makes the later layers route over experts instead (expert parallelism needs experts
to split). With ``mtp_layers=1`` the checkpoint also holds DeepSeek-V3's multi-token-prediction layer,
as the released checkpoints do: ``model.layers.{N}`` (N = num_hidden_layers) is a full decoder layer
plus ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.{norm,head}`` and its own ``embed_tokens``, and
``num_nextn_predict_layers`` in the config. transformers does not model that layer; vLLM's
``deepseek_mtp`` speculative method serves it.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from mla_backend.tools.demo_model import DEMO_MODEL_SETTINGS, demo_model_settings, save_deepseek_v3

TINY_DEFAULTS = DEMO_MODEL_SETTINGS  # the demo's model is the runs' tiny model without their additions


def save_tiny_deepseek_v3(
    path: str | Path,
    heads: int = 16,
    seed: int = 0,
    mtp_layers: int = 0,
    mtp_moe: bool = False,
    dense_layers: int | None = None,
    **overrides,
) -> Path:
    """Write a bf16 DeepSeek-V3 checkpoint with ``heads`` attention heads to ``path`` (reused if present).
    ``mtp_moe``: the MTP layers route over experts, as the released ones do (SGLang builds its NextN
    layer as one whatever the config says); else they are dense like the decoder layers.
    ``dense_layers``: only the first this many decoder layers are dense, the later ones (and any MTP
    layers) route over ``n_routed_experts`` experts, which needs the engine's MoE kernels; None: all dense."""
    settings = demo_model_settings(heads, **overrides)
    # Layers before first_k_dense_replace are dense: every decoder layer unless dense_layers, and the
    # MTP layers (indexed after them) too unless mtp_moe.
    all_dense = settings["num_hidden_layers"] + (0 if mtp_moe else mtp_layers)
    settings["first_k_dense_replace"] = all_dense if dense_layers is None else dense_layers
    settings["num_nextn_predict_layers"] = mtp_layers

    def add_mtp(saved: Path) -> None:
        add_mtp_layers(saved, settings, mtp_layers, seed)

    return save_deepseek_v3(path, settings, seed, edit=add_mtp if mtp_layers else None)


def deeper_deepseek_v3(settings: dict) -> torch.nn.Module:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    return DeepseekV3ForCausalLM(DeepseekV3Config(**settings))


@contextlib.contextmanager
def edited_weights(path: Path) -> Iterator[dict[str, torch.Tensor]]:
    """The tensors of the saved checkpoint's one shard (one at these sizes), written back as the block
    leaves them (not where it raises)."""
    from safetensors.torch import load_file, save_file

    (weights_file,) = path.glob("*.safetensors")
    tensors = load_file(weights_file)
    yield tensors
    save_file(tensors, weights_file, metadata={"format": "pt"})


def add_mtp_layers(path: Path, settings: dict, count: int, seed: int, deeper_model=deeper_deepseek_v3) -> None:
    """Append seeded MTP layers to the saved checkpoint. Their decoder blocks come from a deeper model
    of the same config (``deeper_model(settings)``, the family's transformers class; so they are
    initialised as the decoder layers are); the MTP projections use the same wide normal init, the
    norms start at one as RMSNorm's do. DeepSeek-V3's layout, which GLM-4.7-Flash's checkpoints share."""
    from safetensors.torch import load_file

    layers = settings["num_hidden_layers"]
    torch.manual_seed(seed + 1)
    deeper = deeper_model({**settings, "num_hidden_layers": layers + count}).to(torch.bfloat16)
    # Saved and read back: the checkpoint's names (transformers fuses experts in memory, not on disk).
    with tempfile.TemporaryDirectory() as scratch:
        deeper.save_pretrained(scratch)
        deeper_state = {k: v for f in sorted(Path(scratch).glob("*.safetensors")) for k, v in load_file(f).items()}
    hidden, std = settings["hidden_size"], settings["initializer_range"]
    with edited_weights(path) as tensors:
        for index in range(layers, layers + count):
            prefix = f"model.layers.{index}."
            tensors.update({k: v.contiguous() for k, v in deeper_state.items() if k.startswith(prefix)})
            tensors[prefix + "enorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
            tensors[prefix + "hnorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
            tensors[prefix + "eh_proj.weight"] = (torch.randn(hidden, 2 * hidden) * std).to(torch.bfloat16)
            tensors[prefix + "shared_head.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
            tensors[prefix + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
            tensors[prefix + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
