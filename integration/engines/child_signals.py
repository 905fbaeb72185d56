"""Servers are stopped by SIGINT, as Ctrl-C stops them. A shell starts a background job (``cmd &``,
``nohup``, the lent GPU's detached runs) with SIGINT ignored, its children inherit that, and Python
then installs no KeyboardInterrupt handler: the SIGINT would do nothing. Servers start with SIGINT
back at its default."""

from __future__ import annotations

import signal


def sigint_at_default() -> None:
    """``preexec_fn`` of a server's Popen: runs in the child before the server's program starts."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
