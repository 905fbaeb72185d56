"""The verdict on an SGLang engine our backend must refuse at start-up (integration/sglang_e2e.py's
refusals; the engine from integration/engines/sglang_engine.py's start_refused).

SGLang builds the decode backend in its scheduler process, after the model and its memory pools. A
factory that raises there is logged as "Scheduler hit an exception: <traceback>", and the scheduler
signals the engine's process, which takes down every process it started and then itself (SGLang
0.5.17, managers/scheduler.py:4950-4952 and entrypoints/engine.py:1648-1653). So a refusal passes
where the engine never served, ended on its own (no timeout), left no process behind, shows no fault
of a crash, and its log has our factory in a traceback with the expected message. Where no traceback
passes through our factory, SGLang stopped before asking for a decode backend: the flag was never
weighed, and the run shows nothing either way (UNREACHED; the CPU tests check the refusal itself).
"""

from __future__ import annotations

import re

OUR_FACTORY = re.compile(r'File "[^"]*mla_backend[/\\]sglang[/\\]backend\.py", line \d+, in create_backend')
CRASH = re.compile(r"Segmentation fault|core dumped|Fatal Python error|CUDA error|illegal memory access")


def last_error(log: str) -> str:
    """The log's last line that names an error (its last line where none does)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    named = [line for line in lines if re.search(r"Error|Exception|error:", line)]
    return (named or lines or [""])[-1][:300]


def judge_refusal(run: dict, log: str, message: str) -> tuple[str, str]:
    """(PASS / FAIL / UNREACHED, note) for a start_refused run, its log and the refusal's expected text."""
    if run["served"]:
        return "FAIL", "the engine started and served"
    if run["timed_out"]:
        return "FAIL", f"the engine did not stop within the limit; {last_error(log)}"
    if run["left_over"]:
        return "FAIL", f"processes left behind: {run['left_over']}"
    if CRASH.search(log):
        return "FAIL", f"crashed: {CRASH.search(log).group(0)}; {last_error(log)}"  # type: ignore[union-attr]
    if not OUR_FACTORY.search(log):
        return (
            "UNREACHED",
            f"stopped before a decode backend was asked for (exit {run['returncode']}): {last_error(log)}",
        )
    if message not in log:
        return "FAIL", f"our factory stopped start-up without {message!r}: {last_error(log)}"
    return "PASS", f"stopped at start-up (exit {run['returncode']}): {last_error(log)}"
