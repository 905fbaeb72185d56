"""integration/ in rooms (integration/__init__.py): the runnable checks on top of models/, engines/
and judges/, with imports one way and no circle. Read from the source with ``ast``, lazy imports
(inside functions) included: a circle through one of those is still a circle."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INTEGRATION = ROOT / "integration"

# What each room may import from integration/. Engines use the float64 comparisons of a decode call
# and of a sparse call: they run inside the engine's process, while the cache still holds the step's state.
ALLOWED = {
    "checks": {"models", "engines", "judges", "settings"},
    "engines": {"engines", "settings", "integration.judges.decode_check", "integration.judges.sparse_check"},
    "judges": {"judges", "settings"},
    "models": {"models"},
    "settings": set(),
}
# The runnable checks, run as scripts (dev/gpu_session.sh).
CHECKS = [
    "dp_e2e",
    "run_e2e",
    "zoo_e2e",
    "serve_check",
    "sglang_e2e",
    "real_dims",
    "fault_check",
    "sglang_fault_check",
    "sparse_e2e",
    "sglang_sparse_e2e",
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(INTEGRATION.rglob("*.py"))}
# Names of integration's files and folders: imported as top-level names, they are the sys.path hack.
FILE_NAMES = {p.stem for p in INTEGRATION.rglob("*.py")} | {p.name for p in INTEGRATION.rglob("*") if p.is_dir()}
FILE_NAMES -= {"__init__", "__pycache__"}


def room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "package"
    if parts[1] in ("models", "engines", "judges"):
        return parts[1]
    return "settings" if parts[1] == "settings" else "checks"


def imports(module: str, source: str | None = None) -> tuple[set[str], list[str]]:
    """The integration modules ``module`` imports (packages' __init__ left out), and the imports of
    integration's files as top-level names (the sys.path hack the package replaced)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found, bare = set(), []
    for node in ast.walk(ast.parse(source if source is not None else path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module
            names = [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]
        else:
            continue
        bare += [n for n in names if n.split(".")[0] in FILE_NAMES]
        found |= {n for n in names if n in MODULES and MODULES[n].name != "__init__.py"}
    return found - {module}, bare


def graph(overrides: dict[str, str] | None = None) -> dict[str, set[str]]:
    overrides = overrides or {}
    return {m: imports(m, overrides.get(m))[0] for m in MODULES}


def rule_breaks(edges: dict[str, set[str]]) -> list[str]:
    breaks = []
    for module, targets in edges.items():
        allowed = ALLOWED.get(room(module), set())
        for target in sorted(targets):
            if room(target) != "package" and room(target) not in allowed and target not in allowed:
                breaks.append(f"{module} ({room(module)}) imports {target} ({room(target)})")
    return breaks


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(module, trail):
        state[module] = "open"
        for target in sorted(edges.get(module, ())):
            if state.get(target) == "open":
                found.append(trail[trail.index(target) :] + [target])
            elif target not in state:
                visit(target, trail + [target])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return found


def test_the_rooms_are_there():
    rooms = {room(m) for m in MODULES}
    assert rooms == {"package", "checks", "models", "engines", "judges", "settings"}, rooms
    assert sorted(m.split(".")[1] for m in MODULES if room(m) == "checks") == sorted(CHECKS)


def test_each_room_imports_only_what_it_may():
    assert rule_breaks(graph()) == []


def test_there_is_no_import_circle():
    assert circles(graph()) == []


def test_integration_modules_are_imported_by_the_package_not_by_top_level_names():
    bare = {m: imports(m)[1] for m in MODULES}
    assert {m: names for m, names in bare.items() if names} == {}


def test_the_rules_catch_a_judge_that_imports_an_engine_and_a_circle():
    """The checks above fail where they must: a judge importing an engine, and the circle that
    engine.py and vllm_worker_check.py once made."""
    judge = "integration.judges.tokens"
    edges = graph({judge: MODULES[judge].read_text() + "\nfrom integration.engines.vllm_spec import EngineSpec\n"})
    assert rule_breaks(edges) == [f"{judge} (judges) imports integration.engines.vllm_spec (engines)"]
    worker = "integration.engines.vllm_worker_check"
    lazy = "\ndef f():\n    from integration.engines.vllm_engine import run_engine\n"
    assert circles(graph({worker: MODULES[worker].read_text() + lazy})) != []
    bare = imports(judge, MODULES[judge].read_text() + "\nfrom decode_check import check_call\n")[1]
    assert bare == ["decode_check", "decode_check.check_call"]


SCRIPTS_AND_MODULES = """
import contextlib, importlib, io, runpy, sys
integration, checks, modules = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
base = [p for p in sys.path if p not in ("", integration.rpartition("/")[0])]
for check in checks:  # as `python integration/<check>.py --help` starts: its folder first, no checkout
    sys.path[:] = [integration, *base]
    for name in [m for m in sys.modules if m == "integration" or m.startswith("integration.")]:
        del sys.modules[name]
    sys.argv = [f"{integration}/{check}.py", "--help"]
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
        runpy.run_path(sys.argv[0], run_name="__main__")
    assert out.getvalue().startswith("usage:"), (check, out.getvalue())
for module in modules:
    importlib.import_module(module)
"""


def test_each_check_runs_as_a_script_and_every_module_imports(tmp_path):
    """As dev/gpu_session.sh runs them (``python integration/<check>.py``, here with ``--help``, from
    another folder), each check finds the integration package; and every module of it imports."""
    args = [str(INTEGRATION), ",".join(CHECKS), ",".join(MODULES)]
    result = subprocess.run(
        [sys.executable, "-c", SCRIPTS_AND_MODULES, *args], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
