"""The exported objects: io.rdmad1.Manager, io.rdmad1.Device, io.rdmad1.Claim.

No `from __future__ import annotations` here: dbus-fast reads the annotations of D-Bus
members at class creation, so they must be real objects (typing.Annotated carrying a
DBusSignature), which also keeps mypy and ruff happy without string signatures.
"""

import os
from collections.abc import Callable
from typing import Annotated, Protocol

from dbus_fast import Variant
from dbus_fast.annotations import (
    DBusBool,
    DBusDict,
    DBusInt32,
    DBusObjectPath,
    DBusSignature,
    DBusStr,
    DBusUInt32,
    DBusUInt64,
    DBusUnixFd,
)
from dbus_fast.constants import PropertyAccess
from dbus_fast.service import ServiceInterface, dbus_method, dbus_property, dbus_signal

from rdmad import __version__
from rdmad.backend import NetnsResolver, NetnsTarget
from rdmad.bus.credentials import Credentials
from rdmad.bus.mapping import bus_errors
from rdmad.bus.names import CLAIM_IFACE, DEVICE_IFACE, MANAGER_IFACE, claim_path, device_path
from rdmad.errors import InvalidArgs
from rdmad.model import Claim, ClaimOptions, DeviceView, NetnsMode, ReleaseReason
from rdmad.observer import CoreObserver
from rdmad.options import parse_claim_options, parse_netns_mode

READ = PropertyAccess.READ

DeviceRow = tuple[str, str, str, str]
ClaimRow = tuple[str, str, str, str, str, str]
PortRow = tuple[int, str, str, str]
CharDevRow = tuple[str, int, int]


class CoreAPI(Protocol):
    """What the bus edge needs from rdmad.core.Core (which satisfies it structurally)."""

    netns_mode: NetnsMode

    def add_observer(self, observer: CoreObserver) -> None: ...

    def devices(self) -> list[DeviceView]: ...

    def device(self, name: str) -> DeviceView: ...

    def claims(self) -> list[Claim]: ...

    def get_claim(self, claim_id: str) -> Claim: ...

    async def claim(self, device: str, target: NetnsTarget, options: ClaimOptions) -> Claim: ...

    async def release(
        self, claim_id: str, reason: ReleaseReason = ReleaseReason.REQUESTED
    ) -> None: ...

    async def set_netns_mode(self, mode: NetnsMode) -> None: ...


def claim_options(raw: dict[str, Variant]) -> ClaimOptions:
    """a{sv} as received → validated ClaimOptions (InvalidArgs on anything wrong)."""
    return parse_claim_options({k: (v.signature, v.value) for k, v in raw.items()})


class ManagerInterface(ServiceInterface):
    def __init__(
        self,
        core: CoreAPI,
        resolver: NetnsResolver,
        credentials: Credentials,
        claim_exported: Callable[[Claim], str],
        fds_negotiated: bool,
    ) -> None:
        super().__init__(MANAGER_IFACE)
        self._core = core
        self._resolver = resolver
        self._credentials = credentials
        self._claim_exported = claim_exported
        self._fds_negotiated = fds_negotiated

    @dbus_method()
    @bus_errors
    async def ListDevices(self) -> Annotated[list[DeviceRow], DBusSignature("a(ssso)")]:
        return [
            (v.device.name, str(v.state), v.device.netdev, device_path(v.device.name))
            for v in self._core.devices()
        ]

    @dbus_method()
    @bus_errors
    async def GetDevice(self, name: DBusStr) -> DBusObjectPath:
        return device_path(self._core.device(name).device.name)

    @dbus_method()
    @bus_errors
    async def ListClaims(self) -> Annotated[list[ClaimRow], DBusSignature("a(ssssso)")]:
        return [
            (c.id, c.device, c.netns, c.ifname, c.owner, claim_path(c.id))
            for c in self._core.claims()
        ]

    @dbus_method()
    @bus_errors
    async def Claim(self, device: DBusStr, netns: DBusStr, options: DBusDict) -> DBusObjectPath:
        await self._credentials.require_privileged("Claim")
        parsed = claim_options(options)  # before opening anything
        target = self._resolver.open(netns)
        claim = await self._core.claim(device, target, parsed)
        return self._claim_exported(claim)

    @dbus_method()
    @bus_errors
    async def ClaimFd(
        self, device: DBusStr, netns: DBusUnixFd, options: DBusDict
    ) -> DBusObjectPath:
        try:
            await self._credentials.require_privileged("ClaimFd")
            if not self._fds_negotiated:
                raise InvalidArgs("this connection of rdmad cannot receive file descriptors")
            parsed = claim_options(options)
            target = self._resolver.adopt_fd(netns)  # dup'ed: ours is closed below
        finally:
            if self._fds_negotiated:
                os.close(netns)  # dbus-fast hands received fds over and never closes them
        claim = await self._core.claim(device, target, parsed)
        return self._claim_exported(claim)

    @dbus_method()
    @bus_errors
    async def Release(self, claim_id: DBusStr) -> None:
        await self._credentials.require_privileged("Release")
        await self._core.release(claim_id, ReleaseReason.REQUESTED)

    @dbus_method()
    @bus_errors
    async def SetNetnsMode(self, mode: DBusStr) -> None:
        await self._credentials.require_privileged("SetNetnsMode")
        await self._core.set_netns_mode(parse_netns_mode(mode))

    # Signals: calling the method emits it with the returned values.
    @dbus_signal()
    def DeviceAdded(self, name: str, path: str) -> Annotated[tuple[str, str], DBusSignature("so")]:
        return (name, path)

    @dbus_signal()
    def DeviceRemoved(
        self, name: str, path: str
    ) -> Annotated[tuple[str, str], DBusSignature("so")]:
        return (name, path)

    @dbus_signal()
    def Claimed(
        self, claim_id: str, device: str, path: str
    ) -> Annotated[tuple[str, str, str], DBusSignature("sso")]:
        return (claim_id, device, path)

    @dbus_signal()
    def Released(
        self, claim_id: str, device: str, reason: str
    ) -> Annotated[tuple[str, str, str], DBusSignature("sss")]:
        return (claim_id, device, reason)

    @dbus_property(access=READ)
    def Version(self) -> DBusStr:
        return __version__

    @dbus_property(access=READ)
    def NetnsMode(self) -> DBusStr:
        return str(self._core.netns_mode)


def device_properties(view: DeviceView) -> dict[str, object]:
    """Every io.rdmad1.Device property of `view`, by D-Bus name."""
    d = view.device
    return {
        "Name": d.name,
        "Index": d.index,
        "NodeGuid": d.node_guid,
        "Driver": d.driver,
        "LinkLayer": d.link_layer,
        "Ports": [(p.index, p.state, p.phys_state, p.netdev) for p in d.ports],
        "NetDevice": d.netdev,
        "PciAddress": d.pci_address,
        "NumaNode": d.numa_node,
        "CharDevices": list(d.chardevs),
        "State": str(view.state),
        "Netns": view.netns,
        "Claims": [claim_path(c) for c in view.claims],
    }


DEVICE_SIGNATURES = {
    "Name": "s",
    "Index": "u",
    "NodeGuid": "s",
    "Driver": "s",
    "LinkLayer": "s",
    "Ports": "a(usss)",
    "NetDevice": "s",
    "PciAddress": "s",
    "NumaNode": "i",
    "CharDevices": "as",
    "State": "s",
    "Netns": "s",
    "Claims": "ao",
}

CLAIM_SIGNATURES = {
    "Id": "s",
    "Device": "s",
    "Netns": "s",
    "NetnsPath": "s",
    "InterfaceName": "s",
    "Shared": "b",
    "Owner": "s",
    "CharDevices": "a(suu)",
    "CdiDevice": "s",
    "CreatedAt": "t",
}


def claim_properties(claim: Claim) -> dict[str, object]:
    """Every io.rdmad1.Claim property of `claim`, by D-Bus name."""
    return {
        "Id": claim.id,
        "Device": claim.device,
        "Netns": claim.netns,
        "NetnsPath": claim.netns_path,
        "InterfaceName": claim.ifname,
        "Shared": claim.shared,
        "Owner": claim.owner,
        "CharDevices": [(c.path, c.major, c.minor) for c in claim.chardevs],
        "CdiDevice": claim.cdi_device,
        "CreatedAt": claim.created_at_us,
    }


def _variants(values: dict[str, object], signatures: dict[str, str]) -> dict[str, Variant]:
    return {name: Variant(signatures[name], value) for name, value in values.items()}


class DeviceInterface(ServiceInterface):
    def __init__(self, view: DeviceView) -> None:
        super().__init__(DEVICE_IFACE)
        self._view = view

    def update(self, view: DeviceView) -> dict[str, object]:
        """Take a new view; returns the properties whose values changed."""
        old, new = device_properties(self._view), device_properties(view)
        self._view = view
        return {k: v for k, v in new.items() if old[k] != v}

    def all_properties(self) -> dict[str, Variant]:
        """For ObjectManager.InterfacesAdded."""
        return _variants(device_properties(self._view), DEVICE_SIGNATURES)

    @dbus_property(access=READ)
    def Name(self) -> DBusStr:
        return self._view.device.name

    @dbus_property(access=READ)
    def Index(self) -> DBusUInt32:
        return self._view.device.index

    @dbus_property(access=READ)
    def NodeGuid(self) -> DBusStr:
        return self._view.device.node_guid

    @dbus_property(access=READ)
    def Driver(self) -> DBusStr:
        return self._view.device.driver

    @dbus_property(access=READ)
    def LinkLayer(self) -> DBusStr:
        return self._view.device.link_layer

    @dbus_property(access=READ)
    def Ports(self) -> Annotated[list[PortRow], DBusSignature("a(usss)")]:
        return [(p.index, p.state, p.phys_state, p.netdev) for p in self._view.device.ports]

    @dbus_property(access=READ)
    def NetDevice(self) -> DBusStr:
        return self._view.device.netdev

    @dbus_property(access=READ)
    def PciAddress(self) -> DBusStr:
        return self._view.device.pci_address

    @dbus_property(access=READ)
    def NumaNode(self) -> DBusInt32:
        return self._view.device.numa_node

    @dbus_property(access=READ)
    def CharDevices(self) -> Annotated[list[str], DBusSignature("as")]:
        return list(self._view.device.chardevs)

    @dbus_property(access=READ)
    def State(self) -> DBusStr:
        return str(self._view.state)

    @dbus_property(access=READ)
    def Netns(self) -> DBusStr:
        return self._view.netns

    @dbus_property(access=READ)
    def Claims(self) -> Annotated[list[str], DBusSignature("ao")]:
        return [claim_path(c) for c in self._view.claims]


class ClaimInterface(ServiceInterface):
    def __init__(self, claim: Claim, core: CoreAPI, credentials: Credentials) -> None:
        super().__init__(CLAIM_IFACE)
        self.claim = claim
        self._core = core
        self._credentials = credentials

    def all_properties(self) -> dict[str, Variant]:
        """For ObjectManager.InterfacesAdded."""
        return _variants(claim_properties(self.claim), CLAIM_SIGNATURES)

    @dbus_method()
    @bus_errors
    async def Release(self) -> None:
        await self._credentials.require_privileged("Release")
        await self._core.release(self.claim.id, ReleaseReason.REQUESTED)

    @dbus_property(access=READ)
    def Id(self) -> DBusStr:
        return self.claim.id

    @dbus_property(access=READ)
    def Device(self) -> DBusStr:
        return self.claim.device

    @dbus_property(access=READ)
    def Netns(self) -> DBusStr:
        return self.claim.netns

    @dbus_property(access=READ)
    def NetnsPath(self) -> DBusStr:
        return self.claim.netns_path

    @dbus_property(access=READ)
    def InterfaceName(self) -> DBusStr:
        return self.claim.ifname

    @dbus_property(access=READ)
    def Shared(self) -> DBusBool:
        return self.claim.shared

    @dbus_property(access=READ)
    def Owner(self) -> DBusStr:
        return self.claim.owner

    @dbus_property(access=READ)
    def CharDevices(self) -> Annotated[list[CharDevRow], DBusSignature("a(suu)")]:
        return [(c.path, c.major, c.minor) for c in self.claim.chardevs]

    @dbus_property(access=READ)
    def CdiDevice(self) -> DBusStr:
        return self.claim.cdi_device

    @dbus_property(access=READ)
    def CreatedAt(self) -> DBusUInt64:
        return self.claim.created_at_us
