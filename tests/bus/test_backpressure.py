"""A full bus socket is back-pressure, not a lost connection."""

from __future__ import annotations

import os
import signal
import socket

from dbus_fast import Message

from rdmad.bus.service import connect_bus
from tests.support.bus import start_private_bus


async def test_bus_connection_survives_a_full_socket() -> None:
    with start_private_bus() as bus:
        conn = await connect_bus(bus.address)
        try:
            sock = conn._sock
            assert sock is not None
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            # A stopped dbus-daemon reads nothing: the socket fills and send() says EAGAIN.
            os.kill(bus.process.pid, signal.SIGSTOP)
            try:
                for _ in range(2000):
                    conn.send(
                        Message.new_signal("/io/rdmad1", "io.rdmad1.Test", "Ping", "s", ["x" * 512])
                    )
                assert conn.connected, "EAGAIN must not count as a lost connection"
            finally:
                os.kill(bus.process.pid, signal.SIGCONT)
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
