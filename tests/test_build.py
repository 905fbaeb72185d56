"""Ahead-of-time build of csrc/ for SM90 and SM120 on a machine without a GPU (the CI compile
check), with the properties the design depends on read off the machine code."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mla_backend.jit import build_dir, library_name

ARCHES = ("sm_90a", "sm_120a")


def cuda_tool(name: str) -> str:
    """cuobjdump/nvdisasm from PATH, CUDA_HOME or the nvidia-cuda-* wheels of the test extra."""
    import nvidia

    candidates = [shutil.which(name), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", name)]
    candidates += [str(Path(p) / "cu13" / "bin" / name) for p in nvidia.__path__]
    for path in candidates:
        if path and os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{name} not found: pip install nvidia-cuda-{name}")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("mla_cache")
    env = dict(os.environ, MLA_BACKEND_CACHE_DIR=str(cache))
    result = subprocess.run([sys.executable, "-m", "mla_backend", "build", "--arch", ",".join(ARCHES), "--strict"],
                            env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"build failed (spills count as failures):\n{result.stdout}\n{result.stderr[-4000:]}"
    return {arch: build_dir(arch, str(cache)) / f"{library_name(arch)}.so" for arch in ARCHES}


def sass(library: Path) -> str:
    env = dict(os.environ, NVDISASM_PATH=os.path.dirname(cuda_tool("nvdisasm")))  # cuobjdump calls it
    result = subprocess.run([cuda_tool("cuobjdump"), "--dump-sass", str(library)], capture_output=True, text=True,
                            env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_both_arches_build_without_spills(built):
    for arch, library in built.items():
        assert library.is_file(), arch
        assert (library.parent / "source.sha256").is_file()


def test_sm120_fp8_kernels_use_native_qmma(built):
    code = sass(built["sm_120a"])
    assert re.search(r"QMMA\.16832\.F32\.E4M3\.E4M3", code), "FP8 QK^T must be native QMMA on sm_120a"
    assert "HMMA.16816.F32.BF16" in code  # the BF16 kernels


def test_no_local_memory_in_kernels(built):
    for arch, library in built.items():
        code = sass(library)
        assert not re.search(r"\b(LDL|STL)\b", code), f"local memory traffic in {arch} kernels"


def test_library_has_no_python_dependency(built):
    """TORCH_LIBRARY, no pybind: the .so must not link libpython (one build serves every Python)."""
    for library in built.values():
        needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
        assert "libpython" not in needed
        assert "PyInit_" not in subprocess.run(["nm", "-D", str(library)], capture_output=True, text=True).stdout
