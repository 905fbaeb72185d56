"""A directory that, put on PYTHONPATH, makes an engine load a test-only entry point in each of its
processes (the engines' own plugin mechanism: their workers run where the test cannot wrap code)."""

from __future__ import annotations

from pathlib import Path


def entry_point_dir(root: Path, group: str, name: str, target: str) -> Path:
    """Write a minimal installed distribution under ``root`` declaring ``name = target`` in ``group``."""
    info = root / f"{name}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {target}\n")
    return root
