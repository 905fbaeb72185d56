"""What the tests of the two server launchers (integration/engines/vllm_server.py, sglang_server.py) share:
reading what a started stand-in wrote, and starting one as a background job would."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen

# A stand-in server that says how it will take SIGINT, then waits to be stopped.
SIGINT_PROBE = "import signal, time\nprint(signal.getsignal(signal.SIGINT), flush=True)\ntime.sleep(60)\n"


def first_line(log: Path, timeout_s: float = 120.0) -> str:
    """The first whole line a started process writes to ``log`` (a slow start on a loaded 2-core CI
    machine, or a read in the middle of the write, must not be read as an empty or cut line)."""
    deadline = time.monotonic() + timeout_s
    while "\n" not in (text := log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, f"nothing written to {log} in {timeout_s:.0f} s"
        time.sleep(0.1)
    return text.split("\n", 1)[0]


def start_probe_as_background_job(start: Callable[[list[str], Path], Popen], log: Path) -> Popen:
    """SIGINT_PROBE started by ``start(command, log)`` with SIGINT ignored in the starting process, as a
    shell leaves it for a background job (``cmd &``, nohup, the lent GPU's detached runs)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return start([sys.executable, "-c", SIGINT_PROBE], log)
    finally:
        signal.signal(signal.SIGINT, previous)
