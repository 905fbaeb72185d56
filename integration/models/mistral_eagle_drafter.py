"""A seeded Eagle drafter for the zoo's Mistral Large 3 checkpoint, in Mistral's format as
``mistralai/Mistral-Large-3-675B-Instruct-2512-Eagle`` is released (published_configs.json,
``eagle_drafter``): params.json is the target's with ``n_layers`` of the drafter's own, and
consolidated.safetensors holds decoder layers under Mistral's names, ``eagle_linear`` (the fusion of
the token's embedding with the target's hidden state, 2 x dim -> dim) and ``norm``; embedding and
output are the target's, shared by the engine. vLLM 0.26 turns a MistralLarge3ForCausalLM drafter
into EagleMistralLarge3ForCausalLM (DeepSeek-V2 decoder layers: MLA with the target's attention
fields), SGLang 0.5.17 into MistralLarge3ForCausalLMEagle; both map ``eagle_linear`` to ``model.fc``.

The released drafter's one layer is an MoE layer; here it is dense, as every layer of the zoo's
checkpoints is (checkpoints.py: MoE never reaches the attention backend).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from .eagle3_drafter import save_seeded_weights
from .families import SMALL, published

WEIGHTS = "consolidated.safetensors"


def drafter_params(target: dict) -> dict:
    """The drafter's params.json from the target's: its own layer count, every layer dense."""
    layers = published("Mistral-Large-3")["eagle_drafter"]["n_layers"]
    params = copy.deepcopy(target)
    params["n_layers"] = layers
    params["moe"]["first_k_dense_replace"] = layers
    return params


def drafter_shapes(target_weights: dict[str, tuple[int, ...]], params: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor the drafter holds, by Mistral's name: each of its layers shaped as the target's
    first (dense) layer, the fusion and the final norm."""
    dim = params["dim"]
    first = {n.removeprefix("layers.0."): shape for n, shape in target_weights.items() if n.startswith("layers.0.")}
    shapes = {f"layers.{i}.{name}": shape for i in range(params["n_layers"]) for name, shape in first.items()}
    return shapes | {"eagle_linear.weight": (dim, 2 * dim), "norm.weight": (dim,)}


def save_mistral_eagle_drafter(target_dir: str | Path, path: str | Path, seed: int = 0) -> Path:
    """Write the drafter of the Mistral-format checkpoint in ``target_dir`` to ``path`` (reused if the
    same target and seed wrote it): norms at one, every other weight normal with the zoo's init scale."""
    from safetensors import safe_open

    target_dir, path = Path(target_dir), Path(path)
    params = drafter_params(json.loads((target_dir / "params.json").read_text()))
    stamp = {"seed": seed, **params}
    stamp_file = path / "mla_backend_stamp.json"
    if stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp:
        return path
    with safe_open(str(target_dir / WEIGHTS), "pt") as weights:
        target_weights = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}  # noqa: SIM118
    path.mkdir(parents=True, exist_ok=True)
    save_seeded_weights(drafter_shapes(target_weights, params), SMALL["initializer_range"], seed + 3, path / WEIGHTS)
    (path / "params.json").write_text(json.dumps(params, indent=1))
    stamp_file.write_text(json.dumps(stamp))
    return path
