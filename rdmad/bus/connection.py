"""A bus connection whose loss (dbus-daemon gone or restarted) ends its use cleanly, for
rdmad and its clients alike: one cause to report, no traceback per message in flight.

dbus-fast, once the connection is lost, still writes to the closed socket, and leaves the
writer's error on futures nobody awaits (docs/kernel-notes.md, "dbus-fast"; the daemon's
workarounds of its other bugs are in rdmad.bus.service)."""

from __future__ import annotations

import asyncio
import errno

from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus


def _dropped() -> asyncio.Future[None]:
    """What send returns for a message the lost connection will never carry."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    return done


class BusConnection(MessageBus):
    """The system bus (or `bus_address`). Once the connection is lost, a message to send
    is dropped or refused (send), and the loss's cause is returned, not raised, by
    wait_for_disconnect (tests/bus/test_connection_loss.py)."""

    def __init__(self, bus_address: str | None = None, *, negotiate_unix_fd: bool = False) -> None:
        super().__init__(
            bus_address=bus_address, bus_type=BusType.SYSTEM, negotiate_unix_fd=negotiate_unix_fd
        )

    # aio.MessageBus.send returns a Future where BaseMessageBus.send returns None.
    def send(self, msg: Message) -> asyncio.Future[None]:  # type: ignore[override]
        """Once the connection is lost, dbus-fast still schedules the write on the closed
        socket, and the event loop raises KeyError, then EBADF, out of whatever sent (a
        method's reply, a signal, a call). A reply or signal then has no one to reach: it
        is dropped. A call is refused with ENOTCONN."""
        if self._disconnected:
            if msg.message_type is MessageType.METHOD_CALL:
                raise ConnectionError(errno.ENOTCONN, "the bus connection is lost")
            return _dropped()
        try:
            return super().send(msg)
        except OSError:
            if not self._disconnected:
                raise
            # This very write found the connection lost: dbus-fast closed the socket (and
            # failed every call awaiting a reply, this one's too), then registered the
            # closed fd for writing.
            return _dropped()

    def _finalize(self, err: Exception | None = None) -> None:
        """The loss's error is the cause wait_for_disconnect returns, not asyncio's to log as
        "Future exception was never retrieved" from the futures dbus-fast leaves it on: the
        message the writer was writing (a call's, which its sender never sees, or a
        signal's, which nobody awaits), and the disconnect future (no one waits on it
        between a client's calls, as rdmad-exporter's between scrapes)."""
        super()._finalize(err)
        writer = self._writer
        for future in (writer.fut if writer else None, self._disconnect_future):
            if future is not None and future.done() and not future.cancelled():
                future.exception()

    async def wait_for_disconnect(self) -> Exception | None:
        """The lost connection's cause (the reader's EOFError, the writer's OSError), or
        None after our own disconnect(); returned once the method calls this connection
        serves in flight have ended, so that a daemon's work is finished, not cut off
        half-way by its exit (their replies are dropped)."""
        try:
            await super().wait_for_disconnect()  # type: ignore[no-untyped-call]
            cause: Exception | None = None
        except Exception as exc:
            cause = exc
        while self._pending_futures:
            await asyncio.wait(set(self._pending_futures))
        return cause
