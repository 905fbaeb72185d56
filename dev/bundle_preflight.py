"""Before spending device time: does each zoo family's vLLM model module import with only what the lent
GPU machine has (the image's packages, the vLLM bundle's part 1, .gpu/extra's wheels)? A CPU check in
the development venv (vLLM 0.26, as the bundle):

    .venv/bin/python dev/bundle_preflight.py [--families Kimi-K2.5,Kimi-Linear] [--bundle .gpu]

Each family in a process of its own: every other distribution is hidden from vLLM's imports, then vLLM's
engine core and the family's model module are imported as vLLM loads them. A required package that is
missing there fails here with its name; optional ones take vLLM's fallbacks, as there. Imports made
only while an engine runs (Kimi-Linear's KDA metadata builder) are not seen: a clean preflight is no
proof, a failure is. The image's package list is KINDS.md's ("Python packages already there").
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.metadata
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from integration.models.families import FAMILIES, pick  # noqa: E402

KINDS = Path("/work/.library/device/KINDS.md")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_distributions() -> set[str]:
    """The packages KINDS.md lists for the GPU image."""
    if not KINDS.exists():
        raise SystemExit(f"{KINDS} not found: the GPU image's package list is read from it")
    text = KINDS.read_text()
    listed = text.split("Packages:", 1)[1].split("\n", 1)[0] if "Packages:" in text else ""
    return {normalized(name.strip(" .")) for name in listed.split(",") if name.strip(" .")}


def bundle_distributions(bundle: Path) -> set[str]:
    """The distributions in the bundle's part 1 (their .dist-info folders) and in .gpu/extra's wheels."""
    names: set[str] = set()
    for part in bundle.glob("vllm*_part1*.tar.xz"):
        with tarfile.open(part) as tar:
            for member in tar.getnames():
                if (m := re.search(r"([^/]+?)-[^-/]+\.dist-info", member)) is not None:
                    names.add(normalized(m[1]))
    for wheel in (bundle / "extra").glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            names |= {
                normalized(m[1]) for n in archive.namelist() if (m := re.match(r"([^/]+?)-[^-/]+\.dist-info/", n))
            }
    return names | {"vllm"}


def importer() -> str:
    """The module whose code is importing (the first frame outside the import machinery)."""
    frame = sys._getframe(2)
    while frame is not None and (
        frame.f_code.co_filename.startswith("<frozen") or "importlib" in frame.f_code.co_filename
    ):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


class Absent(importlib.abc.MetaPathFinder):
    """vLLM's imports of a package the GPU machine lacks find nothing there; here too (every finder
    wrapped), so that its optional imports (find_spec checks, guarded imports) take their fallbacks
    and its required ones fail. The image's own packages import what their versions there need,
    which may differ from this venv's: those imports are left alone."""

    def __init__(self, finder, absent: set[str]):
        self.finder, self.absent = finder, absent

    def find_spec(self, name, path=None, target=None):
        if name.split(".", 1)[0] in self.absent and importer().startswith("vllm"):
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attribute):
        return getattr(self.finder, attribute)


def hide_absent(there: set[str]) -> None:
    """Every import finder wrapped in Absent: distributions not in ``there`` are not found from vLLM."""
    owners = importlib.metadata.packages_distributions()
    absent = {top for top, dists in owners.items() if not {normalized(d) for d in dists} & there}
    sys.meta_path[:] = [Absent(finder, absent) for finder in sys.meta_path]


def check_one(name: str, there: set[str]) -> str | None:
    """Why family ``name``'s model module does not import with only what the GPU machine has, or None;
    in a process of its own, so that no other family's imports are already made."""
    hide_absent(there)
    import vllm.v1.engine.core  # noqa: F401  (imported by every run there: it must pass)

    from integration.zoo_e2e import model_import_error  # what the zoo asks on the GPU machine

    return model_import_error(next(f for f in FAMILIES if f.name == name))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", help="zoo family names, comma-separated (default: every bundled one)")
    parser.add_argument("--bundle", type=Path, default=ROOT / ".gpu")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a family's name: the check in this process
    args = parser.parse_args()
    there = image_distributions() | bundle_distributions(args.bundle)
    if args.one:
        error = check_one(args.one, there)
        print(f"FAILS: {error}" if error else "ok")
        return 1 if error else 0
    chosen = [f for f, _ in pick(args.families, every_layout=False)] if args.families else FAMILIES
    families = [f for f in chosen if f.expect == "bundled"]
    failed = 0
    for family in families:
        one = [sys.executable, __file__, "--one", family.name, "--bundle", str(args.bundle)]
        done = subprocess.run(one, capture_output=True, text=True)
        verdict = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()[-300:]
        failed += done.returncode != 0
        print(f"{family.name:28s} {family.architecture:36s} {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
