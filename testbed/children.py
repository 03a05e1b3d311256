"""Child processes that start with every signal at its default disposition and none blocked,
whatever the test run inherited, for the children a test signals (SIGINT, SIGTERM, SIGSTOP
and SIGCONT).

A shell without job control (a script, `make test &` in one) starts a background command
with SIGINT and SIGQUIT ignored, nohup ignores SIGHUP, and an ignored signal stays ignored
through fork and exec: an rdmactl that a test stops with SIGINT would rightly ignore it.
subprocess's restore_signals resets only SIGPIPE, SIGXFZ and SIGXFSZ.

coreutils' `env --default-signal` resets them (and leaves none blocked) and execs the
command. Not a preexec_fn: that runs Python in the child between fork and exec, which is not
safe in a process with threads (a lock another thread held at the fork stays held in the
child), and the soak's process forks while its worker threads run.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}
DEFAULT_SIGNALS = ("/usr/bin/env", "--default-signal")


async def spawn(*argv: str, **kwargs: Any) -> asyncio.subprocess.Process:
    """asyncio.create_subprocess_exec, the child starting with the default dispositions."""
    return await asyncio.create_subprocess_exec(*DEFAULT_SIGNALS, *argv, **kwargs)


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """subprocess.Popen, the child starting with the default dispositions."""
    return subprocess.Popen([*DEFAULT_SIGNALS, *argv], **kwargs)
