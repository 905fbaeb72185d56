"""The SGLang end-to-end checks' table (integration/sglang_e2e.py, integration/sglang_sparse_e2e.py): a
row per (model, KV dtype, part), printed as it comes, then all of them as JSON and a closing table."""

from __future__ import annotations

import json
from pathlib import Path


def add_row(rows: list, model: str, kv: str, part: str, status: str, note: str, **details) -> None:
    """One row of the table (PASS, FAIL, UNREACHED, or ref for a reference's run), printed as it comes."""
    rows.append({"model": model, "kv": kv, "part": part, "status": status, "note": note, **details})
    print(f"{status:9} {model:44} {kv:9} {part:26} {note}", flush=True)


def describe(run: dict) -> str:
    """An engine run's note: its error, or its decode tokens/s."""
    return run.get("error") or f"{run['tokens_per_s']:.0f} decode tok/s"


def report(rows: list[dict], summary: Path, note_width: int = 160) -> int:
    """The rows written to ``summary`` and printed one a line; exit status 1 where one failed."""
    summary.write_text(json.dumps(rows, indent=1))
    print(f"\n{len(rows)} rows ({summary}):")
    for r in rows:
        print(f"{r['status']:9} {r['model']:44} {r['kv']:9} {r['part']:26} {r['note'][:note_width]}")
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0
