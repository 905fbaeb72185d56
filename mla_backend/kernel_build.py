"""How one kernel library is compiled: architectures, nvcc flags, the source stamp, the nvcc call.

Shared by the wheel build (setup.py loads it without the package's __init__: standard library only) and
the build on first use (mla_backend.jit), so both produce the same library from the same flags.
The binding uses PyTorch's stable C ABI, targeted at the oldest supported torch: a library built
once serves that torch and every newer one, and every Python version.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .targets import bundled_arch, served_capabilities

SOURCES = ("api/library.cu",)  # the translation unit, relative to csrc/; it includes the headers
HEADER_PATTERNS = ("*.h", "*.cuh")  # every header under csrc/ is part of the source stamp (and the wheel)
FP8_QK_CHOICES = ("auto", "f16", "e4m3")  # config.Fp8QkName; a test keeps the two equal
FP8_PV_CHOICES = ("auto", "f32", "f16")  # config.Fp8PvName; likewise
F16_PV_ARCHES = ("sm_90a", "sm_120a", "sm_121a")  # fp8_pv="f16" builds without spills here
# ... and is auto's choice here: at 128 heads P.V bounds SM120's tensor pipe, where f16 x f16 + f32
# runs at half the f16-accumulate rate (docs/performance.md); its error over the FP8 sweep matched
# f32's on an H100 (dev/variant_error.py: worst 1.70e-3 vs 1.69e-3). SM90 sums in f32 at full rate.
F16_PV_DEFAULT_ARCHES = ("sm_120a", "sm_121a")
TORCH_ABI_TARGET = (2, 11)  # oldest torch the library must load into
TORCH_LIBRARIES = ("torch_cpu", "torch_cuda")  # where the stable shim's symbols live


def arch_for_capability(capability: tuple[int, int]) -> str:
    arch = bundled_arch(capability)
    if arch is None:
        raise RuntimeError(
            f"no mla_backend kernel target for compute capability {capability[0]}.{capability[1]} "
            f"(kernels exist for SM {served_capabilities()})"
        )
    return arch


@dataclass(frozen=True)
class KernelVariant:
    """How the FP8 kernels multiply, as configured ("auto" resolves per architecture):

    fp8_qk: QK^T as "f16" (Q widened once; sm_90a only, where e4m3 mma.sync is emulated) or "e4m3"
    (mma.sync e4m3: native QMMA on SM 8.9/10.x/12.x).
    fp8_pv: P.V summed in "f32" (f16 x f16 + f32 HMMA) or "f16" within each 16-token step, then in
    fp32 (HMMA at the f16-accumulate rate: twice the f32 rate on GeForce Blackwell). Built where it
    fits in registers without spills (F16_PV_ARCHES); auto's choice on F16_PV_DEFAULT_ARCHES."""

    fp8_qk: str = "auto"
    fp8_pv: str = "auto"

    def resolved(self, arch: str) -> KernelVariant:
        if self.fp8_qk not in FP8_QK_CHOICES:
            raise ValueError(f"fp8_qk must be one of {FP8_QK_CHOICES}, not {self.fp8_qk!r}")
        if self.fp8_pv not in FP8_PV_CHOICES:
            raise ValueError(f"fp8_pv must be one of {FP8_PV_CHOICES}, not {self.fp8_pv!r}")
        if self.fp8_qk == "f16" and arch != "sm_90a":
            raise ValueError(
                f"fp8_qk='f16' is built for sm_90a only, not {arch}: its tile needs more shared "
                "memory than the 99 KB per block of the other targets"
            )
        if self.fp8_pv == "f16" and arch not in F16_PV_ARCHES:
            raise ValueError(
                f"fp8_pv='f16' is built for {', '.join(F16_PV_ARCHES)}, not {arch}: there its 32-row "
                "kernel spills registers"
            )
        qk = ("f16" if arch == "sm_90a" else "e4m3") if self.fp8_qk == "auto" else self.fp8_qk
        pv = ("f16" if arch in F16_PV_DEFAULT_ARCHES else "f32") if self.fp8_pv == "auto" else self.fp8_pv
        return KernelVariant(qk, pv)

    def is_default(self, arch: str) -> bool:
        return self.resolved(arch) == KernelVariant().resolved(arch)

    def tags(self, arch: str) -> list[str]:
        """What differs from the architecture's default build, e.g. ["fp8qk-e4m3", "fp8pv-f16"]."""
        mine, default = self.resolved(arch), KernelVariant().resolved(arch)
        return [f"{name.replace('_', '')}-{getattr(mine, name)}" for name in ("fp8_qk", "fp8_pv")
                if getattr(mine, name) != getattr(default, name)]  # fmt: skip

    def describe(self, arch: str) -> str:
        mine = self.resolved(arch)
        return f"fp8_qk {mine.fp8_qk}, fp8_pv {mine.fp8_pv}"


DEFAULT_VARIANT = KernelVariant()


def library_filename(arch: str, variant: KernelVariant = DEFAULT_VARIANT) -> str:
    return f"mla_backend_{arch}{''.join('_' + tag.replace('-', '_') for tag in variant.tags(arch))}.so"


def abi_target_define() -> str:
    major, minor = TORCH_ABI_TARGET
    return f"-DTORCH_TARGET_VERSION=0x{major:02x}{minor:02x}000000000000"


def nvcc_flags(arch: str, strict: bool = False, variant: KernelVariant = DEFAULT_VARIANT) -> list[str]:
    number = arch.removeprefix("sm_")
    flags = [
        f"-gencode=arch=compute_{number},code={arch}",
        "-O3",
        "-std=c++17",
        "-lineinfo",
        "-DNDEBUG",
        "-DUSE_CUDA",
        abi_target_define(),
    ]
    resolved = variant.resolved(arch)
    if resolved.fp8_qk == "f16":
        flags.append("-DMLA_FP8_QK_VIA_F16")
    if resolved.fp8_pv == "f16":
        flags.append("-DMLA_FP8_PV_F16_ACC")
    if strict:  # CI: any register spill or local-memory use fails the build
        flags.append("-Xptxas=--warn-on-spills,--warn-on-local-memory-usage,--warning-as-error")
    return flags


def headers(csrc: Path) -> tuple[str, ...]:
    """Every header under ``csrc``, as paths relative to it ("common/params.h")."""
    found = (path for pattern in HEADER_PATTERNS for path in csrc.rglob(pattern))
    return tuple(sorted(path.relative_to(csrc).as_posix() for path in found))


def source_stamp(csrc: Path, arch: str, variant: KernelVariant = DEFAULT_VARIANT) -> str:
    """Hash of what determines the library: sources and flags (not the torch version: stable ABI)."""
    digest = hashlib.sha256()
    for name in SOURCES + headers(csrc):
        digest.update(name.encode() + b"\0" + (csrc / name).read_bytes())
    digest.update(" ".join(nvcc_flags(arch, variant=variant)).encode())
    return digest.hexdigest()


def torch_paths() -> tuple[Path, Path]:
    """(include dir, lib dir) of the torch in this environment, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("building the kernels needs torch (its stable-ABI headers) installed")
    root = Path(list(spec.submodule_search_locations)[0])
    return root / "include", root / "lib"


def compile_library(
    csrc: Path, arch: str, output: Path, nvcc: Path, strict: bool = False, variant: KernelVariant = DEFAULT_VARIANT
) -> None:
    """One nvcc call: sources -> a shared library linking only torch's stable shim and static cudart."""
    include, lib = torch_paths()
    output.parent.mkdir(parents=True, exist_ok=True)
    command = [
        str(nvcc),
        *nvcc_flags(arch, strict, variant),
        "-shared",
        "-Xcompiler=-fPIC,-fvisibility=hidden",
        "-cudart=static",
        f"-I{include}",
        f"-I{csrc}",
        *[str(csrc / name) for name in SOURCES],
        f"-L{lib}",
        *[f"-l{name}" for name in TORCH_LIBRARIES],
        "-Xlinker=--no-undefined",
        "-o",
        str(output),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        log = result.stderr + result.stdout
        raise RuntimeError(f"nvcc failed building {output.name} ({' '.join(command)}):\n{log[-6000:]}")
