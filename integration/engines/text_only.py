"""Whether a checkpoint is a multimodal wrapper (config.json with a vision_config: the zoo's Kimi-VL).
The checks' prompts are token ids, so the engines run such a checkpoint on its text model alone: vLLM with
language_model_only, SGLang with enable_multimodal off (no image processor, which the checkpoint
does not ship)."""

from __future__ import annotations

import json
from pathlib import Path


def has_vision_tower(model: str) -> bool:
    config = Path(model) / "config.json"
    return config.is_file() and "vision_config" in json.loads(config.read_text())
