"""The dbus-fast internals RdmadMessageBus (rdmad/bus/service.py) relies on, one test each.

RdmadMessageBus overrides or reads members dbus-fast does not promise to keep:
`_interface_signal_notify`, `_emit_interface_added`, `_emit_interface_removed`,
`_make_method_handler`, `_pending_futures`, `_path_exports`, `_writer.sock`,
`_negotiate_unix_fd` and `_disconnected`, and ServiceInterface's `_msg_body_to_args` and
`_fn_result_to_body`. A new dbus-fast may rename them, change their arguments, or (its bus
is compiled with Cython) stop calling a Python override. Each would fail quietly in
production (signals from the wrong path, a full socket read as a lost connection, replies
late or lost), so these tests fail loudly first.
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
from dbus_fast.annotations import DBusStr
from dbus_fast.service import ServiceInterface, dbus_method

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
        ("_make_method_handler", ["self", "interface", "method"]),
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
    """Records which of RdmadMessageBus's overrides dbus-fast's compiled code called, and
    the method returns it sent."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.called: list[str] = []
        self.log: list[str] = []

    def send(self, msg: Message) -> Any:  # aio: a Future; its base class: None
        if msg.message_type == MessageType.METHOD_RETURN:
            self.log.append(f"reply {msg.body[0]}")
        return super().send(msg)

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


class _Held(ServiceInterface):
    """Its Wait calls return their tag once `go` is set, logging when each runs on."""

    def __init__(self, log: list[str]) -> None:
        super().__init__("io.rdmad1.test.Held")
        self.log = log
        self.waiting = 0
        self.all_waiting = asyncio.Event()
        self.go = asyncio.Event()

    @dbus_method()
    async def Wait(self, tag: DBusStr) -> DBusStr:
        self.waiting += 1
        if self.waiting == 2:
            self.all_waiting.set()
        await self.go.wait()
        self.log.append(f"ran {tag}")
        return tag


async def test_an_async_methods_reply_is_sent_as_it_returns(
    bus: _Recording, private_bus: PrivateBus
) -> None:
    # Two calls resumed in one loop turn: the first's reply goes out before the second runs
    # on (stock dbus-fast sends both replies a turn later, after both have run).
    held = _Held(bus.log)
    bus.export("/io/rdmad1/test", held)
    client = await MessageBus(bus_address=private_bus.address).connect()
    try:

        def call(tag: str) -> Message:
            return Message(
                destination=bus.unique_name,
                path="/io/rdmad1/test",
                interface=held.name,
                member="Wait",
                signature="s",
                body=[tag],
            )

        calls = asyncio.gather(client.call(call("a")), client.call(call("b")))
        await asyncio.wait_for(held.all_waiting.wait(), 5)
        held.go.set()
        replies = await asyncio.wait_for(calls, 5)
    finally:
        client.disconnect()
    assert [r.body for r in replies if r is not None] == [["a"], ["b"]]
    assert bus.log == ["ran a", "reply a", "ran b", "reply b"]
