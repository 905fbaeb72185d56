"""A directory that, put on PYTHONPATH, makes an engine load a test-only entry point in each of its
processes (the engines' own plugin mechanism: their workers run where the test cannot wrap code)."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # this checkout's integration/, where the entry points live


def entry_point_dir(root: Path, group: str, name: str, target: str) -> Path:
    """Write a minimal installed distribution under ``root`` declaring ``name = target`` in ``group``,
    and a link to this checkout's ``integration`` package, where ``target`` is found: on the path,
    the directory alone lets a process load the entry point, and adds no other package of the
    checkout (an installed mla_backend stays the one imported)."""
    info = root / f"{name}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {target}\n")
    link = root / PACKAGE.name
    link.unlink(missing_ok=True)
    link.symlink_to(PACKAGE, target_is_directory=True)
    return root


def path_with(directory: Path | str, environ=os.environ) -> str:
    """A PYTHONPATH with ``directory`` first and ``environ``'s entries after it (no empty entry,
    which Python would read as the working directory)."""
    return os.pathsep.join(filter(None, [str(directory), environ.get("PYTHONPATH")]))
