"""Work a component does in the background: the jobs it spawns, and the batches that gather
a burst of requests into one pass.

A job that fails is logged with what it was doing. A job may park while it waits for news
from the kernel (an event, a netdev coming home): `quiesce()` waits until every job is done
or parked, so a caller (a shutdown, a test) can tell "nothing left to do but wait for the
kernel" from "still busy", without counting loop turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rdmad.core.logfields import MESSAGE_JOB_FAILED, log_event

_Key = TypeVar("_Key")


@dataclass(frozen=True)
class Job:
    """What a job is doing, and whose: the context of its log line if it fails."""

    what: str
    device: str | None = None
    netns: str | None = None
    claim: str | None = None


class Work:
    """The jobs one component owns."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._jobs: dict[asyncio.Task[None], Job] = {}
        # Parked jobs, each with what tells that its news came (it is busy again from then).
        self._parked: dict[asyncio.Task[Any], Callable[[], bool]] = {}
        self._moved = asyncio.Event()  # a job ended or parked: quiesce looks again

    def spawn(self, coro: Coroutine[Any, Any, None], job: Job) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=f"rdmad: {job.what}")
        self._jobs[task] = job
        task.add_done_callback(self._ended)
        return task

    def failed(self, job: Job, exc: Exception) -> None:
        """Log a job's failure, with what it was doing and whose."""
        log_event(
            self._log,
            MESSAGE_JOB_FAILED,
            f"{job.what} failed: {exc!r}",
            device=job.device,
            netns=job.netns,
            claim=job.claim,
            level=logging.ERROR,
            exc_info=exc,
        )

    def _ended(self, task: asyncio.Task[None]) -> None:
        job = self._jobs.pop(task)
        if not task.cancelled():
            exc = task.exception()
            if isinstance(exc, Exception):
                self.failed(job, exc)
        self._moved.set()

    @contextlib.contextmanager
    def parked(self, woken: Callable[[], bool]) -> Iterator[None]:
        """Around the current job's wait for news from the kernel: it is not busy while
        `woken()` says the news has not come. Checked at once, not when the job resumes, so
        that quiesce never takes a job already woken for parked. Outside a job (a caller's
        own coroutine), nothing."""
        task = asyncio.current_task()
        if task not in self._jobs:
            yield
            return
        assert task is not None
        self._parked[task] = woken
        self._moved.set()
        try:
            yield
        finally:
            del self._parked[task]

    def _busy(self) -> bool:
        for task in self._jobs:
            woken = self._parked.get(task)
            if not task.done() and (woken is None or woken()):
                return True
        return False

    async def quiesce(self) -> None:
        """Wait until every job, and every job those spawn, is done or parked."""
        while self._busy():
            self._moved.clear()
            await self._moved.wait()

    async def close(self) -> None:
        """Cancel every job (parked ones included), and wait for them to end."""
        tasks = list(self._jobs)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Batch(Generic[_Key]):
    """Requests gathered over a burst (keys, or "all"), run as one pass after it: the pass
    runs a loop turn after the first request, so the rest of the burst joins it, and once
    more if requests came in while it ran. It owns its task (a job of `work`)."""

    def __init__(
        self, work: Work, job: Job, run: Callable[[set[_Key] | None], Awaitable[None]]
    ) -> None:
        self._work = work
        self._job = job
        self._run = run  # given the keys, or None for all
        self._all = False
        self._keys: set[_Key] = set()
        self._task: asyncio.Task[None] | None = None

    def add(self, keys: Iterable[_Key] | None = None) -> None:
        """Ask for a pass over `keys` (None: over all of them)."""
        if keys is None:
            self._all = True
        else:
            self._keys.update(keys)
        if (self._all or self._keys) and (self._task is None or self._task.done()):
            self._task = self._work.spawn(self._drain(), self._job)

    async def _drain(self) -> None:
        while self._all or self._keys:
            await asyncio.sleep(0)  # the rest of the burst queues up first
            keys = None if self._all else self._keys
            self._all, self._keys = False, set()
            try:
                await self._run(keys)
            except Exception as exc:  # the next pass may well succeed: keep batching
                self._work.failed(self._job, exc)
