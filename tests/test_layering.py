"""What the package ships and what it imports. The library core (config -> checks -> op -> launcher ->
kernels, and the engine adapters) does not depend on the tools users run beside it (mla_backend.tools);
nothing in mla_backend imports the test harness (integration/, dev/, tests/, examples/); and the wheel
ships only mla_backend's packages, every module of which the package's entry points reach (a module
only the harness uses belongs in integration/). Read from the source with ``ast``, lazy imports
(inside functions) included."""

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mla_backend"
HARNESS = ("integration", "dev", "tests", "examples")
# Top-level names the harness's files are importable by (tests/ and integration/ put their folders on
# sys.path): an import of one of these from mla_backend is an import of the harness.
HARNESS_NAMES = set(HARNESS) | {p.stem for folder in HARNESS for p in (ROOT / folder).rglob("*.py")} - {"__init__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_names(module: str, source: str | None = None) -> set[str]:
    """Every dotted name ``module`` imports (``from a import b`` gives a and a.b), relative ones resolved."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(source if source is not None else path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names |= {prefix} | {f"{prefix}.{alias.name}" for alias in node.names}
    return names


def harness_imports(overrides: dict[str, str] | None = None) -> dict[str, list[str]]:
    overrides = overrides or {}
    found = {}
    for module in MODULES:
        names = imported_names(module, overrides.get(module))
        if harness := sorted(n for n in names if n.split(".")[0] in HARNESS_NAMES):
            found[module] = harness
    return found


def entry_points() -> set[str]:
    """The modules users and engines start from: the package (its API), ``python -m mla_backend``, the
    console script and the engines' plugin entry points."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    targets = list(project["scripts"].values())
    targets += [target for group in project["entry-points"].values() for target in group.values()]
    return {"mla_backend", "mla_backend.__main__"} | {target.split(":")[0] for target in targets}


def reached_from(starts: set[str], overrides: dict[str, str] | None = None) -> set[str]:
    """The package's modules that imports from ``starts`` reach (importing a module imports its parent
    packages)."""
    overrides = overrides or {}
    reached, todo = set(), list(starts)
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        for name in imported_names(module, overrides.get(module)):
            parts = name.split(".")
            todo += [m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in MODULES]
    return reached


def unreached(overrides: dict[str, str] | None = None) -> list[str]:
    """The package's modules that no import from its entry points reaches."""
    return sorted(set(MODULES) - reached_from(entry_points(), overrides))


CORE = {"mla_backend", "mla_backend.decode", "mla_backend.launcher", "mla_backend.jit", "mla_backend.vllm.backend"}


def test_the_core_and_the_vllm_adapter_reach_no_tool():
    assert sorted(m for m in reached_from(CORE) if m.startswith("mla_backend.tools")) == []


@pytest.mark.slow  # a fresh process importing vLLM
@pytest.mark.vllm
def test_the_core_and_the_vllm_adapter_import_no_tool():
    code = (
        "import sys, mla_backend, mla_backend.decode, mla_backend.launcher, mla_backend.jit, mla_backend.vllm.backend\n"
        "tools = sorted(m for m in sys.modules if m.startswith('mla_backend.tools'))\n"
        "assert not tools, tools\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_nothing_in_the_package_imports_the_harness():
    assert harness_imports() == {}


def test_every_module_the_wheel_ships_is_reached_from_the_package_s_entry_points():
    assert unreached() == []


def test_the_wheel_ships_only_the_package_s_own_folders():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    renamed = setuptools["package-dir"]
    folders = {name: ROOT / renamed.get(name, name.replace(".", "/")) for name in setuptools["packages"]}
    assert all(name == "mla_backend" or name.startswith("mla_backend.") for name in folders), sorted(folders)
    # Every Python package under mla_backend/ ships, and nothing else does (csrc ships as mla_backend.csrc).
    python_packages = {module_name(p.parent) for p in PACKAGE.rglob("__init__.py")}
    assert {name for name, folder in folders.items() if (folder / "__init__.py").exists()} == python_packages


def test_the_rules_catch_a_harness_import_and_a_module_only_the_harness_reaches():
    """The checks above fail where they must: a lazy import of integration/ or of a tests/ helper by its
    top-level name, a lazy import of a tool by the core, and a tool that nothing in the package imports."""
    demo = "mla_backend.tools.demo"
    lazy = "\ndef f():\n    from integration.models.tiny_model import edited_weights\n    import oracle\n"
    assert harness_imports({demo: MODULES[demo].read_text() + lazy}) == {
        demo: ["integration.models.tiny_model", "integration.models.tiny_model.edited_weights", "oracle"]
    }
    decode = "mla_backend.decode"
    lazy_tool = MODULES[decode].read_text() + "\ndef f():\n    from .tools import bench\n"
    assert "mla_backend.tools.bench" in reached_from(CORE, {decode: lazy_tool})
    cli = "mla_backend.cli"
    without_route_table = MODULES[cli].read_text().replace("from .tools.route_table import", "from .tools.bench import")
    assert unreached({cli: without_route_table}) == ["mla_backend.tools.route_table"]
