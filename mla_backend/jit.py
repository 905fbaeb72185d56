"""Finding and loading the kernel library for the GPU in the machine.

Where it comes from, first match wins:
1. ``wheel``: prebuilt in the installed package (``mla_backend/prebuilt``, one library per
   architecture, listed in its manifest with the source stamp it was built from);
2. ``cache``: an earlier build on this machine (``~/.cache/mla_backend`` or the ``cache_dir`` setting);
3. ``fresh build``: compiled now with the CUDA toolkit (mla_backend.toolkit finds it);
4. otherwise an error naming the GPU's capability, the architectures shipped and how to build.

The library registers ``torch.ops.mla_backend.*`` through PyTorch's stable ABI (no pybind), so it
depends on neither the Python nor the torch version. A file lock keeps several engine workers from
building at once; one process loads one library (the op namespace registers once).
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import MLABackendConfig
from .kernel_build import (
    DEFAULT_VARIANT,
    KernelVariant,
    arch_for_capability,
    compile_library,
    library_filename,
    source_stamp,
)
from .kernel_constants import csrc_dir
from .targets import SHIPPED_ARCHES
from .toolkit import ToolkitNotFoundError, find_toolkit

log = logging.getLogger("mla_backend")

PREBUILT_DIR = Path(__file__).resolve().parent / "prebuilt"
NVCC_ENV_FLAGS = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")  # the variables nvcc adds to its command line
MANIFEST = "manifest.json"


class KernelsUnavailableError(RuntimeError):
    """No library fits this GPU and none can be built here."""


@dataclass(frozen=True)
class LoadedLibrary:
    arch: str
    variant: KernelVariant  # as built in (resolved: no "auto")
    path: Path
    origin: str  # "wheel", "cache" or "fresh build"


def prebuilt_manifest() -> dict:
    """{arch: {"file": ..., "stamp": ...}} of the libraries shipped in this install ({} if none)."""
    path = PREBUILT_DIR / MANIFEST
    return json.loads(path.read_text())["libraries"] if path.is_file() else {}


def prebuilt_library(arch: str, variant: KernelVariant = DEFAULT_VARIANT) -> Path | None:
    """The shipped library for ``arch`` if it was built from these exact sources and flags."""
    entry = prebuilt_manifest().get(arch)
    if entry is None or not variant.is_default(arch):
        return None
    path = PREBUILT_DIR / entry["file"]
    if not path.is_file() or entry["stamp"] != source_stamp(csrc_dir(), arch):
        log.warning("mla_backend: ignoring the prebuilt %s library: it was built from other sources", arch)
        return None
    return path


def build_dir(arch: str, cache_dir: str | None = None, variant: KernelVariant = DEFAULT_VARIANT) -> Path:
    """``cache_dir`` defaults to the configured one (MLA_BACKEND_CACHE_DIR), else ~/.cache/mla_backend.
    Each architecture and kernel variant builds in a directory of its own."""
    cache_dir = cache_dir or MLABackendConfig.from_sources().cache_dir
    root = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "mla_backend"
    return root / "-".join([arch, *variant.tags(arch)])


def build_cached(
    arch: str, cache_dir: str | None = None, strict: bool = False, variant: KernelVariant = DEFAULT_VARIANT
) -> tuple[Path, bool]:
    """The cached library for ``arch``, compiled first unless a build of these exact sources and
    flags is there; returns (path, whether it was compiled now). Needs a CUDA toolkit to compile."""
    directory = build_dir(arch, cache_dir, variant)
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / library_filename(arch, variant)
    stamp_file = directory / "source.sha256"
    csrc = csrc_dir()
    # nvcc also reads flags from the environment (dev builds: dev/profiles/ force-included): a library
    # built with others is not this build.
    stamp = source_stamp(csrc, arch, variant) + "".join(
        f"\n{name}={os.environ[name]}" for name in NVCC_ENV_FLAGS if os.environ.get(name)
    )
    with open(directory / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even if we crash
        if library.is_file() and stamp_file.is_file() and stamp_file.read_text() == stamp and not strict:
            return library, False
        toolkit = find_toolkit()
        if not toolkit.supports(arch):
            raise KernelsUnavailableError(
                f"the CUDA {toolkit.version[0]}.{toolkit.version[1]} toolkit at "
                f"{toolkit.root} cannot compile for {arch}: install a newer one"
            )
        start = time.perf_counter()
        log.info("mla_backend: building kernels for %s with %s", arch, toolkit.nvcc)
        stamp_file.unlink(missing_ok=True)
        compile_library(csrc, arch, library, toolkit.nvcc, strict=strict, variant=variant)
        stamp_file.write_text(stamp)
        log.info("mla_backend: kernels for %s ready in %.1f s", arch, time.perf_counter() - start)
    return library, True


def locate(arch: str, cache_dir: str | None = None, variant: KernelVariant = DEFAULT_VARIANT) -> tuple[Path, str]:
    """(library, origin) for ``arch``: the wheel's, the cache's, or a fresh build."""
    shipped = prebuilt_library(arch, variant)
    if shipped is not None:
        return shipped, "wheel"
    try:
        library, compiled = build_cached(arch, cache_dir, variant=variant)
    except ToolkitNotFoundError as err:
        shipped_arches = sorted(prebuilt_manifest()) or ["none"]
        which = "" if variant.is_default(arch) else f" with {variant.describe(arch)}"
        raise KernelsUnavailableError(
            f"mla_backend has no prebuilt kernels for {arch}{which} (this install ships: "
            f"{', '.join(shipped_arches)}) and cannot build them: {err}; then run "
            f"`python -m mla_backend build --arch {arch}`"
        ) from None
    return library, "fresh build" if compiled else "cache"


_loaded: list[LoadedLibrary] = []  # the library this process loaded


def loaded_library() -> LoadedLibrary | None:
    return _loaded[0] if _loaded else None


@functools.cache
def ensure_loaded(
    device_index: int, cache_dir: str | None = None, variant: KernelVariant = DEFAULT_VARIANT
) -> LoadedLibrary:
    """Load the kernels for the GPU ``device_index`` (building them if nothing prebuilt fits)."""
    capability = torch.cuda.get_device_capability(device_index)
    try:
        arch = arch_for_capability(capability)
    except RuntimeError as err:
        raise KernelsUnavailableError(f"{err}; this install ships {', '.join(SHIPPED_ARCHES)}") from None
    resolved = variant.resolved(arch)
    if _loaded:
        if (_loaded[0].arch, _loaded[0].variant) != (arch, resolved):
            raise RuntimeError(
                f"mla_backend: kernels for {_loaded[0].arch} ({_loaded[0].variant.describe(_loaded[0].arch)}) "
                f"are loaded in this process and {arch} ({resolved.describe(arch)}) cannot join them (the "
                "torch library namespace registers once): use another process"
            )
        return _loaded[0]
    path, origin = locate(arch, cache_dir, variant)
    torch.ops.load_library(str(path))
    _loaded.append(LoadedLibrary(arch, resolved, path, origin))
    log.info("mla_backend: loaded %s kernels (%s) from %s", arch, origin, path)
    return _loaded[0]


def build_cli(arch_list: str | None, strict: bool = False, variant: KernelVariant = DEFAULT_VARIANT) -> int:
    """`python -m mla_backend build`: builds into the cache, several architectures at once."""
    if arch_list is None:
        if not torch.cuda.is_available():
            print("no GPU visible: pass --arch, e.g. --arch sm_90a,sm_120a", file=sys.stderr)
            return 2
        arch_list = arch_for_capability(torch.cuda.get_device_capability())
    arches = [a.strip() for a in arch_list.split(",") if a.strip()]
    unknown = sorted(set(arches) - set(SHIPPED_ARCHES))
    if unknown:
        print(f"unknown architecture(s) {unknown}; choose from {', '.join(SHIPPED_ARCHES)}", file=sys.stderr)
        return 2
    for arch in arches:
        try:
            variant.resolved(arch)
        except ValueError as err:
            print(f"mla_backend build: {err}", file=sys.stderr)
            return 2
    try:
        find_toolkit()
    except ToolkitNotFoundError as err:
        print(f"mla_backend build: {err}", file=sys.stderr)
        return 1
    # One process per architecture: nvcc is single-threaded, and builds of one arch serialise on its lock.
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); "
        "from mla_backend.jit import build_cached; from mla_backend.kernel_build import KernelVariant; "
        "print(build_cached(sys.argv[1], strict=sys.argv[2] == '1', variant=KernelVariant(*sys.argv[3:5]))[0])"
    )
    options = ["1" if strict else "0", variant.fp8_qk, variant.fp8_pv]
    jobs = {arch: subprocess.Popen([sys.executable, "-c", code, arch, *options]) for arch in arches}
    failed = [arch for arch, job in jobs.items() if job.wait() != 0]
    if failed:
        print(f"build failed for {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
