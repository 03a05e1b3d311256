"""Child processes that start with every signal at its default disposition and none blocked,
whatever the test run inherited, for the children a test signals (SIGINT, SIGTERM, SIGSTOP
and SIGCONT).

A shell without job control (a script, `make test &` in one) starts a background command
with SIGINT and SIGQUIT ignored, nohup ignores SIGHUP, and an ignored signal stays ignored
through fork and exec: an rdmactl that a test stops with SIGINT would rightly ignore it.
subprocess's restore_signals resets only SIGPIPE, SIGXFZ and SIGXFSZ.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


def default_signals() -> None:
    """A preexec_fn: runs in the child between fork and exec."""
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    for sig in signal.valid_signals() - UNCATCHABLE:
        with contextlib.suppress(OSError):  # the C library's own real-time signals
            signal.signal(sig, signal.SIG_DFL)


async def spawn(*argv: str, **kwargs: Any) -> asyncio.subprocess.Process:
    """asyncio.create_subprocess_exec, the child starting with the default dispositions."""
    return await asyncio.create_subprocess_exec(*argv, preexec_fn=default_signals, **kwargs)


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """subprocess.Popen, the child starting with the default dispositions."""
    return subprocess.Popen(argv, preexec_fn=default_signals, **kwargs)
