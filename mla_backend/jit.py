"""JIT build of csrc/ with torch.utils.cpp_extension + ninja, one library per GPU architecture.

The library registers ``torch.ops.mla_backend.*`` through TORCH_LIBRARY (no pybind), so it does
not depend on the Python version. Builds are cached under ``~/.cache/mla_backend`` (or the
``cache_dir`` setting) keyed by torch/CUDA version and architecture; a file lock keeps several
engine workers from building at once.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import get_args

import torch

from .config import Fp8QkName, MLABackendConfig

log = logging.getLogger("mla_backend")

SOURCES = ("mla_decode.cu",)
HEADERS = ("mla_decode_kernel.cuh",)
# compute capability -> the architecture we build for it ("a": arch-specific features such as
# setmaxnreg/wgmma on 9.0 and native FP8 QMMA on 12.x).
ARCH_BY_CAPABILITY = {(8, 9): "sm_89", (9, 0): "sm_90a", (10, 0): "sm_100a", (10, 3): "sm_103a",
                      (12, 0): "sm_120a", (12, 1): "sm_121a"}


def csrc_dir() -> Path:
    """Sources ship inside the wheel as mla_backend/csrc; a source checkout keeps them in ../csrc."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "csrc", here.parent / "csrc"):
        if (candidate / SOURCES[0]).is_file():
            return candidate
    raise FileNotFoundError(f"CUDA sources not found next to {here}")


def arch_for_capability(capability: tuple[int, int]) -> str:
    try:
        return ARCH_BY_CAPABILITY[tuple(capability)]
    except KeyError:
        raise RuntimeError(f"no mla_backend kernel target for compute capability {capability[0]}.{capability[1]}") from None


def fp8_qk_variant(arch: str, fp8_qk: str = "auto") -> str:
    """How the FP8 kernels built for ``arch`` multiply Q by K: "f16" (Q widened once, for sm_90a,
    where e4m3 mma.sync is emulated) or "e4m3" (mma.sync e4m3: native QMMA on SM 8.9/12.x)."""
    if fp8_qk == "auto":
        return "f16" if arch == "sm_90a" else "e4m3"
    if fp8_qk == "f16" and arch != "sm_90a":
        raise ValueError(f"fp8_qk='f16' is built for sm_90a only, not {arch}: its tile needs more shared "
                         "memory than the 99 KB per block of the other targets")
    if fp8_qk not in get_args(Fp8QkName):
        raise ValueError(f"fp8_qk must be one of {get_args(Fp8QkName)}, not {fp8_qk!r}")
    return fp8_qk


def nvcc_flags(arch: str, strict: bool = False, fp8_qk: str = "auto") -> list[str]:
    number = arch.removeprefix("sm_")
    flags = [
        f"-gencode=arch=compute_{number},code={arch}",
        "-O3", "-std=c++17", "-lineinfo",
        "-DNDEBUG",
    ]
    if fp8_qk_variant(arch, fp8_qk) == "f16":
        flags.append("-DMLA_FP8_QK_VIA_F16")
    if strict:  # CI: any register spill or local-memory use fails the build
        flags.append("-Xptxas=--warn-on-spills,--warn-on-local-memory-usage,--warning-as-error")
    return flags


def build_dir(arch: str, cache_dir: str | None = None, fp8_qk: str = "auto") -> Path:
    """``cache_dir`` defaults to the configured one (MLA_BACKEND_CACHE_DIR), else ~/.cache/mla_backend.
    A non-default FP8 QK^T variant builds in a directory of its own."""
    cache_dir = cache_dir or MLABackendConfig.from_sources().cache_dir
    root = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "mla_backend"
    cuda = (torch.version.cuda or "none").replace(".", "")
    variant = fp8_qk_variant(arch, fp8_qk)
    name = arch if variant == fp8_qk_variant(arch) else f"{arch}-fp8qk-{variant}"
    return root / f"torch{torch.__version__.split('+')[0]}-cu{cuda}" / name


def library_name(arch: str) -> str:
    return f"mla_backend_{arch}"


def source_stamp(arch: str, fp8_qk: str = "auto") -> str:
    """Hash of what determines the library: sources, flags, torch and CUDA versions."""
    digest = hashlib.sha256()
    src = csrc_dir()
    for name in SOURCES + HEADERS:
        digest.update(name.encode() + b"\0" + (src / name).read_bytes())
    digest.update(" ".join(nvcc_flags(arch, fp8_qk=fp8_qk)).encode())
    digest.update(f"{torch.__version__} {torch.version.cuda}".encode())
    return digest.hexdigest()


def build_and_load(arch: str, cache_dir: str | None = None, strict: bool = False, fp8_qk: str = "auto") -> Path:
    """Load the library for ``arch``, compiling it first unless a build of these exact sources
    exists (an ahead-of-time build from `python -m mla_backend build` counts); returns its path."""
    from torch.utils.cpp_extension import load

    directory = build_dir(arch, cache_dir, fp8_qk)
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / f"{library_name(arch)}.so"
    stamp_file = directory / "source.sha256"
    stamp = source_stamp(arch, fp8_qk)
    src = csrc_dir()
    with open(directory / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even if we crash
        if library.is_file() and stamp_file.is_file() and stamp_file.read_text() == stamp and not strict:
            torch.ops.load_library(str(library))
            log.info("mla_backend: loaded prebuilt kernels %s", library)
            return library
        start = time.perf_counter()
        log.info("mla_backend: building kernels for %s in %s", arch, directory)
        load(
            name=library_name(arch),
            sources=[str(src / name) for name in SOURCES],
            extra_cuda_cflags=nvcc_flags(arch, strict, fp8_qk),
            extra_include_paths=[str(src)],
            build_directory=str(directory),
            is_python_module=False,
            verbose=os.environ.get("MLA_BACKEND_VERBOSE_BUILD") == "1",
        )
        stamp_file.write_text(stamp)
        log.info("mla_backend: kernels for %s ready in %.1f s", arch, time.perf_counter() - start)
    return library


_loaded: list[tuple[str, str]] = []  # (arch, FP8 QK^T variant) of the library this process loaded


@functools.lru_cache(maxsize=None)
def ensure_loaded(device_index: int, cache_dir: str | None = None, fp8_qk: str = "auto") -> None:
    """Load the kernels for the GPU ``device_index`` (building them on first use)."""
    arch = arch_for_capability(torch.cuda.get_device_capability(device_index))
    wanted = (arch, fp8_qk_variant(arch, fp8_qk))
    if _loaded and _loaded[0] != wanted:
        raise RuntimeError(f"mla_backend: kernels {_loaded[0]} are loaded in this process and {wanted} cannot "
                           "join them (the torch library namespace registers once): use another process")
    if not _loaded:
        build_and_load(arch, cache_dir, fp8_qk=fp8_qk)
        _loaded.append(wanted)


def build_cli(arch_list: str | None, strict: bool = False, fp8_qk: str = "auto") -> int:
    """`python -m mla_backend build`: ahead-of-time builds; each arch in its own process because
    one process can register the torch library namespace only once."""
    if arch_list is None:
        if not torch.cuda.is_available():
            print("no GPU visible: pass --arch, e.g. --arch sm_90a,sm_120a", file=sys.stderr)
            return 2
        arch_list = arch_for_capability(torch.cuda.get_device_capability())
    failed = []
    for arch in [a.strip() for a in arch_list.split(",") if a.strip()]:
        code = (f"import logging; logging.basicConfig(level=logging.INFO, format='%(message)s'); "
                f"from mla_backend.jit import build_and_load; "
                f"print(build_and_load({arch!r}, strict={strict!r}, fp8_qk={fp8_qk!r}))")
        if subprocess.run([sys.executable, "-c", code]).returncode != 0:
            failed.append(arch)
    if failed:
        print(f"build failed for {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
