"""Wheel build: the package plus one prebuilt kernel library per GPU architecture.

``MLA_BACKEND_ARCHS`` picks the architectures: ``all`` (default for wheels), ``none`` (a wheel
that builds its kernels on first use), or a list such as ``sm_90a,sm_120a``. Editable installs
compile nothing unless it is set: a checkout builds on first use (or `python -m mla_backend build`).
The libraries target torch's stable ABI (see mla_backend/kernel_build.py), so the wheel is tagged
for any CPython 3 and the glibc its libraries need.
"""

import importlib
import json
import os
import re
import subprocess
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Command, Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build import build

ROOT = Path(__file__).resolve().parent


def load_module(name: str):
    """mla_backend/<name>.py without running the package's __init__ (which needs pydantic): the
    directory is imported as a bare package of another name, so relative imports inside it work."""
    package = sys.modules.setdefault("_mla_build", types.ModuleType("_mla_build"))
    package.__path__ = [str(ROOT / "mla_backend")]
    return importlib.import_module(f"_mla_build.{name}")


def requested_arches(targets, editable: bool) -> list[str]:
    raw = os.environ.get("MLA_BACKEND_ARCHS")
    if raw is None:
        return [] if editable else list(targets.SHIPPED_ARCHES)
    raw = raw.strip().lower()
    if raw == "none":
        return []
    if raw == "all":
        return list(targets.SHIPPED_ARCHES)
    arches = [a.strip() for a in raw.split(",") if a.strip()]
    unknown = sorted(set(arches) - set(targets.SHIPPED_ARCHES))
    if unknown:
        sys.exit(f"MLA_BACKEND_ARCHS: unknown architecture(s) {unknown}; choose from {targets.SHIPPED_ARCHES}")
    return arches


class BuildKernels(Command):
    description = "compile the CUDA kernels for the shipped GPU architectures (strict: no spills)"
    user_options = []
    editable_mode = False  # set by setuptools for `pip install -e`

    def initialize_options(self):
        self.build_lib = None

    def finalize_options(self):
        self.set_undefined_options("build_py", ("build_lib", "build_lib"))

    def run(self):
        kernel_build, toolkit = load_module("kernel_build"), load_module("toolkit")
        arches = requested_arches(load_module("targets"), self.editable_mode)
        if not arches:
            print("mla_backend: no prebuilt kernels in this build (they compile on first use)")
            return
        try:
            found = toolkit.find_toolkit()
        except toolkit.ToolkitNotFoundError as err:
            sys.exit(f"mla_backend: cannot build the kernels: {err} (or set MLA_BACKEND_ARCHS=none)")
        package = ROOT / "mla_backend" if self.editable_mode else Path(self.build_lib) / "mla_backend"
        out = package / "prebuilt"
        out.mkdir(parents=True, exist_ok=True)
        csrc = ROOT / "csrc"

        def compile_one(arch):
            print(f"mla_backend: compiling {arch} with {found.nvcc}", flush=True)
            kernel_build.compile_library(csrc, arch, out / kernel_build.library_filename(arch), found.nvcc, strict=True)

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(compile_one, arches))
        manifest = {
            "torch_abi_target": ".".join(map(str, kernel_build.TORCH_ABI_TARGET)),
            "cuda": ".".join(map(str, found.version)),
            "libraries": {
                arch: {"file": kernel_build.library_filename(arch), "stamp": kernel_build.source_stamp(csrc, arch)}
                for arch in arches
            },
        }
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")

    def get_outputs(self):
        return []


def glibc_needed(directory: Path) -> tuple[int, int]:
    """Newest GLIBC symbol version the libraries in ``directory`` ask for (2.17 if none)."""
    newest = (2, 17)
    for library in directory.glob("*.so"):
        symbols = subprocess.run(["objdump", "-T", str(library)], capture_output=True, text=True).stdout
        for major, minor in re.findall(r"GLIBC_(\d+)\.(\d+)", symbols):
            newest = max(newest, (int(major), int(minor)))
    return newest


class BinaryDistribution(Distribution):
    """Carries shared libraries: installed to platlib, wheel tagged for a platform."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """Tagged py3-none-<platform>: the libraries depend on neither the Python version nor its ABI."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        prebuilt = Path(self.get_finalized_command("build_py").build_lib) / "mla_backend" / "prebuilt"
        if platform.startswith("linux_") and prebuilt.is_dir():
            major, minor = glibc_needed(prebuilt)
            platform = platform.replace("linux_", f"manylinux_{major}_{minor}_")
        return "py3", "none", platform


build.sub_commands.append(("build_kernels", None))
setup(distclass=BinaryDistribution, cmdclass={"build_kernels": BuildKernels, "bdist_wheel": PlatformWheel})
