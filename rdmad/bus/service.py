"""The io.rdmad1 service: exports the Manager, one object per device and per claim, and
keeps them in step with the core as a CoreObserver (machined's machine-dbus.c role).

Wiring (rdmad.daemon.main):

    bus = await connect_bus(address)            # None: the system bus
    service = await start_service(bus, core, resolver)
    ...                                         # run
    await service.stop()

start_service exports every object first and requests io.rdmad1 last, so a client that
sees the name can already call everything.
"""

from __future__ import annotations

import socket

from dbus_fast import Message, MessageType, NameFlag, RequestNameReply, Variant
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface

from rdmad.bus.connection import BusConnection
from rdmad.bus.credentials import Credentials
from rdmad.bus.mapping import to_dbus_error
from rdmad.bus.names import (
    BUS_NAME,
    CLAIM_IFACE,
    CLAIM_PREFIX,
    DEVICE_IFACE,
    MANAGER_IFACE,
    MANAGER_PATH,
    claim_path,
    device_path,
)
from rdmad.bus.objects import (
    CLAIMED,
    DEVICE_ADDED,
    DEVICE_REMOVED,
    MANAGER_PROPERTIES,
    RELEASED,
    ClaimInterface,
    CoreAPI,
    DeviceInterface,
    ManagerInterface,
)
from rdmad.bus.polkit import AUTHORIZATION_TIMEOUT, Polkit
from rdmad.bus.signals import INTERFACES_ADDED, INTERFACES_REMOVED, PROPERTIES_CHANGED
from rdmad.core.backend import NetnsResolver
from rdmad.core.observer import CoreObserver
from rdmad.errors import InvalidArgs, NoSuchClaim
from rdmad.model import Claim, DeviceView, NetnsMode, ReleaseReason


class NameTaken(RuntimeError):
    """Another connection owns io.rdmad1: another rdmad is running.

    Raised by start_service only, before rdmad owns the name (the daemon exits with its
    message): it never reaches a D-Bus caller, so it is not an RdmadError."""


class _PatientSocket:
    """The bus socket as dbus-fast's writer sees it, with EAGAIN meaning "not now".

    dbus-fast's writer takes EAGAIN from a full socket as a lost connection, so a burst of
    replies (64 clients calling ListDevices) made rdmad exit. Reporting 0 bytes sent makes
    it wait for the socket to drain instead. sendmsg (fd passing) is left alone: rdmad
    never sends fds.
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


class RdmadMessageBus(BusConnection):
    """The system bus (or `bus_address`), with unix fd passing on (ClaimFd needs it), and
    dbus-fast bugs worked around through its private members (docs/kernel-notes.md,
    "dbus-fast"; tests/bus/test_dbus_fast_contract.py):
    - a full socket is back-pressure, not a lost connection (_PatientSocket);
    - ObjectManager.InterfacesAdded/Removed come from the manager's path, as the D-Bus
      spec says and GDBus/sd-bus clients expect (stock dbus-fast sends them from the
      child object's own path, which ObjectManager clients ignore);
    - a lost connection (dbus-daemon gone) ends rdmad's use of the bus cleanly, as it
      does its clients' (BusConnection; tests/reliability/test_bus_loss.py)."""

    def __init__(self, bus_address: str | None = None) -> None:
        super().__init__(bus_address, negotiate_unix_fd=True)

    async def connect(self) -> MessageBus:
        await super().connect()
        writer = self._writer
        assert writer is not None and writer.sock is not None
        writer.sock = _PatientSocket(writer.sock)  # type: ignore[assignment]
        return self

    def _emit_interface_added(self, path: str, interface: ServiceInterface) -> None:
        if not self.connected or not path.startswith(MANAGER_PATH + "/"):
            return
        props = getattr(interface, "all_properties", None)
        body: dict[str, dict[str, Variant]] = {interface.name: props() if props else {}}
        self.send(INTERFACES_ADDED.message(MANAGER_PATH, (path, body)))

    def _emit_interface_removed(self, path: str, removed_interfaces: list[str]) -> None:
        if not self.connected or not path.startswith(MANAGER_PATH + "/"):
            return
        self.send(INTERFACES_REMOVED.message(MANAGER_PATH, (path, removed_interfaces)))


async def connect_bus(address: str | None = None) -> RdmadMessageBus:
    """Connect to `address`, or the system bus (DBUS_SYSTEM_BUS_ADDRESS is honoured by
    dbus-fast)."""
    bus = RdmadMessageBus(address)
    await bus.connect()
    return bus


_CLAIM_PATHS = CLAIM_PREFIX + "/"  # a claim's path is this and its id (ids need no escape)


def _refuse_claim_fd_without_its_fd(msg: Message) -> None:
    """A ClaimFd call must carry its netns fd. Without one, dbus-fast hands the `h`
    argument to the method as a bare number, and ClaimFd would adopt, then close, rdmad's
    own fd of that number. (A bus message handler: it sees the call before the method.)"""
    if (
        msg.message_type is MessageType.METHOD_CALL
        and msg.path == MANAGER_PATH
        and msg.member == "ClaimFd"
        and not msg.unix_fds
    ):
        raise to_dbus_error(InvalidArgs("ClaimFd's netns must be a file descriptor sent with it"))


class Service(CoreObserver):
    """Owns the exported objects; a CoreObserver. It sends every signal itself, from the
    path it knows (rdmad.bus.signals says why)."""

    def __init__(
        self,
        bus: RdmadMessageBus,
        core: CoreAPI,
        resolver: NetnsResolver,
        authorization_timeout: float,
    ) -> None:
        self.bus = bus
        self.core = core
        self.credentials = Credentials(bus, Polkit(bus, authorization_timeout))
        self.manager = ManagerInterface(core, resolver, self.credentials, self._export_claim)
        self._devices: dict[str, DeviceInterface] = {}
        self._claims: dict[str, ClaimInterface] = {}

    def _send(self, signal: Message) -> None:
        if self.bus.connected:  # as dbus-fast's own signals: none once the bus is gone
            self.bus.send(signal)

    def _properties_changed(self, path: str, interface: str, changed: dict[str, Variant]) -> None:
        self._send(PROPERTIES_CHANGED.message(path, (interface, changed, [])))

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
            self._properties_changed(device_path(view.device.name), DEVICE_IFACE, changed)

    def _refuse_calls_on_ended_claims(self, msg: Message) -> None:
        """A claim's object goes when the claim ends: a call on its path after that (a
        Release that raced the netns's death) gets NoSuchClaim, not dbus-fast's
        UnknownMethod. (A bus message handler: it sees the call before dispatch.)"""
        path = msg.path or ""  # every call has one; dbus-fast types it optional
        if (
            msg.message_type is MessageType.METHOD_CALL
            and path.startswith(_CLAIM_PATHS)
            and path[len(_CLAIM_PATHS) :] not in self._claims
        ):
            raise to_dbus_error(NoSuchClaim(f"no claim at {path}: it has ended"))

    def _export_claim(self, claim: Claim) -> str:
        path = claim_path(claim.id)
        if claim.id not in self._claims:
            self._claims[claim.id] = ClaimInterface(claim, self.core, self.credentials)
            self.bus.export(path, self._claims[claim.id])
        return path

    # -- CoreObserver --

    def device_added(self, view: DeviceView) -> None:
        if self._export_device(view):
            path = device_path(view.device.name)
            self._send(DEVICE_ADDED.message(MANAGER_PATH, (view.device.name, path)))

    def device_removed(self, view: DeviceView) -> None:
        name = view.device.name
        if self._devices.pop(name, None) is not None:
            self.bus.unexport(device_path(name))
            self._send(DEVICE_REMOVED.message(MANAGER_PATH, (name, device_path(name))))

    def device_changed(self, view: DeviceView) -> None:
        self._update_device(view)

    def claimed(self, claim: Claim) -> None:
        fresh = claim.id not in self._claims
        path = self._export_claim(claim)
        if fresh:
            self._send(CLAIMED.message(MANAGER_PATH, (claim.id, claim.device, path)))

    def claim_changed(self, claim: Claim) -> None:
        exported = self._claims.get(claim.id)
        if exported is not None:
            changed = exported.changed()
            if changed:
                self._properties_changed(claim_path(claim.id), CLAIM_IFACE, changed)

    def released(self, claim: Claim, reason: ReleaseReason) -> None:
        if self._claims.pop(claim.id, None) is not None:
            self.bus.unexport(claim_path(claim.id))
        self._send(RELEASED.message(MANAGER_PATH, (claim.id, claim.device, str(reason))))

    def mode_changed(self, mode: NetnsMode) -> None:
        # Read as NetnsMode's Get reads it (the core holds `mode` already), typed by its row.
        changed = MANAGER_PROPERTIES.variants(self.core, "NetnsMode")
        self._properties_changed(MANAGER_PATH, MANAGER_IFACE, changed)

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
        self.bus.remove_message_handler(_refuse_claim_fd_without_its_fd)
        self.bus.remove_message_handler(self._refuse_calls_on_ended_claims)
        self._claims.clear()
        self._devices.clear()
        self.credentials.stop()


async def start_service(
    bus: RdmadMessageBus,
    core: CoreAPI,
    resolver: NetnsResolver,
    authorization_timeout: float = AUTHORIZATION_TIMEOUT,
) -> Service:
    """Export everything, subscribe to the core, then take io.rdmad1 (last).

    `core` is an rdmad.core.core.Core (objects.CoreAPI lists what the bus edge uses of it).
    `authorization_timeout` bounds each wait for polkit's answer. Raises NameTaken if
    another rdmad runs.
    """
    service = Service(bus, core, resolver, authorization_timeout)
    await service.credentials.start()
    bus.add_message_handler(_refuse_claim_fd_without_its_fd)
    bus.add_message_handler(service._refuse_calls_on_ended_claims)
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
