"""The dbus-fast internals RdmadMessageBus (rdmad/bus/service.py) relies on, one test each.

RdmadMessageBus overrides or reads members dbus-fast does not promise to keep:
`_interface_signal_notify`, `_emit_interface_added`, `_emit_interface_removed`,
`_path_exports`, `_writer.sock`, `_negotiate_unix_fd` and `_disconnected`. A new dbus-fast
may rename them, change their arguments, or (its bus is compiled with Cython) stop calling
a Python override. Each would fail quietly in production (signals from the wrong path, a
full socket read as a lost connection), so these tests fail loudly first.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface

from rdmad.bus.names import MANAGER_PATH
from rdmad.bus.service import RdmadMessageBus, _PatientSocket
from tests.support.bus import PrivateBus

# The dbus-fast release these overrides were last read against. On a new one: re-read
# dbus_fast/message_bus.py and aio/message_bus.py for every member named above, then bump.
CHECKED_VERSION = "5.2.0"


def test_dbus_fast_is_the_release_the_overrides_were_checked_against() -> None:
    installed = importlib.metadata.version("dbus-fast")
    assert installed == CHECKED_VERSION, (
        f"dbus-fast {installed} is installed; RdmadMessageBus was checked against "
        f"{CHECKED_VERSION}: re-read the internals listed in {__name__}'s docstring"
    )


@pytest.mark.parametrize(
    ("member", "parameters"),
    [
        (
            "_interface_signal_notify",
            ["self", "interface", "interface_name", "member", "signature", "body", "unix_fds"],
        ),
        ("_emit_interface_added", ["self", "path", "interface"]),
        ("_emit_interface_removed", ["self", "path", "removed_interfaces"]),
        ("export", ["self", "path", "interface"]),
        ("unexport", ["self", "path", "interface"]),
    ],
)
def test_overridden_members_keep_their_arguments(member: str, parameters: list[str]) -> None:
    assert list(inspect.signature(getattr(MessageBus, member)).parameters) == parameters


class _Probe(ServiceInterface):
    def __init__(self) -> None:
        super().__init__("io.rdmad1.test.Probe")


class _Recording(RdmadMessageBus):
    """Records which of RdmadMessageBus's overrides dbus-fast's compiled code called."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.called: list[str] = []

    def _interface_signal_notify(self, *args: Any, **kwargs: Any) -> None:
        self.called.append("_interface_signal_notify")
        super()._interface_signal_notify(*args, **kwargs)

    def _emit_interface_added(self, path: str, interface: ServiceInterface) -> None:
        self.called.append("_emit_interface_added")
        super()._emit_interface_added(path, interface)

    def _emit_interface_removed(self, path: str, removed_interfaces: list[str]) -> None:
        self.called.append("_emit_interface_removed")
        super()._emit_interface_removed(path, removed_interfaces)


@pytest.fixture
async def bus(private_bus: PrivateBus) -> AsyncIterator[_Recording]:
    b = _Recording(bus_address=private_bus.address, negotiate_unix_fd=True)
    await b.connect()
    try:
        yield b
    finally:
        b.disconnect()


async def test_export_and_unexport_reach_the_python_overrides(bus: _Recording) -> None:
    path = MANAGER_PATH + "/device/probe"
    probe = _Probe()
    bus.export(path, probe)
    probe.emit_properties_changed({})
    bus.unexport(path)
    assert bus.called == [
        "_emit_interface_added",
        "_interface_signal_notify",
        "_emit_interface_removed",
    ]


async def test_path_exports_maps_a_path_to_its_interfaces_by_name(bus: _Recording) -> None:
    probe = _Probe()
    bus.export(MANAGER_PATH + "/claim/probe", probe)
    assert bus._path_exports[MANAGER_PATH + "/claim/probe"] == {probe.name: probe}
    bus.unexport(MANAGER_PATH + "/claim/probe")
    assert MANAGER_PATH + "/claim/probe" not in bus._path_exports


async def test_the_writer_sends_through_a_socket_we_can_wrap(bus: _Recording) -> None:
    writer = bus._writer
    assert writer is not None
    assert isinstance(writer.sock, _PatientSocket)  # wrapped by RdmadMessageBus.connect
    assert isinstance(writer.sock._sock, socket.socket)
    # The writer sends with sock.send (sendmsg only with fds): the method _PatientSocket wraps.
    source = inspect.getsource(type(writer).write_callback)
    assert "sock.send(" in source


async def test_the_connection_state_flags_exist(bus: _Recording) -> None:
    assert bus._negotiate_unix_fd is True
    assert bus._disconnected is False
