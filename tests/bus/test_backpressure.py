"""A full bus socket is back-pressure, not a lost connection."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from dbus_fast import Message
from dbus_fast.aio import MessageBus

from rdmad.bus.service import connect_bus
from testbed.bus import PrivateBus, start_private_bus

pytestmark = pytest.mark.bus  # a private dbus-daemon, each test's own: the test stops it


@contextmanager
def _reading_nothing(bus: PrivateBus) -> Iterator[None]:
    """The dbus-daemon stopped: what a connection sends stays in its socket."""
    os.kill(bus.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(bus.process.pid, signal.SIGCONT)


def _send_more_than_the_socket_holds(conn: MessageBus) -> None:
    sock = conn._sock
    assert sock is not None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    for _ in range(2000):
        conn.send(Message.new_signal("/io/rdmad1", "io.rdmad1.Test", "Ping", "s", ["x" * 512]))


async def test_bus_connection_survives_a_full_socket() -> None:
    with start_private_bus() as bus:
        conn = await connect_bus(bus.address)
        try:
            with _reading_nothing(bus):
                _send_more_than_the_socket_holds(conn)
            assert conn.connected, "EAGAIN must not count as a lost connection"
            reply = await conn.call(
                Message(
                    destination="org.freedesktop.DBus",
                    path="/org/freedesktop/DBus",
                    interface="org.freedesktop.DBus",
                    member="GetId",
                )
            )
            assert reply is not None and reply.body, "the connection still works afterwards"
        finally:
            conn.disconnect()


async def test_stock_dbus_fast_takes_a_full_socket_as_a_lost_connection() -> None:
    # The bug _PatientSocket works around. When this fails, dbus-fast waits for a full
    # socket itself: drop _PatientSocket.
    with start_private_bus() as bus:
        conn = await MessageBus(bus_address=bus.address).connect()
        try:
            # The send that met EAGAIN closed the socket, and then fails on it.
            with _reading_nothing(bus), pytest.raises(OSError):
                _send_more_than_the_socket_holds(conn)
            assert not conn.connected
            with pytest.raises(BlockingIOError):
                await conn.wait_for_disconnect()  # type: ignore[no-untyped-call]
        finally:
            conn.disconnect()
