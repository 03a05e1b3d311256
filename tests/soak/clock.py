"""The soak's clock and gate: the only place that waits for time.

Actors ask `until(at)` for their next action's time; the clock stands still while a check
runs, so the schedule is played out in full however long the checks take. At pace k a soak
second is k wall seconds: the guest's emulated CPU plays the host's schedule k times slower,
so that its actors keep to it instead of playing a backlog back to back. The gate closes
for a check: no new action starts, and the check waits until those in flight are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator


class Clock:
    def __init__(self, pace: float = 1.0) -> None:
        self.pace = pace
        self._start = time.monotonic()
        self._paused_at: float | None = None
        self._paused_total = 0.0
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._paused = asyncio.Event()
        self._gate = asyncio.Event()
        self._gate.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.in_flight = 0

    def start(self) -> None:
        """Soak time 0 is now: the actors start (the world's setup is not their time)."""
        self._start = time.monotonic()

    def now(self) -> float:
        """Soak seconds: wall time since the start, less the time the checks stood it still."""
        end = self._paused_at if self._paused_at is not None else time.monotonic()
        return (end - self._start - self._paused_total) / self.pace

    async def until(self, at: float) -> None:
        """Return at soak time `at`, at once when it is past."""
        while True:
            await self._resumed.wait()
            left = at - self.now()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._paused.wait(), left * self.pace)

    @contextlib.asynccontextmanager
    async def acting(self) -> AsyncIterator[None]:
        """One action in flight, started once the gate is open: a check waits for it."""
        # Open when this task resumes, not only when it was woken: a check whose time is
        # past shuts the gate again at once, and would stop the clock under an action that
        # waits on the clock (a SIGSTOP's window: the check then waits on a stopped rdmad).
        while not self._gate.is_set():
            await self._gate.wait()
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    @contextlib.asynccontextmanager
    async def quiescent(self) -> AsyncIterator[None]:
        """Shut the gate, let the actions in flight end (their windows run on the clock),
        then stop the clock; undo on exit."""
        self._gate.clear()
        try:
            await self._idle.wait()
            self._paused_at = time.monotonic()
            self._resumed.clear()
            self._paused.set()
            try:
                yield
            finally:
                self._paused_total += time.monotonic() - self._paused_at
                self._paused_at = None
                self._paused.clear()
                self._resumed.set()
        finally:
            self._gate.set()
