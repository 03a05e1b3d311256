"""The dbus-fast internals RdmadMessageBus (rdmad/bus/service.py) and BusConnection
(rdmad/bus/connection.py) rely on, one test each.

RdmadMessageBus works around two dbus-fast bugs (docs/kernel-notes.md, "dbus-fast 5.2.0")
through members dbus-fast does not promise to keep: it overrides `_emit_interface_added`
and `_emit_interface_removed`, and wraps `_writer.sock`, the socket
`_MessageWriter.write_callback` sends with. A new dbus-fast may rename them, change their
arguments, or (its bus is compiled with Cython) stop calling a Python override. Each would
fail quietly in production (ObjectManager signals from the wrong path, a full socket read
as a lost connection), so these tests fail loudly first. What each workaround does is
tested with the behaviour: tests/bus/test_service_objects.py (the signals' path) and
tests/bus/test_backpressure.py (a full socket).

BusConnection reads `_disconnected`, `_writer.fut`, `_disconnect_future` and
`_pending_futures`, and overrides `_finalize(err)`; its behaviour on a lost connection is
tested in tests/bus/test_connection_loss.py.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface

from rdmad.bus.connection import BusConnection
from rdmad.bus.names import MANAGER_PATH, OBJECT_MANAGER_IFACE
from rdmad.bus.service import RdmadMessageBus, _PatientSocket
from testbed.bus import PrivateBus

# The dbus-fast release these overrides were last read against. On a new one: re-read
# dbus_fast/message_bus.py and aio/message_bus.py for every member named above, then bump.
CHECKED_VERSION = "5.2.0"

PROBE_PATH = MANAGER_PATH + "/device/probe"


def test_dbus_fast_is_the_release_the_overrides_were_checked_against() -> None:
    installed = importlib.metadata.version("dbus-fast")
    assert installed == CHECKED_VERSION, (
        f"dbus-fast {installed} is installed; RdmadMessageBus was checked against "
        f"{CHECKED_VERSION}: re-read the internals listed in {__name__}'s docstring"
    )


@pytest.mark.parametrize(
    ("member", "parameters"),
    [
        ("_emit_interface_added", ["self", "path", "interface"]),
        ("_emit_interface_removed", ["self", "path", "removed_interfaces"]),
        ("_finalize", ["self", "err"]),
    ],
)
def test_overridden_members_keep_their_arguments(member: str, parameters: list[str]) -> None:
    assert list(inspect.signature(getattr(MessageBus, member)).parameters) == parameters


class _Probe(ServiceInterface):
    def __init__(self) -> None:
        super().__init__("io.rdmad1.test.Probe")


class _Recording(RdmadMessageBus):
    """Records which of RdmadMessageBus's overrides dbus-fast's compiled code called."""

    def __init__(self, bus_address: str) -> None:
        super().__init__(bus_address)
        self.called: list[str] = []

    def _emit_interface_added(self, path: str, interface: ServiceInterface) -> None:
        self.called.append("_emit_interface_added")
        super()._emit_interface_added(path, interface)

    def _emit_interface_removed(self, path: str, removed_interfaces: list[str]) -> None:
        self.called.append("_emit_interface_removed")
        super()._emit_interface_removed(path, removed_interfaces)


class _StockSignals(MessageBus):
    """Stock dbus-fast, keeping the ObjectManager signals it sends (send is public)."""

    def __init__(self, bus_address: str) -> None:
        super().__init__(bus_address=bus_address)
        self.sent: list[Message] = []

    def send(self, msg: Message) -> Any:
        if msg.message_type is MessageType.SIGNAL and msg.interface == OBJECT_MANAGER_IFACE:
            self.sent.append(msg)
        return super().send(msg)


@pytest.fixture
async def bus(private_bus: PrivateBus) -> AsyncIterator[_Recording]:
    b = _Recording(private_bus.address)
    await b.connect()
    try:
        yield b
    finally:
        b.disconnect()


async def test_export_and_unexport_reach_the_python_overrides(bus: _Recording) -> None:
    bus.export(PROBE_PATH, _Probe())
    bus.unexport(PROBE_PATH)
    assert bus.called == ["_emit_interface_added", "_emit_interface_removed"]


async def test_stock_dbus_fast_sends_object_manager_signals_from_the_objects_path(
    private_bus: PrivateBus,
) -> None:
    # The bug the overrides work around. When this fails, dbus-fast sends them from an
    # ObjectManager's path itself: drop the overrides.
    stock = _StockSignals(private_bus.address)
    await stock.connect()
    try:
        stock.export(PROBE_PATH, _Probe())
        stock.unexport(PROBE_PATH)
    finally:
        stock.disconnect()
    assert [(m.member, m.path) for m in stock.sent] == [
        ("InterfacesAdded", PROBE_PATH),
        ("InterfacesRemoved", PROBE_PATH),
    ]


async def test_the_writer_sends_through_a_socket_we_can_wrap(bus: _Recording) -> None:
    writer = bus._writer
    assert writer is not None
    assert isinstance(writer.sock, _PatientSocket)  # wrapped by RdmadMessageBus.connect
    assert isinstance(writer.sock._sock, socket.socket)
    # The writer sends with sock.send (sendmsg only with fds): the method _PatientSocket wraps.
    source = inspect.getsource(type(writer).write_callback)
    assert "sock.send(" in source


async def test_a_connection_keeps_the_state_bus_connection_reads(private_bus: PrivateBus) -> None:
    conn = BusConnection(private_bus.address)
    await conn.connect()
    try:
        assert conn._disconnected is False
        assert conn._writer is not None and hasattr(conn._writer, "fut")
        assert isinstance(conn._disconnect_future, asyncio.Future)
        assert isinstance(conn._pending_futures, set)
    finally:
        conn.disconnect()
    await conn.wait_for_disconnect()
    assert conn._disconnected is True


async def test_a_lost_connection_is_finalized_through_the_python_override(
    private_bus: PrivateBus,
) -> None:
    finalized: list[Exception | None] = []

    class Recording(BusConnection):
        def _finalize(self, err: Exception | None = None) -> None:
            finalized.append(err)
            super()._finalize(err)

    conn = Recording(private_bus.address)
    await conn.connect()
    conn.disconnect()
    await conn.wait_for_disconnect()
    assert len(finalized) == 1
