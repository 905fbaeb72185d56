"""Limits the kernels and Python share, read from csrc/kernel_limits.h, where they are written once.

Standard library only: the config, at the bottom of the package, takes MAX_KV_SPLITS from here.
"""

from __future__ import annotations

import re
from pathlib import Path

HEADER = "kernel_limits.h"


def csrc_dir() -> Path:
    """Sources ship inside the wheel as mla_backend/csrc; a source checkout keeps them in ../csrc."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "csrc", here.parent / "csrc"):
        if (candidate / HEADER).is_file():
            return candidate
    raise FileNotFoundError(f"CUDA sources not found next to {here}")


def read_limits(header: Path) -> dict[str, int]:
    """{NAME: value} of the header's ``#define MLA_NAME <integer>`` lines."""
    return {name: int(value) for name, value in re.findall(r"^#define MLA_(\w+) (\d+)\b", header.read_text(), re.M)}


_LIMITS = read_limits(csrc_dir() / HEADER)
MAX_KV_SPLITS: int = _LIMITS["MAX_KV_SPLITS"]
TOKENS_PER_TILE: int = _LIMITS["TOKENS_PER_TILE"]
