"""Find the CUDA toolkit the way a user's machine has it (standard library only: setup.py uses it too).

Order: ``CUDA_HOME`` (or ``CUDA_PATH``); else the real toolkit behind the ``nvcc`` on PATH, through
symlinks and wrapper scripts (nvcc itself reports where it lives); else ``/usr/local/cuda``.
torch's own guess (the parent of nvcc's directory) is wrong for a wrapper such as
/usr/local/bin/nvcc, so it is not used.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path("/usr/local/cuda")


class ToolkitNotFoundError(RuntimeError):
    """No usable CUDA toolkit: the message is one sentence saying what to do."""


@dataclass(frozen=True)
class Toolkit:
    root: Path
    version: tuple[int, int]

    @property
    def nvcc(self) -> Path:
        return self.root / "bin" / "nvcc"

    def supports(self, arch: str) -> bool:
        return arch.removeprefix("sm_").rstrip("af") in supported_arch_numbers(str(self.nvcc))


def is_toolkit(root: Path) -> bool:
    return (root / "bin" / "nvcc").is_file() and (root / "include" / "cuda_runtime.h").is_file()


def root_behind(nvcc: str) -> Path | None:
    """The toolkit a (possibly wrapped or symlinked) nvcc runs from: its dry run names its own bin/."""
    real = Path(os.path.realpath(nvcc))
    if is_toolkit(real.parent.parent):
        return real.parent.parent
    try:
        dry = subprocess.run([nvcc, "--dryrun", "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"^#\$ _HERE_=(.+)$", dry.stdout + dry.stderr, re.MULTILINE)
    root = Path(match.group(1).strip()).parent if match else None
    return root if root is not None and is_toolkit(root) else None


def nvcc_version(nvcc: str) -> tuple[int, int]:
    text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    match = re.search(r"release (\d+)\.(\d+)", text)
    if not match:
        raise ToolkitNotFoundError(f"{nvcc} --version printed no release number")
    return int(match.group(1)), int(match.group(2))


@functools.cache
def supported_arch_numbers(nvcc: str) -> frozenset[str]:
    text = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60).stdout
    return frozenset(code.removeprefix("sm_") for code in text.split() if code.startswith("sm_"))


def find_toolkit(environ: dict[str, str] | None = None) -> Toolkit:
    """The CUDA toolkit to build with, or ToolkitNotFoundError saying how to provide one."""
    environ = dict(os.environ if environ is None else environ)
    variable = next((v for v in ("CUDA_HOME", "CUDA_PATH") if environ.get(v)), None)
    if variable is not None:
        root = Path(environ[variable])
        if not is_toolkit(root):
            raise ToolkitNotFoundError(
                f"{variable}={root} is not a CUDA toolkit (no bin/nvcc and "
                "include/cuda_runtime.h there): point it at the toolkit's root"
            )
    else:
        on_path = shutil.which("nvcc", path=environ.get("PATH", ""))
        root = root_behind(on_path) if on_path else None
        if root is None and is_toolkit(DEFAULT_ROOT):
            root = DEFAULT_ROOT
    if root is None:
        raise ToolkitNotFoundError(
            "no CUDA toolkit found (no CUDA_HOME, no nvcc on PATH, no /usr/local/cuda): "
            "install the CUDA toolkit 12.8 or newer and set CUDA_HOME to its root"
        )
    return Toolkit(root, nvcc_version(str(root / "bin" / "nvcc")))
