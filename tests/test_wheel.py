"""The installed wheel's prebuilt kernels (CI runs these with `-m wheel` in a fresh venv holding the
wheel, the newest torch and vLLM, no nvcc on PATH and no CUDA_HOME): one library per shipped
architecture, built against the oldest supported torch's stable ABI, loading into this torch."""

import re
import subprocess

import pytest
from test_build import assert_no_python_dependency, assert_only_stable_torch_abi, assert_registers_ops, cuda_tool, sass

import mla_backend.jit as jit
from mla_backend.jit import PREBUILT_DIR, csrc_dir, prebuilt_library, prebuilt_manifest
from mla_backend.kernel_build import TORCH_ABI_TARGET, source_stamp
from mla_backend.targets import SHIPPED_ARCHES
from mla_backend.toolkit import ToolkitNotFoundError

pytestmark = pytest.mark.wheel


@pytest.fixture(scope="module")
def manifest() -> dict:
    libraries = prebuilt_manifest()
    assert libraries, f"no prebuilt kernels in this install ({PREBUILT_DIR})"
    return libraries


def test_every_architecture_is_shipped_from_these_sources(manifest):
    assert sorted(manifest) == sorted(SHIPPED_ARCHES)
    for arch, entry in manifest.items():
        assert entry["stamp"] == source_stamp(csrc_dir(), arch)
        assert prebuilt_library(arch) == PREBUILT_DIR / entry["file"]


def test_built_for_the_oldest_torch_abi_and_loaded_by_this_one(manifest):
    import torch

    raw = (PREBUILT_DIR / "manifest.json").read_text()
    assert f'"torch_abi_target": "{TORCH_ABI_TARGET[0]}.{TORCH_ABI_TARGET[1]}"' in raw
    for arch, entry in manifest.items():
        library = PREBUILT_DIR / entry["file"]
        assert_only_stable_torch_abi(library)
        assert_no_python_dependency(library)
        assert_registers_ops(library, ds_mla_on_fp8_tiles=arch == "sm_90a")  # under this process's torch
    print(f"loaded into torch {torch.__version__}")


def test_each_library_holds_its_own_architecture(manifest):
    for arch, entry in manifest.items():
        listing = subprocess.run(
            [cuda_tool("cuobjdump"), "--list-elf", str(PREBUILT_DIR / entry["file"])],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        cubins = re.findall(r"\.(sm_\w+)\.cubin", listing)
        assert cubins and set(cubins) == {arch}


def test_sm120_library_runs_native_fp8_mma(manifest):
    code = sass(PREBUILT_DIR / manifest["sm_120a"]["file"])
    assert re.search(r"QMMA\.16832\.F32\.E4M3\.E4M3", code)


def test_every_shipped_library_is_found_without_a_compiler(manifest, monkeypatch, tmp_path):
    def no_toolkit():
        raise ToolkitNotFoundError("hidden for this test")

    monkeypatch.setattr(jit, "find_toolkit", no_toolkit)
    for arch, entry in manifest.items():
        assert jit.locate(arch, str(tmp_path)) == (PREBUILT_DIR / entry["file"], "wheel")
