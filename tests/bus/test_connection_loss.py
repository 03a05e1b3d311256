"""A BusConnection (rdmad/bus/connection.py) whose bus daemon goes away: what it sends is
dropped or refused, wait_for_disconnect returns the one cause, and nothing is left for
asyncio to log as "Future exception was never retrieved" (docs/kernel-notes.md,
"dbus-fast"). The daemon's side, with calls in flight: tests/reliability/test_bus_loss.py;
rdmad-dra's: tests/dra/test_bus_loss.py."""

from __future__ import annotations

import asyncio
import errno
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from dbus_fast import Message
from dbus_fast.aio import MessageBus

from rdmad.bus.connection import BusConnection
from rdmad.bus.names import DBUS_NAME, DBUS_PATH
from testbed.bus import PrivateBus, start_private_bus

pytestmark = pytest.mark.bus  # a private dbus-daemon, each test's own: the test kills it

NEVER_RETRIEVED = "Future exception was never retrieved"


def get_id() -> Message:
    return Message(destination=DBUS_NAME, path=DBUS_PATH, interface=DBUS_NAME, member="GetId")


def ping() -> Message:
    return Message.new_signal("/io/rdmad1", "io.rdmad1.Test", "Ping")


def kill(bus: PrivateBus) -> None:
    """The bus daemon dies. The loop does not run meanwhile, so the connection's reader has
    not seen the end of its socket yet: the next write is the first to meet the loss."""
    bus.process.kill()
    bus.process.wait()


@asynccontextmanager
async def asyncio_logs() -> AsyncIterator[list[str]]:
    """What the loop's exception handler gets until the end, after the callbacks the end
    scheduled have run (they hold futures) and a full collection (a future logs an error
    nobody retrieved when it is collected)."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    logged: list[str] = []
    loop.set_exception_handler(lambda _loop, context: logged.append(context["message"]))
    try:
        yield logged
        await asyncio.sleep(0)  # one loop turn, not a wait
        gc.collect()
    finally:
        loop.set_exception_handler(previous)


async def call_after_kill(bus_class: type[MessageBus]) -> tuple[str, str, list[str]]:
    """A call written after the bus daemon died: the call's error, the connection's
    disconnect (its cause, or what it raised), and what asyncio logged once they were gone.
    Errors are kept as strings: a kept traceback would keep their futures alive."""
    async with asyncio_logs() as logged:
        with start_private_bus() as bus:
            conn = bus_class(bus_address=bus.address)
            await conn.connect()
            kill(bus)
            try:
                await conn.call(get_id())
                call = "answered"
            except OSError as exc:
                call = repr(exc)
            try:
                ended = repr(await conn.wait_for_disconnect())  # type: ignore[no-untyped-call]
            except OSError as exc:
                ended = f"raised {exc!r}"
        del conn
    return call, ended, logged


async def test_a_call_that_meets_the_loss_fails_with_it_and_leaves_nothing_unretrieved() -> None:
    call, ended, logged = await call_after_kill(BusConnection)
    assert call == ended == repr(BrokenPipeError(errno.EPIPE, "Broken pipe"))
    assert logged == []


async def test_stock_dbus_fast_leaves_the_writers_error_on_futures_nobody_awaits() -> None:
    """The call itself fails with EBADF (its write registered the closed fd), leaving its
    reply's future and its write's with EPIPE, and the disconnect raises it."""
    call, ended, logged = await call_after_kill(MessageBus)
    assert call == repr(OSError(errno.EBADF, "Bad file descriptor"))
    assert ended == f"raised {BrokenPipeError(errno.EPIPE, 'Broken pipe')!r}"
    assert logged == [NEVER_RETRIEVED, NEVER_RETRIEVED]


async def test_a_lost_connection_returns_its_cause_refuses_calls_and_drops_signals() -> None:
    async with asyncio_logs() as logged:
        with start_private_bus() as bus:
            conn = BusConnection(bus.address)
            await conn.connect()
            bus.process.kill()
            cause = repr(await conn.wait_for_disconnect())  # the reader's end of file
            with pytest.raises(ConnectionError) as refused:
                await conn.call(get_id())
            refused_errno = refused.value.errno
            del refused
            sent = conn.send(ping())
            assert sent.done() and sent.result() is None
        del conn
    assert cause == repr(EOFError())
    assert refused_errno == errno.ENOTCONN
    assert logged == []


async def test_our_own_disconnect_ends_the_connection_with_no_cause() -> None:
    with start_private_bus() as bus:
        conn = BusConnection(bus.address)
        await conn.connect()
        conn.disconnect()
        assert await conn.wait_for_disconnect() is None
