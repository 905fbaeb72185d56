"""Collection rules and fixtures shared by the test files, and the kernel library for the tests that read it
on CPU."""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

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


LIBRARY_ARCH = "sm_90a"  # any built architecture registers the same ops; the formulas need no GPU


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """A test that needs the kernel library (the kernel_library fixture) is a build test."""
    for item in items:
        if "kernel_library" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.build)


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory) -> Path:
    """One build cache for the session: test_build.py's builds and the kernel_library's share it."""
    return tmp_path_factory.mktemp("mla_cache")


@pytest.fixture(scope="session")
def kernel_library(kernel_cache) -> Path:
    """The sm_90a kernel library, loaded into this process (torch.ops.mla_backend.*): the installed
    wheel's where it ships one built from these sources, else built with `python -m mla_backend build`
    into MLA_BACKEND_CACHE_DIR where set, else the session's cache (reusing test_build.py's build when
    that ran first). The scheduling ops run on any machine; one process holds one library, so these
    tests run apart from the GPU ones."""
    from mla_backend.jit import build_dir, prebuilt_library
    from mla_backend.kernel_build import library_filename

    library = prebuilt_library(LIBRARY_ARCH)
    if library is None:
        start = time.perf_counter()
        # A cached build is stamped with its sources: one in the configured cache is these sources'.
        cache = os.environ.get("MLA_BACKEND_CACHE_DIR") or str(kernel_cache)
        env = dict(os.environ, MLA_BACKEND_CACHE_DIR=cache)
        env.pop("NVCC_APPEND_FLAGS", None)
        env.pop("NVCC_PREPEND_FLAGS", None)
        command = [sys.executable, "-m", "mla_backend", "build", "--arch", LIBRARY_ARCH]
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"build failed:\n{result.stdout}\n{result.stderr[-4000:]}"
        library = build_dir(LIBRARY_ARCH, cache) / library_filename(LIBRARY_ARCH)
        print(f"\nkernel_library: {LIBRARY_ARCH} ready in {time.perf_counter() - start:.1f} s")
    torch.ops.load_library(str(library))
    return library


# The test modules that import vLLM as they load (each marked vllm throughout). Where vLLM is not
# installed (CI's torch-newest stage: no vLLM release takes that torch) each stands as one test marked
# vllm that fails saying why: -m "not vllm" deselects it with vLLM's other tests, and a run that does
# not deselect them fails rather than passing without them.
VLLM_MODULES = {"test_vllm_plugin.py", "test_vllm_sparse_backend.py", "test_engine_best.py", "test_model_zoo_cpu.py"}


class NeedsVllm(pytest.Item):
    def runtest(self):
        pytest.fail(f"{self.path.name} needs vLLM, which is not installed: deselect vLLM's tests with -m 'not vllm'")

    def reportinfo(self):
        return self.path, None, f"{self.path.name}: needs vLLM"


class VllmModuleWithoutVllm(pytest.File):
    def collect(self):
        item = NeedsVllm.from_parent(self, name="needs_vllm")
        item.add_marker(pytest.mark.vllm)
        return [item]


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name in VLLM_MODULES and importlib.util.find_spec("vllm") is None:
        return VllmModuleWithoutVllm.from_parent(parent, path=module_path)
    return None
