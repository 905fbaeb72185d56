"""A fault check's parts as rows of (check, ok, note), shared by integration/fault_check.py (vLLM)
and integration/sglang_fault_check.py (SGLang): a judge's verdict, a selftest (a judge fed a broken
run: the row passes where the judge failed it), a part run to its end or stopped by its failure,
and the summary JSON plus the PASS/FAIL table of a call."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PartRows:
    """The rows and numbers of the part that runs now; a check's context adds its own settings."""

    rows: list = field(default_factory=list, kw_only=True)  # this part's (check, ok, note)
    details: dict = field(default_factory=dict, kw_only=True)  # this part's numbers for the JSON

    def row(self, check: str, verdict: tuple[bool, str]) -> bool:
        self.rows.append((check, bool(verdict[0]), verdict[1]))
        return bool(verdict[0])

    def selftest_row(self, check: str, verdict: tuple[bool, str] | None) -> None:
        """A judge fed a broken run: the row passes where the judge failed it."""
        if verdict is None:
            self.rows.append((f"selftest: {check}", False, "could not build the broken run"))
        else:
            caught = not verdict[0]
            note = "caught" if caught else "NOT CAUGHT"
            self.rows.append((f"selftest: {check}", caught, f"{note}: {verdict[1]}"))


def run_part(ctx: PartRows, runner: Callable[[], None]) -> dict:
    """One part; an exception (a server that does not start, a client error) is its failing row, and
    so is a stop by a signal (``interrupted``: the rows so far are still reported)."""
    ctx.rows, ctx.details = [], {}
    begun, interrupted = time.monotonic(), False
    try:
        runner()
    except Exception as err:
        ctx.rows.append(("ran to the end", False, f"{type(err).__name__}: {str(err)[:400]}"))
    except (KeyboardInterrupt, SystemExit) as err:
        interrupted = True
        ctx.rows.append(("ran to the end", False, f"stopped by {type(err).__name__} {err}"))
    rows = [{"check": c, "ok": ok, "note": note} for c, ok, note in ctx.rows]
    wall = round(time.monotonic() - begun, 1)
    return {"wall_s": wall, "rows": rows, "details": ctx.details, "interrupted": interrupted}


def run_parts(parts: Iterable[str], run: Callable[[str], dict], path: Path, settings: dict, title: str) -> int:
    """Run ``parts`` in turn (``run(part)``: run_part's result), writing the summary to ``path``
    after each (parts of earlier calls in the same file are kept) and stopping after an interrupted
    one; then the table under ``title``. The exit status: 1 if a row failed."""
    summary = json.loads(path.read_text()) if path.exists() else {}
    summary.update(settings)
    summary.setdefault("parts", {})
    done = []
    for part in parts:
        print(f"== {part}", flush=True)
        summary["parts"][part] = run(part)
        path.write_text(json.dumps(summary, indent=1, default=str))
        done.append(part)
        if summary["parts"][part]["interrupted"]:
            break
    return print_table(summary, done, path, title)


def print_table(summary: dict, parts: Iterable[str], path: Path, title: str) -> int:
    """The PASS/FAIL table of ``parts`` of a summary; 1 if a row failed."""
    print(f"\n== {title} ==")
    failed = 0
    for part in parts:
        result = summary["parts"][part]
        print(f"-- {part} ({result['wall_s']:.0f} s)")
        for row in result["rows"]:
            failed += not row["ok"]
            print(f"{'PASS' if row['ok'] else 'FAIL':5} {row['check']:44} {row['note']}")
    print(f"{'all passed' if not failed else f'{failed} failed'}; {path}")
    return 1 if failed else 0
