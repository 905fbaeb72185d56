"""Where the kernel library comes from (wheel, cache, fresh build) and the error when none can be had,
with the library loading and the compiler replaced by fakes (no GPU, no nvcc)."""

import json

import pytest

import mla_backend.jit as jit
from mla_backend.kernel_build import KernelVariant, library_filename, source_stamp
from mla_backend.toolkit import ToolkitNotFoundError


@pytest.fixture
def prebuilt(tmp_path, monkeypatch):
    """An install shipping sm_90a and sm_120a, stamped with the current sources."""
    directory = tmp_path / "prebuilt"
    directory.mkdir()
    libraries = {}
    for arch in ("sm_90a", "sm_120a"):
        (directory / library_filename(arch)).write_bytes(b"\x7fELF")
        libraries[arch] = {"file": library_filename(arch), "stamp": source_stamp(jit.csrc_dir(), arch)}
    (directory / jit.MANIFEST).write_text(json.dumps({"libraries": libraries}))
    monkeypatch.setattr(jit, "PREBUILT_DIR", directory)
    return directory


@pytest.fixture
def no_toolkit(monkeypatch):
    def missing():
        raise ToolkitNotFoundError("no CUDA toolkit found (...): install the CUDA toolkit")

    monkeypatch.setattr(jit, "find_toolkit", missing)


@pytest.fixture
def process(monkeypatch):
    """A fresh process's state, with torch.ops.load_library recorded instead of run."""
    loads = []
    monkeypatch.setattr(jit.torch.ops, "load_library", loads.append)
    monkeypatch.setattr(jit, "_loaded", [])
    jit.ensure_loaded.cache_clear()
    yield loads
    jit.ensure_loaded.cache_clear()


def test_the_wheels_library_is_used_without_a_toolkit(prebuilt, no_toolkit, tmp_path):
    path, origin = jit.locate("sm_120a", str(tmp_path / "cache"))
    assert (path, origin) == (prebuilt / library_filename("sm_120a"), "wheel")


def test_a_stale_prebuilt_library_is_not_used(prebuilt, no_toolkit, tmp_path):
    manifest = json.loads((prebuilt / jit.MANIFEST).read_text())
    manifest["libraries"]["sm_90a"]["stamp"] = "0" * 64
    (prebuilt / jit.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(jit.KernelsUnavailableError):
        jit.locate("sm_90a", str(tmp_path / "cache"))


def test_missing_architecture_without_toolkit_names_capability_shipped_and_fix(prebuilt, no_toolkit, tmp_path):
    with pytest.raises(jit.KernelsUnavailableError) as err:
        jit.locate("sm_89", str(tmp_path / "cache"))
    message = str(err.value)
    for words in ("sm_89", "ships: sm_120a, sm_90a", "no CUDA toolkit", "python -m mla_backend build --arch sm_89"):
        assert words in message


def test_non_default_variant_is_built_not_taken_from_the_wheel(prebuilt, no_toolkit, tmp_path):
    with pytest.raises(jit.KernelsUnavailableError, match="sm_90a with fp8_qk e4m3, fp8_pv f32"):
        jit.locate("sm_90a", str(tmp_path / "cache"), KernelVariant(fp8_qk="e4m3"))
    with pytest.raises(jit.KernelsUnavailableError, match="sm_90a with fp8_qk f16, fp8_pv f16"):
        jit.locate("sm_90a", str(tmp_path / "cache"), KernelVariant(fp8_pv="f16"))


@pytest.fixture
def fake_compiler(monkeypatch):
    """A toolkit that 'compiles' by writing a stub library; returns the list of (arch, strict) builds."""
    compiled = []

    def fake_compile(csrc, arch, output, nvcc, strict=False, variant=KernelVariant()):
        compiled.append((arch, strict))
        output.write_bytes(b"\x7fELF")

    monkeypatch.setattr(
        jit,
        "find_toolkit",
        lambda: type("T", (), {"supports": lambda self, a: True, "nvcc": "nvcc", "version": (13, 0)})(),
    )
    monkeypatch.setattr(jit, "compile_library", fake_compile)
    return compiled


def test_cache_then_fresh_build(prebuilt, tmp_path, fake_compiler):
    cache = str(tmp_path / "cache")
    assert jit.locate("sm_89", cache)[1] == "fresh build"
    assert jit.locate("sm_89", cache)[1] == "cache"
    assert fake_compiler == [("sm_89", False)]


def test_a_strict_build_never_takes_a_cached_library(tmp_path, fake_compiler):
    """The cache does not record whether a library was built strict (no spills allowed), so a strict
    build compiles again even where a build of the same sources is cached."""
    cache = str(tmp_path / "cache")
    assert jit.build_cached("sm_90a", cache)[1] is True
    assert jit.build_cached("sm_90a", cache)[1] is False
    assert jit.build_cached("sm_90a", cache, strict=True)[1] is True
    assert fake_compiler == [("sm_90a", False), ("sm_90a", True)]


def test_a_cached_library_built_with_other_nvcc_flags_from_the_environment_is_built_again(
    tmp_path, fake_compiler, monkeypatch
):
    """nvcc reads NVCC_APPEND_FLAGS / NVCC_PREPEND_FLAGS itself: a dev build with -D flags there must
    not be answered by the library cached without them, nor the default build by the dev one."""
    cache = str(tmp_path / "cache")
    monkeypatch.delenv("NVCC_APPEND_FLAGS", raising=False)
    monkeypatch.delenv("NVCC_PREPEND_FLAGS", raising=False)
    assert jit.build_cached("sm_120a", cache)[1] is True
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-include dev/profiles/sm120_on_sm90.h")
    assert jit.build_cached("sm_120a", cache)[1] is True
    assert jit.build_cached("sm_120a", cache)[1] is False
    monkeypatch.setenv("NVCC_PREPEND_FLAGS", "-G")
    assert jit.build_cached("sm_120a", cache)[1] is True
    monkeypatch.delenv("NVCC_APPEND_FLAGS")
    monkeypatch.delenv("NVCC_PREPEND_FLAGS")
    assert jit.build_cached("sm_120a", cache)[1] is True
    assert len(fake_compiler) == 4


def test_unsupported_gpu_names_its_capability(process, monkeypatch):
    monkeypatch.setattr(jit.torch.cuda, "get_device_capability", lambda index=None: (8, 6))
    with pytest.raises(jit.KernelsUnavailableError, match="compute capability 8.6.*ships sm_89, sm_90a"):
        jit.ensure_loaded(0)
    assert process == []


def test_one_process_loads_one_variant(process, prebuilt, monkeypatch):
    monkeypatch.setattr(jit.torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    library = jit.ensure_loaded(0, None, KernelVariant())
    assert (library.arch, library.variant, library.origin) == ("sm_90a", KernelVariant("f16", "f32"), "wheel")
    spelled_out = KernelVariant("f16", "f32")  # the same library: nothing to load
    assert jit.ensure_loaded(0, None, spelled_out) is library
    for other in (KernelVariant(fp8_qk="e4m3"), KernelVariant(fp8_pv="f16")):
        with pytest.raises(RuntimeError, match="use another process"):
            jit.ensure_loaded(0, None, other)
    assert process == [str(prebuilt / library_filename("sm_90a"))]
    assert jit.loaded_library() is library
