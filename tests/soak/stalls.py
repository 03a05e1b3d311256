"""Stalls: the soak's own event loop, watched, and rdmad's threads as the kernel sees them.

A loop that stops turning stops every actor and makes rdmad look slow (a READY it sent is
read only after the start's timeout has fired). faulthandler's watchdog is a C thread: it
dumps every thread's stack when the loop has not re-armed it within STALL_S, even while the
loop's thread holds the GIL in a C call.

An rdmad whose claims stop between two steps (a guest run's four shared claims after their
macvlans, never explained) shows in a report what each of its threads waits on in the
kernel: a worker stuck in setns() or a mount differs there from one idle on its queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
from collections.abc import AsyncIterator
from pathlib import Path

STALL_S = 10.0
BEAT_S = 1.0
STACK_FRAMES = 8


@contextlib.asynccontextmanager
async def watched_loop(path: Path) -> AsyncIterator[None]:
    """Each stall of STALL_S or more leaves every thread's stack in `path`."""
    with open(path, "w") as out:

        async def beat() -> None:
            while True:
                faulthandler.dump_traceback_later(STALL_S, file=out)
                await asyncio.sleep(BEAT_S)

        task = asyncio.ensure_future(beat())
        try:
            yield
        finally:
            task.cancel()
            faulthandler.cancel_dump_traceback_later()


def kernel_threads(pid: int) -> list[str]:
    """One line per thread of `pid` (its id, state and kernel wait channel), each followed by
    the top of its kernel stack (root reads it); [] once the process is gone."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            task = Path(f"/proc/{pid}/task/{tid}")
            try:
                state = (task / "stat").read_text().rsplit(") ", 1)[1].split()[0]
                wchan = (task / "wchan").read_text() or "-"
                stack = (task / "stack").read_text().splitlines()
            except (FileNotFoundError, ProcessLookupError):
                continue  # the thread ended meanwhile
            except PermissionError:
                stack = []
            out.append(f"thread {tid} {state} {wchan}")
            out += [f"    {frame.split('] ', 1)[-1]}" for frame in stack[:STACK_FRAMES]]
    return out


def stalls(path: Path) -> str:
    """What the watch wrote, or "" if the loop never stalled."""
    return path.read_text(errors="replace") if path.exists() else ""
