"""`auto` never slower than the engine's best on SM90: where vLLM's FlashMLA decodes a shape class
faster than the bundled kernels, our backend serves decode with it.

The shape class is what one engine decodes all its life: query heads per GPU (times the decode
context parallel size, which all-gathers them), query tokens per request (1 + speculative tokens),
page size and KV dtype. The choice comes from ``sm90_routes.json``, written by
``python -m mla_backend bench --route-table --write`` (both kernels in one process, CUDA-graph
replay, KV beyond L2; FlashMLA's output checked against the float64 reference at each class). A class
the table does not hold within a factor of two of its heads and query tokens stays on ours.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..config import MLABackendConfig, Resolution
from . import flashmla

ROUTE_TABLE = Path(__file__).with_name("sm90_routes.json")
NEAREST_FACTOR = 2.0  # a class borrows the measurement of the nearest one measured, at most this far


@dataclass(frozen=True)
class ShapeClass:
    heads: int  # query heads per GPU, after decode context parallelism gathers them
    q_len: int
    page_size: int
    kv_fp8: bool
    dcp: int = 1  # decode context parallel size

    def describe(self) -> str:
        kv = "fp8" if self.kv_fp8 else "bf16"
        gathered = f" (gathered over DCP {self.dcp})" if self.dcp > 1 else ""
        return f"{self.heads} heads{gathered}, {self.q_len} query tokens, page {self.page_size}, {kv} KV"


@dataclass(frozen=True)
class EngineBest:
    use_flashmla: bool
    reason: str
    candidate: bool = True  # FlashMLA was weighed (auto, bundled kernels, SM90): worth a log line


@functools.cache
def load_table(path: Path = ROUTE_TABLE) -> dict:
    return json.loads(path.read_text())


def nearest(entries: list[dict], shape: ShapeClass) -> dict | None:
    """The measured class closest to ``shape`` (log distance in heads, then query tokens), or None
    when none lies within NEAREST_FACTOR in both."""
    kv = "fp8" if shape.kv_fp8 else "bf16"

    def distance(entry: dict) -> tuple[float, float]:
        return (abs(math.log2(entry["heads"] / shape.heads)), abs(math.log2(entry["q_len"] / shape.q_len)))

    limit = math.log2(NEAREST_FACTOR)
    close = [e for e in entries if e["kv"] == kv and max(distance(e)) <= limit]
    return min(close, key=distance) if close else None


def routes_to_flashmla(entry: dict) -> bool:
    """A measured class goes to FlashMLA: its output passed the float64 check and it is faster."""
    return entry["flashmla_correct"] and entry["speedup"] > 1.0


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


def choose(
    config: MLABackendConfig,
    route: Resolution,
    capability: tuple[int, int],
    shape: ShapeClass,
    available: tuple[bool, str | None] | None = None,
    table: dict | None = None,
) -> EngineBest:
    """Whether FlashMLA serves this engine's decode instead of the bundled kernels, and why."""
    if config.backend != "auto":
        return EngineBest(False, f"backend='{config.backend}' set", candidate=False)
    if route.kernel != "bundled":
        return EngineBest(False, f"decode runs {route.kernel}", candidate=False)
    if capability[0] != 9:
        return EngineBest(False, "FlashMLA's dense decode is SM90's", candidate=False)
    if shape.page_size != flashmla.PAGE_SIZE:
        pages = f"FlashMLA reads pages of {flashmla.PAGE_SIZE} tokens, the cache has {shape.page_size}"
        return EngineBest(False, pages)
    ok, why = available if available is not None else flashmla.available()
    if not ok:
        return EngineBest(False, f"vLLM's FlashMLA is unavailable: {why}")
    if table is None:
        if not ROUTE_TABLE.exists():
            return EngineBest(False, f"no route table at {ROUTE_TABLE}")
        table = load_table()
    entry = nearest(table["entries"], shape)
    where = f"{table['device']}, {table['date']}"
    if entry is None:
        return EngineBest(False, f"no measurement near {shape.describe()} ({where})")
    measured = f"measured at {entry['heads']} heads, {entry['q_len']} query tokens on {where}"
    if not entry["flashmla_correct"]:
        return EngineBest(False, f"FlashMLA's output failed the float64 check ({measured})")
    speedup = entry["speedup"]
    if speedup <= 1.0:
        return EngineBest(False, f"the bundled kernels are {1 / speedup:.2f}x FlashMLA's speed ({measured})")
    return EngineBest(True, f"FlashMLA is {speedup:.2f}x the bundled kernels' speed ({measured})")
