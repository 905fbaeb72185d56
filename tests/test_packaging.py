"""The wheel ships every source under csrc/ (as mla_backend/csrc): each folder is a package that
pyproject.toml lists, whose package-data patterns take each of its files. A folder or a file type left
out would ship libraries whose source stamp the installed sources no longer give."""

import tomllib
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_csrc_file_ships_in_the_wheel():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages, data = set(setuptools["packages"]), setuptools["package-data"]
    assert setuptools["package-dir"]["mla_backend.csrc"] == "csrc"
    sources = [path.relative_to(ROOT / "csrc") for path in (ROOT / "csrc").rglob("*") if path.is_file()]
    assert len(sources) > 20
    for source in sources:
        package = ".".join(["mla_backend", "csrc", *source.parent.parts])
        assert package in packages, f"csrc/{source.parent} is not a listed package"
        assert any(fnmatch(source.name, pattern) for pattern in data.get(package, ())), f"csrc/{source} does not ship"
