"""The measured table behind route.py's SM90 rule: where the engine's FlashMLA decodes a shape class
faster than the bundled kernels.

``sm90_routes.json`` is written by ``python -m mla_backend bench --route-table --write`` (both kernels
in one process, CUDA-graph replay, KV beyond L2; FlashMLA's output checked against the float64
reference at each class). A class the table does not hold within a factor of two of its heads and
query tokens stays on the bundled kernels.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

ROUTE_TABLE = Path(__file__).with_name("sm90_routes.json")
NEAREST_FACTOR = 2.0  # a class borrows the measurement of the nearest one measured, at most this far
FLASHMLA_PAGE_SIZE = 64  # the only page size FlashMLA's dense decode reads


@functools.cache
def load_table(path: Path = ROUTE_TABLE) -> dict:
    return json.loads(path.read_text())


def nearest(entries: list[dict], heads: int, q_len: int, kv_fp8: bool) -> dict | None:
    """The measured class closest to (heads, q_len) of the KV dtype (log distance in heads, then query
    tokens), or None when none lies within NEAREST_FACTOR in both."""
    kv = "fp8" if kv_fp8 else "bf16"

    def distance(entry: dict) -> tuple[float, float]:
        return (abs(math.log2(entry["heads"] / heads)), abs(math.log2(entry["q_len"] / q_len)))

    limit = math.log2(NEAREST_FACTOR)
    close = [e for e in entries if e["kv"] == kv and max(distance(e)) <= limit]
    return min(close, key=distance) if close else None


def routes_to_flashmla(entry: dict) -> bool:
    """A measured class goes to FlashMLA: its output passed the float64 check and it is faster."""
    return entry["flashmla_correct"] and entry["speedup"] > 1.0


def flashmla_verdict(heads: int, q_len: int, kv_fp8: bool, described: str) -> tuple[bool, str]:
    """(FlashMLA is faster for this class, why), from the shipped table; ``described`` names the class."""
    if not ROUTE_TABLE.exists():
        return False, f"no route table at {ROUTE_TABLE}"
    table = load_table()
    entry = nearest(table["entries"], heads, q_len, kv_fp8)
    where = f"{table['device']}, {table['date']}"
    if entry is None:
        return False, f"no measurement near {described} ({where})"
    measured = f"measured at {entry['heads']} heads, {entry['q_len']} query tokens on {where}"
    if not entry["flashmla_correct"]:
        return False, f"FlashMLA's output failed the float64 check ({measured})"
    speedup = entry["speedup"]
    if speedup <= 1.0:
        return False, f"the bundled kernels are {1 / speedup:.2f}x FlashMLA's speed ({measured})"
    return True, f"FlashMLA is {speedup:.2f}x the bundled kernels' speed ({measured})"


def summary(table: dict | None = None) -> str:
    """The classes the table hands to FlashMLA, per KV dtype and heads, for doctor."""
    table = table if table is not None else load_table()
    parts = []
    for kv in ("fp8", "bf16"):
        chosen = [e for e in table["entries"] if e["kv"] == kv and routes_to_flashmla(e)]
        by_heads: dict[int, list[int]] = {}
        for e in chosen:
            by_heads.setdefault(e["heads"], []).append(e["q_len"])
        classes = ", ".join(f"{h} heads q_len {'/'.join(map(str, sorted(q)))}" for h, q in sorted(by_heads.items()))
        parts.append(f"{kv}: {classes or 'none'}")
    return f"{'; '.join(parts)} (measured on {table['device']}, {table['date']})"
