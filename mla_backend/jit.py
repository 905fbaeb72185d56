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

import torch

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


def nvcc_flags(arch: str, strict: bool = False) -> list[str]:
    number = arch.removeprefix("sm_")
    flags = [
        f"-gencode=arch=compute_{number},code={arch}",
        "-O3", "-std=c++17", "-lineinfo",
        "-DNDEBUG",
    ]
    if arch == "sm_90a":  # e4m3 mma.sync is emulated there: widen Q to f16 once instead of every tile
        flags.append("-DMLA_FP8_QK_VIA_F16")
    if strict:  # CI: any register spill or local-memory use fails the build
        flags.append("-Xptxas=--warn-on-spills,--warn-on-local-memory-usage,--warning-as-error")
    return flags


def build_dir(arch: str, cache_dir: str | None = None) -> Path:
    """``cache_dir`` defaults to the configured one (MLA_BACKEND_CACHE_DIR), else ~/.cache/mla_backend."""
    from .config import MLABackendConfig

    cache_dir = cache_dir or MLABackendConfig.from_sources().cache_dir
    root = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "mla_backend"
    cuda = (torch.version.cuda or "none").replace(".", "")
    return root / f"torch{torch.__version__.split('+')[0]}-cu{cuda}" / arch


def library_name(arch: str) -> str:
    return f"mla_backend_{arch}"


def source_stamp(arch: str) -> str:
    """Hash of what determines the library: sources, flags, torch and CUDA versions."""
    digest = hashlib.sha256()
    src = csrc_dir()
    for name in SOURCES + HEADERS:
        digest.update(name.encode() + b"\0" + (src / name).read_bytes())
    digest.update(" ".join(nvcc_flags(arch)).encode())
    digest.update(f"{torch.__version__} {torch.version.cuda}".encode())
    return digest.hexdigest()


def build_and_load(arch: str, cache_dir: str | None = None, strict: bool = False) -> Path:
    """Load the library for ``arch``, compiling it first unless a build of these exact sources
    exists (an ahead-of-time build from `python -m mla_backend build` counts); returns its path."""
    from torch.utils.cpp_extension import load

    directory = build_dir(arch, cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / f"{library_name(arch)}.so"
    stamp_file = directory / "source.sha256"
    stamp = source_stamp(arch)
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
            extra_cuda_cflags=nvcc_flags(arch, strict),
            extra_include_paths=[str(src)],
            build_directory=str(directory),
            is_python_module=False,
            verbose=os.environ.get("MLA_BACKEND_VERBOSE_BUILD") == "1",
        )
        stamp_file.write_text(stamp)
        log.info("mla_backend: kernels for %s ready in %.1f s", arch, time.perf_counter() - start)
    return library


@functools.lru_cache(maxsize=None)
def ensure_loaded(device_index: int, cache_dir: str | None = None) -> None:
    """Load the kernels for the GPU ``device_index`` (building them on first use)."""
    capability = torch.cuda.get_device_capability(device_index)
    build_and_load(arch_for_capability(capability), cache_dir)


def build_cli(arch_list: str | None, strict: bool = False) -> int:
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
                f"from mla_backend.jit import build_and_load; print(build_and_load({arch!r}, strict={strict!r}))")
        if subprocess.run([sys.executable, "-c", code]).returncode != 0:
            failed.append(arch)
    if failed:
        print(f"build failed for {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
