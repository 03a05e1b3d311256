"""The io.rdmad1 service: exports the Manager, one object per device and per claim, and
keeps them in step with the core as a CoreObserver (machined's machine-dbus.c role).

Wiring (rdmad.daemon):

    bus = await connect_bus(address)            # None: the system bus
    service = await start_service(bus, core, resolver, allowed_gid)
    ...                                         # run
    await service.stop()

start_service exports every object first and requests io.rdmad1 last, so a client that
sees the name can already call everything.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
from collections.abc import Callable
from typing import Any

from dbus_fast import BusType, Message, NameFlag, RequestNameReply, Variant
from dbus_fast.aio import MessageBus
from dbus_fast.send_reply import SendReply
from dbus_fast.service import ServiceInterface, _Method

from rdmad.backend import NetnsResolver
from rdmad.bus.credentials import Credentials
from rdmad.bus.names import (
    BUS_NAME,
    MANAGER_PATH,
    OBJECT_MANAGER_IFACE,
    claim_path,
    device_path,
)
from rdmad.bus.objects import (
    ClaimInterface,
    CoreAPI,
    DeviceInterface,
    ManagerInterface,
    gid_rows,
)
from rdmad.model import Claim, DeviceView, NetnsMode, ReleaseReason
from rdmad.observer import CoreObserver


class NameTaken(RuntimeError):
    """Another connection owns io.rdmad1: another rdmad is running.

    Raised by start_service only, before rdmad owns the name (the daemon exits with its
    message): it never reaches a D-Bus caller, so it is not an RdmadError."""


class _PatientSocket:
    """The bus socket as dbus-fast's writer sees it, with EAGAIN meaning "not now".

    dbus-fast (like dbus-next, python-dbus-next#153) takes EAGAIN from a full socket as a
    lost connection, so a burst of replies (64 clients calling ListDevices) made rdmad
    exit. Reporting 0 bytes sent makes its writer wait for the socket to drain instead.
    sendmsg (fd passing) is left alone: rdmad never sends fds.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def send(self, data: memoryview) -> int:
        try:
            return self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            return 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


class RdmadMessageBus(MessageBus):
    """A MessageBus that
    - survives a full socket (see _PatientSocket);
    - sends ObjectManager.InterfacesAdded/Removed from the manager's path, as the D-Bus
      spec says and GDBus/sd-bus clients expect (stock dbus-fast sends them from the child
      object's own path, which ObjectManager clients ignore);
    - finds a signal's object path in a dict: stock dbus-fast searches every exported
      object for each signal, 1000+ of them on a big node;
    - replies to an async method at the end of the method's own run (see
      _make_method_handler)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._paths: dict[ServiceInterface, str] = {}

    async def connect(self) -> MessageBus:
        await super().connect()
        writer = self._writer
        assert writer is not None and writer.sock is not None
        writer.sock = _PatientSocket(writer.sock)  # type: ignore[assignment]
        return self

    def export(self, path: str, interface: ServiceInterface) -> None:
        super().export(path, interface)
        self._paths[interface] = path

    def unexport(self, path: str, interface: ServiceInterface | str | None = None) -> None:
        before = list(self._path_exports.get(path, {}).values())
        super().unexport(path, interface)  # dbus-fast decides which of them go
        after = self._path_exports.get(path, {}).values()
        for i in before:
            if i not in after:
                self._paths.pop(i, None)

    def _interface_signal_notify(
        self,
        interface: ServiceInterface,
        interface_name: str,
        member: str,
        signature: str,
        body: list[Any],
        unix_fds: list[int] | None = None,
    ) -> None:
        path = self._paths.get(interface)
        if path is None:  # not exported by us: dbus-fast's own search and error
            super()._interface_signal_notify(
                interface, interface_name, member, signature, body, unix_fds or []
            )
            return
        self.send(Message.new_signal(path, interface_name, member, signature, body, unix_fds))

    def _make_method_handler(
        self, interface: ServiceInterface, method: _Method
    ) -> Callable[[Message, Callable[[Message], None]], None]:
        """Stock dbus-fast replies to an async method from its task's done callback, which
        asyncio runs a loop turn after the method returns. When many calls finish in one turn
        (64 shared claims at once resume together), every reply waited for the last of them:
        each claim's reply at 1.5-2x the time the same claim of a serial sequence was done
        (docs/performance.md, "Bursts"). Here the reply is sent as the method returns, with
        the same error replies (SendReply); calls that want no reply keep the stock path."""
        stock = super()._make_method_handler(interface, method)
        if not inspect.iscoroutinefunction(method.fn):
            return stock
        negotiate_fds = self._negotiate_unix_fd

        async def run(msg: Message, send_reply: SendReply) -> None:
            with send_reply:
                args = ServiceInterface._msg_body_to_args(msg) if msg.unix_fds else msg.body
                result = await method.fn(interface, *args)
                body, fds = ServiceInterface._fn_result_to_body(
                    result, method.out_signature_tree, replace_fds=negotiate_fds
                )
                send_reply(Message.new_method_return(msg, method.out_signature, body, fds))

        def handler(msg: Message, send_reply: Callable[[Message], None]) -> None:
            if not isinstance(send_reply, SendReply):  # NO_REPLY_EXPECTED
                stock(msg, send_reply)
                return
            task = asyncio.ensure_future(run(msg, send_reply))
            self._pending_futures.add(task)  # a strong reference until it is done
            task.add_done_callback(self._pending_futures.discard)

        return handler

    def _emit_interface_added(self, path: str, interface: ServiceInterface) -> None:
        if self._disconnected or not path.startswith(MANAGER_PATH + "/"):
            return
        props = getattr(interface, "all_properties", None)
        body: dict[str, dict[str, Variant]] = {interface.name: props() if props else {}}
        self.send(
            Message.new_signal(
                MANAGER_PATH, OBJECT_MANAGER_IFACE, "InterfacesAdded", "oa{sa{sv}}", [path, body]
            )
        )

    def _emit_interface_removed(self, path: str, removed_interfaces: list[str]) -> None:
        if self._disconnected or not path.startswith(MANAGER_PATH + "/"):
            return
        self.send(
            Message.new_signal(
                MANAGER_PATH,
                OBJECT_MANAGER_IFACE,
                "InterfacesRemoved",
                "oas",
                [path, removed_interfaces],
            )
        )


async def connect_bus(address: str | None = None) -> MessageBus:
    """Connect to `address`, or the system bus (DBUS_SYSTEM_BUS_ADDRESS is honoured by
    dbus-fast). Unix fd passing is on: ClaimFd needs it."""
    bus = RdmadMessageBus(bus_address=address, bus_type=BusType.SYSTEM, negotiate_unix_fd=True)
    await bus.connect()
    return bus


class Service(CoreObserver):
    """Owns the exported objects; a CoreObserver."""

    def __init__(
        self, bus: MessageBus, core: CoreAPI, resolver: NetnsResolver, allowed_gid: int | None
    ) -> None:
        self.bus = bus
        self.core = core
        self.credentials = Credentials(bus, allowed_gid)
        self.manager = ManagerInterface(
            core, resolver, self.credentials, self._export_claim, bus._negotiate_unix_fd
        )
        self._devices: dict[str, DeviceInterface] = {}
        self._claims: dict[str, ClaimInterface] = {}

    # -- exports (idempotent: the observer and the enumeration may both see a thing) --

    def _export_device(self, view: DeviceView) -> bool:
        name = view.device.name
        if name in self._devices:
            self._update_device(view)
            return False
        self._devices[name] = DeviceInterface(view, self.core)
        self.bus.export(device_path(name), self._devices[name])
        return True

    def _update_device(self, view: DeviceView) -> None:
        obj = self._devices.get(view.device.name)
        if obj is None:
            self._export_device(view)
            return
        changed = obj.update(view)
        if changed:
            obj.emit_properties_changed(changed)

    def _export_claim(self, claim: Claim) -> str:
        path = claim_path(claim.id)
        if claim.id not in self._claims:
            self._claims[claim.id] = ClaimInterface(claim, self.core, self.credentials)
            self.bus.export(path, self._claims[claim.id])
        return path

    # -- CoreObserver --

    def device_added(self, view: DeviceView) -> None:
        if self._export_device(view):
            self.manager.DeviceAdded(view.device.name, device_path(view.device.name))

    def device_removed(self, view: DeviceView) -> None:
        name = view.device.name
        if self._devices.pop(name, None) is not None:
            self.bus.unexport(device_path(name))
            self.manager.DeviceRemoved(name, device_path(name))

    def device_changed(self, view: DeviceView) -> None:
        self._update_device(view)

    def claimed(self, claim: Claim) -> None:
        fresh = claim.id not in self._claims
        path = self._export_claim(claim)
        if fresh:
            self.manager.Claimed(claim.id, claim.device, path)

    def claim_changed(self, claim: Claim) -> None:
        obj = self._claims.get(claim.id)
        if obj is not None:
            obj.emit_properties_changed({"Gids": gid_rows(claim)})

    def released(self, claim: Claim, reason: ReleaseReason) -> None:
        if self._claims.pop(claim.id, None) is not None:
            self.bus.unexport(claim_path(claim.id))
        self.manager.Released(claim.id, claim.device, str(reason))

    def mode_changed(self, mode: NetnsMode) -> None:
        self.manager.emit_properties_changed({"NetnsMode": str(mode)})

    # -- lifetime --

    async def stop(self) -> None:
        """Give up the name first (new callers get ServiceUnknown), then the objects."""
        if self.bus.connected:
            await self.bus.release_name(BUS_NAME)
        for claim_id in list(self._claims):
            self.bus.unexport(claim_path(claim_id))
        for name in list(self._devices):
            self.bus.unexport(device_path(name))
        self.bus.unexport(MANAGER_PATH)
        self._claims.clear()
        self._devices.clear()
        self.credentials.stop()


async def start_service(
    bus: MessageBus,
    core: CoreAPI,
    resolver: NetnsResolver,
    allowed_gid: int | None = None,
) -> Service:
    """Export everything, subscribe to the core, then take io.rdmad1 (last).

    `core` is an rdmad.core.Core (objects.CoreAPI lists what the bus edge uses of it).
    Raises NameTaken if another rdmad runs.
    """
    service = Service(bus, core, resolver, allowed_gid)
    await service.credentials.start()
    bus.export(MANAGER_PATH, service.manager)
    # Subscribe, then enumerate: nothing awaits in between, and exports are idempotent.
    core.add_observer(service)
    for view in core.devices():
        service._export_device(view)
    for claim in core.claims():
        service._export_claim(claim)
    reply = await bus.request_name(BUS_NAME, NameFlag.DO_NOT_QUEUE)
    if reply not in (RequestNameReply.PRIMARY_OWNER, RequestNameReply.ALREADY_OWNER):
        await service.stop()
        raise NameTaken(f"{BUS_NAME} is already owned on this bus ({reply.name})")
    return service
