"""Collection rules and fixtures shared by the test files."""

import importlib.util
import os
import sys

import pytest
import torch
from hypothesis import settings

# The SGLang adapter's tests need SGLang, which cannot share an environment with vLLM 0.26: CI runs
# them in a stage of their own (-m sglang), where a missing SGLang leaves nothing to collect and fails.
collect_ignore = [] if importlib.util.find_spec("sglang") else ["test_sglang_plugin.py"]

# Hypothesis profiles (property_budget.examples reads them): "quick", the README's test command, draws
# fewer of a property test's examples; "ci" (HYPOTHESIS_PROFILE=ci, as .ci/run sets it) all of them.
settings.register_profile("quick")
settings.register_profile("ci")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


@pytest.fixture(autouse=True)
def vllm_inspects_model_classes_here(monkeypatch):
    """vLLM reads what a model class supports (its ModelInfo) in a fresh Python process, so as not to
    initialise CUDA in the caller, then caches it per vLLM install: the first time, 10-30 s per
    architecture on two cores, which the zoo's tests pay for some 20. Without a GPU there is no CUDA
    to keep clean: the class is inspected in this process, the same ModelInfo in a fraction of that."""
    registry = sys.modules.get("vllm.model_executor.models.registry")
    if registry is not None and hasattr(registry, "_run_in_subprocess") and not torch.cuda.is_available():
        monkeypatch.setattr(registry, "_run_in_subprocess", lambda inspect: inspect())
