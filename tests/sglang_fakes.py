"""Stand-ins for the SGLang tests: the engine script (integration/engines/sglang_engine.py) run on a fake
``sglang`` package, and SGLang's indexer modules set aside for a test that lets the plugin rewire them."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

# An sglang.Engine that prints the settings it was built with, then ends the process.
SETTINGS_PRINTER = "import json, sys\nclass Engine:\n    def __init__(self, **settings):\n"
SETTINGS_PRINTER += "        print(json.dumps(settings, default=str))\n        sys.exit(0)\n"


def run_engine_script(tmp_path: Path, spec: dict, engine_source: str = SETTINGS_PRINTER) -> dict:
    """sglang_engine.py as run_isolated runs it (a script, spec as JSON on stdin), with ``engine_source`` as
    the ``sglang`` package; the last JSON line it printed."""
    from integration.engines import sglang_engine

    (tmp_path / "sglang").mkdir(exist_ok=True)
    (tmp_path / "sglang" / "__init__.py").write_text(engine_source)
    done = subprocess.run(
        [sys.executable, sglang_engine.__file__],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-800:]
    return json.loads(done.stdout.splitlines()[-1])


def keep_indexer_modules(monkeypatch) -> None:
    """Whatever the plugin sets in SGLang's indexer modules (the resolvers, a module's deep_gemm) undone
    after the test."""
    from mla_backend.sglang import dsa

    for module in (importlib.import_module(m) for m in (dsa.RESOLVERS_MODULE, dsa.INDEXER_MODULE, dsa.DSA_MODULE)):
        for name in (*dsa.RESOLVERS, "deep_gemm"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, getattr(module, name))
            else:
                monkeypatch.setattr(module, name, None, raising=False)
                monkeypatch.delattr(module, name)
