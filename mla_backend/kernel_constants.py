"""Constants the kernels and Python share, read from csrc/constants.h, where they are written once.

Standard library only: the config and the shape checks, at the bottom of the package, take their
bounds from here, and setup.py loads it without torch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

HEADER = "constants.h"


class TileShape(NamedTuple):
    """One kernel tile built into the library: CTAs of 4 x row_groups warps, 16 x fragments rows each."""

    fp8: bool
    max_rows: int  # the largest problem (query tokens x heads) this entry is chosen for
    row_groups: int
    fragments: int


def csrc_dir() -> Path:
    """Sources ship inside the wheel as mla_backend/csrc; a source checkout keeps them in ../csrc."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "csrc", here.parent / "csrc"):
        if (candidate / HEADER).is_file():
            return candidate
    raise FileNotFoundError(f"CUDA sources not found next to {here}")


def _integer_defines(text: str) -> dict[str, int]:
    return {name: int(value) for name, value in re.findall(r"^#define MLA_(\w+) (\d+)\b", text, re.M)}


def read_constants(header: Path) -> dict[str, int]:
    """{NAME: value} of the header's ``#define MLA_NAME <integer>`` lines."""
    return _integer_defines(header.read_text())


def read_tile_shapes(header: Path) -> tuple[TileShape, ...]:
    """The entries of the header's MLA_TILE_SHAPES table, in order (names resolve to MLA_ constants)."""
    text = header.read_text()
    constants = _integer_defines(text)
    table = re.search(r"^#define MLA_TILE_SHAPES\(X\)((?:.*\\\n)*.*)$", text, re.M)
    if table is None:
        raise ValueError(f"{header.name} has no MLA_TILE_SHAPES table")

    def value(token: str) -> int:
        token = token.strip()
        return int(token) if token.isdigit() else constants[token.removeprefix("MLA_")]

    entries = re.findall(r"X\(([^)]*)\)", table.group(1))
    return tuple(
        TileShape(bool(value(f)), value(m), value(g), value(r)) for f, m, g, r in (e.split(",") for e in entries)
    )


_HEADER = csrc_dir() / HEADER
_CONSTANTS = read_constants(_HEADER)
LATENT_DIM: int = _CONSTANTS["LATENT_DIM"]
ROPE_DIM: int = _CONSTANTS["ROPE_DIM"]
MAX_ROWS: int = _CONSTANTS["MAX_ROWS"]
MAX_KV_SPLITS: int = _CONSTANTS["MAX_KV_SPLITS"]
TOKENS_PER_TILE: int = _CONSTANTS["TOKENS_PER_TILE"]
MAX_PAGE_SIZE: int = _CONSTANTS["MAX_PAGE_SIZE"]
MIN_TILES_PER_SPLIT: int = _CONSTANTS["MIN_TILES_PER_SPLIT"]
MAX_PLAN_PIECES: int = _CONSTANTS["MAX_PLAN_PIECES"]
PLAN_CUT_WAVES: int = _CONSTANTS["PLAN_CUT_WAVES"]
SPLITS_PER_MERGE_TILE: int = _CONSTANTS["SPLITS_PER_MERGE_TILE"]
FIXED_TILES_PER_CTA: int = _CONSTANTS["FIXED_TILES_PER_CTA"]
FEW_SPLITS_MAX: int = _CONSTANTS["FEW_SPLITS_MAX"]
PLAN_MIN_BATCH: int = _CONSTANTS["PLAN_MIN_BATCH"]
STEP_PLAN_MIN_BATCH: int = _CONSTANTS["STEP_PLAN_MIN_BATCH"]
DS_MLA_SCALE_OFFSET: int = _CONSTANTS["DS_MLA_SCALE_OFFSET"]
DS_MLA_ROPE_OFFSET: int = _CONSTANTS["DS_MLA_ROPE_OFFSET"]
DS_MLA_ROW_BYTES: int = _CONSTANTS["DS_MLA_ROW_BYTES"]
TILE_SHAPES: tuple[TileShape, ...] = read_tile_shapes(_HEADER)
