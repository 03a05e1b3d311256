"""The lock that makes prepare and unprepare take turns across the plugin's instances
(rdmad/dra/call_lock.py): an open file description lock, so that two holders exclude each
other whether they are two processes or two calls of one, and a holder that ends (its call
cancelled, its process gone) leaves the lock free."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdmad.dra.call_lock import CallLock

WAITING = "waiting for"
WHOLE_FILE = struct.pack("@hhqqi0q", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)


@pytest.fixture(autouse=True)
def info_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "rdmad.dra")


@pytest.fixture
def lock(tmp_path: Path) -> CallLock:
    return CallLock(str(tmp_path / "serialize.lock"))


class OtherInstance:
    """The lock, held as another instance holds it: on a description of its own."""

    def __init__(self, path: str) -> None:
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT)
        fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, WHOLE_FILE)

    def exits(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@pytest.fixture
def other_instance(lock: CallLock) -> Iterator[OtherInstance]:
    holder = OtherInstance(lock.path)
    yield holder
    holder.exits()


def taken(lock: CallLock) -> bool:
    """Whether someone holds the lock, asked as another instance would."""
    fd = os.open(lock.path, os.O_RDWR)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, WHOLE_FILE)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class Waits(logging.Handler):
    """Counts the holders that said they wait for the lock (they say it on the loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.said = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if WAITING in record.getMessage():
            self.said.set()


@pytest.fixture
def waits() -> Iterator[Waits]:
    handler = Waits()
    logger = logging.getLogger("rdmad.dra")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


async def test_a_holder_holds_the_file_against_other_instances(lock: CallLock) -> None:
    async with lock.held():
        assert taken(lock)
    assert not taken(lock)


async def test_a_holder_waits_while_another_instance_holds_the_lock(
    lock: CallLock, other_instance: OtherInstance, waits: Waits
) -> None:
    entered = asyncio.Event()

    async def hold() -> None:
        async with lock.held():
            entered.set()

    holder = asyncio.create_task(hold())
    await waits.said.wait()
    assert not entered.is_set()
    other_instance.exits()
    await holder
    assert entered.is_set()


async def test_two_calls_of_one_process_take_turns(lock: CallLock, waits: Waits) -> None:
    order: list[str] = []
    entered = asyncio.Event()
    release = asyncio.Event()

    async def first() -> None:
        async with lock.held():
            order.append("first in")
            entered.set()
            await release.wait()
            order.append("first out")

    async def second() -> None:
        async with lock.held():
            order.append("second in")

    one = asyncio.create_task(first())
    await entered.wait()
    two = asyncio.create_task(second())
    await waits.said.wait()
    release.set()
    await asyncio.gather(one, two)
    assert order == ["first in", "first out", "second in"]


async def test_a_waiter_cancelled_leaves_the_lock_free_once_it_is_released(
    lock: CallLock, other_instance: OtherInstance, waits: Waits
) -> None:
    async def hold() -> None:
        async with lock.held():
            raise AssertionError("a cancelled waiter never holds the lock")

    waiter = asyncio.create_task(hold())
    await waits.said.wait()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    other_instance.exits()  # the abandoned wait now gets the lock, and lets it go
    async with asyncio.timeout(10):
        async with lock.held():
            assert taken(lock)
