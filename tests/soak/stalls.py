"""The soak's own event loop, watched: a loop that stops turning stops every actor and makes
rdmad look slow (a READY it sent is read only after the start's timeout has fired).

faulthandler's watchdog is a C thread: it dumps every thread's stack when the loop has not
re-armed it within STALL_S, even while the loop's thread holds the GIL in a C call.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
from collections.abc import AsyncIterator
from pathlib import Path

STALL_S = 10.0
BEAT_S = 1.0


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


def stalls(path: Path) -> str:
    """What the watch wrote, or "" if the loop never stalled."""
    return path.read_text(errors="replace") if path.exists() else ""
