"""Tests' view of the lent GPU's image, where FlashInfer and DeepGEMM are not installed."""

from __future__ import annotations

import importlib.util


def absent_packages(monkeypatch, absent=("flashinfer", "deep_gemm"), present=()) -> None:
    """importlib finds none of ``absent``, each of ``present`` (a spec of its own), every other package
    as it is."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        if name in present:
            return importlib.util.spec_from_loader(name, loader=None)
        return None if name in absent else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
