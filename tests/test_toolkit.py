"""CUDA toolkit discovery as users' machines have it, on a fake toolkit (no real nvcc needed)."""

import os
import stat
from pathlib import Path

import pytest

from mla_backend import toolkit
from mla_backend.toolkit import ToolkitNotFoundError, find_toolkit


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def fake_toolkit(tmp_path) -> Path:
    return make_toolkit(tmp_path / "cuda-13.0")


def make_toolkit(root: Path) -> Path:
    """A toolkit root whose nvcc answers --version, --dryrun and --list-gpu-code like the real one."""
    (root / "include").mkdir(parents=True)
    (root / "include" / "cuda_runtime.h").write_text("")
    executable(
        root / "bin" / "nvcc",
        f"""#!/bin/sh
case "$*" in
  *--dryrun*) echo '#$ _HERE_={root}/bin' >&2 ;;
  *--list-gpu-code*) echo sm_89 sm_90 sm_120 ;;
  *) echo 'Cuda compilation tools, release 13.0, V13.0.88' ;;
esac
""",
    )
    return root


@pytest.fixture(autouse=True)
def no_default_root(monkeypatch, tmp_path):
    monkeypatch.setattr(toolkit, "DEFAULT_ROOT", tmp_path / "no-such-cuda")


def test_cuda_home_wins(fake_toolkit):
    found = find_toolkit({"CUDA_HOME": str(fake_toolkit), "PATH": ""})
    assert found.root == fake_toolkit and found.version == (13, 0)


def test_cuda_home_that_is_not_a_toolkit_is_one_clear_sentence(tmp_path):
    with pytest.raises(ToolkitNotFoundError, match=r"CUDA_HOME=.* is not a CUDA toolkit") as err:
        find_toolkit({"CUDA_HOME": str(tmp_path), "PATH": ""})
    assert "\n" not in str(err.value)


def test_wrapper_script_on_path_leads_to_the_real_toolkit(fake_toolkit, tmp_path):
    """Like /usr/local/bin/nvcc running `exec /usr/local/cuda-13.0/bin/nvcc "$@"`: torch would guess /usr/local."""
    wrapper_dir = tmp_path / "usr-local-bin"
    executable(wrapper_dir / "nvcc", f'#!/bin/sh\nexec {fake_toolkit}/bin/nvcc "$@"\n')
    assert find_toolkit({"PATH": str(wrapper_dir)}).root == fake_toolkit


def test_symlink_on_path_leads_to_the_real_toolkit(fake_toolkit, tmp_path):
    link_dir = tmp_path / "bin"
    link_dir.mkdir()
    os.symlink(fake_toolkit / "bin" / "nvcc", link_dir / "nvcc")
    assert find_toolkit({"PATH": str(link_dir)}).root == fake_toolkit


def test_default_location_when_nothing_else(fake_toolkit, monkeypatch):
    monkeypatch.setattr(toolkit, "DEFAULT_ROOT", fake_toolkit)
    assert find_toolkit({"PATH": ""}).root == fake_toolkit


def test_discovery_order_cuda_home_cuda_path_path_then_default(tmp_path, monkeypatch):
    """With several toolkits installed the user's explicit choice wins: CUDA_HOME, then CUDA_PATH, then
    the nvcc on PATH, then /usr/local/cuda."""
    home, cuda_path, on_path, default = (make_toolkit(tmp_path / name) for name in ("home", "cp", "path", "default"))
    monkeypatch.setattr(toolkit, "DEFAULT_ROOT", default)
    everything = {"CUDA_HOME": str(home), "CUDA_PATH": str(cuda_path), "PATH": str(on_path / "bin")}
    assert find_toolkit(everything).root == home
    del everything["CUDA_HOME"]
    assert find_toolkit(everything).root == cuda_path
    del everything["CUDA_PATH"]
    assert find_toolkit(everything).root == on_path
    assert find_toolkit({"PATH": ""}).root == default


def test_no_toolkit_is_one_clear_sentence():
    with pytest.raises(ToolkitNotFoundError, match="no CUDA toolkit found.*set CUDA_HOME") as err:
        find_toolkit({"PATH": ""})
    assert "\n" not in str(err.value)


def test_architectures_the_toolkit_can_compile(fake_toolkit):
    found = find_toolkit({"CUDA_HOME": str(fake_toolkit)})
    assert found.supports("sm_90a") and found.supports("sm_120a") and not found.supports("sm_121a")
