"""Patching a vLLM module when vLLM imports it (now, if it already has): the plugin's hooks cost
nothing in processes that never import what they patch."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType


def patch_when_imported(name: str, patch: Callable[[ModuleType], None]) -> None:
    """Run ``patch(module)`` on ``name`` now if it is imported, else right after its first import."""
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
    elif not any(isinstance(f, PatchOnImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, PatchOnImport(name, patch))


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after the module ``name`` is first executed, by wrapping
    ``exec_module`` on that module's own loader (the path finder makes one a module)."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, patch = spec.loader.exec_module, self.patch

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


__all__ = ["PatchOnImport", "patch_when_imported"]
