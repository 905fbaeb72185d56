"""A watchdog for GPU calls that could hang: a hung kernel cannot be interrupted in-process, so a call
that does not finish within its deadline fails the run at once (exit code 3, with the stuck test's
name) instead of stalling it."""

from __future__ import annotations

import os
import sys
import time

import torch

DEADLINE_S = 60.0


def finish_or_die(what: str, deadline_s: float = DEADLINE_S) -> None:
    """Wait for the work queued on the current stream; past ``deadline_s`` the process exits (3)."""
    done = torch.cuda.Event()
    done.record()
    start = time.monotonic()
    while not done.query():
        if time.monotonic() - start > deadline_s:
            sys.stderr.write(f"\nHANG: {what} did not finish within {deadline_s:.0f} s; the GPU is stuck, exiting\n")
            sys.stderr.flush()
            os._exit(3)
        time.sleep(0.001)
