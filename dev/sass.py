"""Dump the SASS of every kernel variant the wheel ships, to prove a source change leaves the code alone.

    python dev/sass.py /tmp/sass_before        # on the old tree
    python dev/sass.py /tmp/sass_after         # on the new tree
    diff -r /tmp/sass_before /tmp/sass_after   # empty when the machine code is identical

Each architecture of targets.SHIPPED_ARCHES is compiled with the wheel's flags (plus the e4m3 QK^T
variant of sm_90a), in parallel, and disassembled with cuobjdump (the toolkit's, else the pip CUDA 13
one). Source line info is stripped so that moving code between files does not count as a change.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mla_backend.kernel_build import F16_PV_ARCHES, KernelVariant, compile_library  # noqa: E402
from mla_backend.targets import SHIPPED_ARCHES  # noqa: E402
from mla_backend.toolkit import find_toolkit  # noqa: E402

VARIANTS = [(arch, KernelVariant()) for arch in SHIPPED_ARCHES] + [
    ("sm_90a", KernelVariant(fp8_qk="e4m3")),
    *((arch, KernelVariant(fp8_pv="f16")) for arch in F16_PV_ARCHES),
]


def cuobjdump(nvcc: Path) -> str:
    """The toolkit's own, else the pip CUDA 13 one (triton's copy predates sm_103a)."""
    import nvidia

    for candidate in (nvcc.parent / "cuobjdump", Path(list(nvidia.__path__)[0]) / "cu13" / "bin" / "cuobjdump"):
        if candidate.is_file():
            return str(candidate)
    return shutil.which("cuobjdump") or "cuobjdump"


def dump(arch: str, variant: KernelVariant, out: Path, nvcc: Path, work: Path) -> str:
    name = f"{arch}_{'_'.join(variant.tags(arch)) or 'auto'}"
    library = work / f"{name}.so"
    # Strict (no spills) but for sm_90a's e4m3 QK^T, a build-on-request option for testing the SM120 path.
    compile_library(ROOT / "csrc", arch, library, nvcc, strict=variant.fp8_qk == "auto", variant=variant)
    sass = subprocess.run([cuobjdump(nvcc), "-sass", str(library)], capture_output=True, text=True, check=True).stdout
    # Addresses and encodings stay (they change when code does); the file and line comments go, and
    # runs of blanks shrink to one (cuobjdump pads its columns to the longest line of the file).
    sass = "\n".join(" ".join(line.split()) for line in sass.splitlines() if not re.match(r"\s*//##", line))
    (out / f"{name}.sass").write_text(sass)
    return f"{arch} {variant.describe(arch)}: {sass.count(chr(10))} lines"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    nvcc = find_toolkit().nvcc
    with tempfile.TemporaryDirectory() as work, ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(dump, arch, variant, args.out, nvcc, Path(work)) for arch, variant in VARIANTS]
        for job in jobs:
            print(job.result())
    return 0


if __name__ == "__main__":
    sys.exit(main())
