"""The exported objects: io.rdmad1.Manager, io.rdmad1.Device, io.rdmad1.Claim.

No `from __future__ import annotations` here: dbus-fast reads the annotations of D-Bus
members at class creation, so they must be real objects (typing.Annotated carrying a
DBusSignature), which also keeps mypy and ruff happy without string signatures. Properties
are not written out here: each interface's are one table (rdmad.bus.properties). Signals
are Signal declarations (rdmad.bus.signals), which the Service sends.
"""

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Annotated, Protocol

from dbus_fast import Variant
from dbus_fast.annotations import DBusDict, DBusObjectPath, DBusSignature, DBusStr, DBusUnixFd
from dbus_fast.service import ServiceInterface, dbus_method

from rdmad import __version__
from rdmad.bus.credentials import Credentials
from rdmad.bus.mapping import bus_errors
from rdmad.bus.names import CLAIM_IFACE, DEVICE_IFACE, MANAGER_IFACE, claim_path, device_path
from rdmad.bus.polkit import Action
from rdmad.bus.properties import Prop, PropertyTable
from rdmad.bus.signals import Signal
from rdmad.core.backend import NetnsResolver, NetnsTarget
from rdmad.core.observer import CoreObserver
from rdmad.core.opstats import Histogram, OpStats
from rdmad.errors import AccessDenied, InvalidArgs, RdmadError
from rdmad.model import (
    Claim,
    ClaimOptions,
    ClaimPhase,
    Counters,
    DeviceView,
    NetnsMode,
    RdmaLimit,
    RdmaUsage,
    netns_label,
)
from rdmad.options import parse_claim_options, parse_netns_mode

DeviceRow = tuple[str, str, str, str]
ClaimRow = tuple[str, str, str, str, str, str]
# GetCounters: scope ("device" or "claim"), then per port: index, counter name -> value
COUNTERS_SIGNATURE = "sa(ua{st})"
CountersReply = list[object]
# GetRdmaUsage: the cgroup, then its rdma.current and rdma.max lines for the claim's device
USAGE_SIGNATURE = "sa{su}a{su}"


def limit_dict(limit: RdmaLimit | None) -> dict[str, int]:
    """A line of rdma.max or rdma.current as resource -> value; a resource at `max` (no
    limit) is left out."""
    if limit is None:
        return {}
    pairs = (("hca_handle", limit.hca_handle), ("hca_object", limit.hca_object))
    return {name: value for name, value in pairs if value is not None}


def usage_reply(claim: Claim, usage: RdmaUsage | None) -> list[object]:
    if usage is None:  # no cgroup, or it is gone
        return [claim.cgroup, {}, {}]
    return [usage.cgroup, limit_dict(usage.current), limit_dict(usage.max)]


class CoreAPI(Protocol):
    """What the bus edge needs from rdmad.core.core.Core (which satisfies it structurally)."""

    netns_mode: NetnsMode
    stats: OpStats

    @property
    def shared_limit(self) -> int: ...

    def add_observer(self, observer: CoreObserver) -> None: ...

    def devices(self) -> list[DeviceView]: ...

    def device(self, name: str) -> DeviceView: ...

    def claims(self) -> list[Claim]: ...

    async def claim(self, device: str, target: NetnsTarget, options: ClaimOptions) -> Claim: ...

    async def hold(self, device: str, pod_uid: str, options: ClaimOptions) -> Claim: ...

    async def attach(
        self, pod_uid: str, target: NetnsTarget, ifname: str, options: ClaimOptions
    ) -> list[Claim]: ...

    async def detach(self, claim_id: str) -> None: ...

    async def release(self, claim_id: str) -> None: ...

    async def set_netns_mode(self, mode: NetnsMode) -> None: ...

    async def device_counters(self, name: str) -> Counters: ...

    async def claim_counters(self, claim_id: str) -> Counters: ...

    def rdma_usage(self, claim_id: str) -> RdmaUsage | None: ...


def counters_reply(counters: Counters) -> CountersReply:
    return [str(counters.scope), [[p.port, dict(p.counters)] for p in counters.ports]]


def _histogram(h: Histogram) -> Variant:
    return Variant("(a(dt)dt)", [[list(b) for b in h.cumulative()], h.sum, h.count])


def statistics(stats: OpStats) -> dict[str, Variant]:
    """Manager.GetStatistics: the a{sv} documented in io.rdmad1.Manager.xml."""
    return {
        "claims": Variant("t", stats.claims),
        "releases": Variant("a{st}", dict(stats.releases)),
        "errors": Variant("a(sst)", [[op, name, n] for (op, name), n in stats.errors.items()]),
        "claim_latency": _histogram(stats.claim_seconds),
        "release_latency": _histogram(stats.release_seconds),
    }


@contextlib.contextmanager
def counted(stats: OpStats, operation: str) -> Iterator[None]:
    """Count the errors a call meets before the core takes it (access, arguments, netns):
    the core counts its own."""
    try:
        yield
    except RdmadError as e:
        stats.failed(operation, e.dbus_name)
        raise


# The D-Bus type each claim option must arrive in; its value is rdmad.options' to check.
OPTION_SIGNATURES: dict[str, str] = {
    "ifname": "s",
    "mtu": "u",
    "addresses": "as",
    "shared": "b",
    "chardevs": "as",
    "owner": "s",
    "netdev": "b",
    "cdi_name": "s",
    "table": "u",
    "routes": "as",
    "pod_cdi_name": "s",
    "cgroup": "s",
    "hca_handles": "u",
    "hca_objects": "u",
}


def claim_options(raw: dict[str, Variant]) -> ClaimOptions:
    """a{sv} as received → validated ClaimOptions (InvalidArgs on anything wrong)."""
    for name, variant in raw.items():
        want = OPTION_SIGNATURES.get(name)
        if want is None:
            known = ", ".join(sorted(OPTION_SIGNATURES))
            raise InvalidArgs(f"unknown claim option {name!r} (known: {known})")
        if variant.signature != want:
            raise InvalidArgs(
                f"claim option {name!r} must be of type '{want}', not '{variant.signature}'"
            )
    return parse_claim_options(**{name: variant.value for name, variant in raw.items()})


# What Attach takes: which hold (by its interface name), the netdev's addresses, and the
# pod's cgroup with its limits (which replace the Hold's).
ATTACH_OPTIONS = ("ifname", "addresses", "cgroup", "hca_handles", "hca_objects")


def attach_options(raw: dict[str, Variant]) -> tuple[str, ClaimOptions]:
    """Attach's a{sv} → (the interface name of the one hold to attach, "" for all of the
    pod's; the addresses and the cgroup as ClaimOptions), InvalidArgs on anything wrong."""
    for name in raw:
        if name not in ATTACH_OPTIONS:
            raise InvalidArgs(
                f"unknown attach option {name!r} (known: {', '.join(ATTACH_OPTIONS)})"
            )
    parsed = claim_options(raw)
    return parsed.ifname or "", ClaimOptions(
        addresses=parsed.addresses, cgroup=parsed.cgroup, limit=parsed.limit
    )


def claim_action(options: ClaimOptions) -> Action:
    return Action.CLAIM_SHARE if options.shared else Action.CLAIM_DEVICE


async def authorize_release(
    credentials: Credentials, core: CoreAPI, claim_id: str, own: Action
) -> None:
    """Release and Detach: `own` for the caller's own claim (or one that does not exist:
    the core then says NoSuchClaim), release-any for another's."""
    uid = await credentials.caller_uid(own)
    claim = next((c for c in core.claims() if c.id == claim_id), None)
    action = own if claim is None or claim.claimant == uid else Action.RELEASE_ANY
    device = claim.device if claim is not None else ""
    await credentials.authorize(action, {"claim": claim_id, "device": device})


class ManagerInterface(ServiceInterface):
    def __init__(
        self,
        core: CoreAPI,
        resolver: NetnsResolver,
        credentials: Credentials,
        claim_exported: Callable[[Claim], str],
    ) -> None:
        super().__init__(MANAGER_IFACE)
        self._core = core
        self._resolver = resolver
        self._credentials = credentials
        self._claim_exported = claim_exported

    @dbus_method()
    @bus_errors
    async def ListDevices(self) -> Annotated[list[DeviceRow], DBusSignature("a(ssso)")]:
        return [
            (v.device.name, str(v.state), v.device.netdev, device_path(v.device.name))
            for v in self._core.devices()
        ]

    @dbus_method()
    @bus_errors
    async def GetStatistics(self) -> Annotated[dict[str, Variant], DBusSignature("a{sv}")]:
        return statistics(self._core.stats)

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
        with counted(self._core.stats, "claim"):
            parsed = claim_options(options)  # before opening anything
            action = claim_action(parsed)
            uid = await self._credentials.caller_uid(action)
            target = self._resolver.open(netns, uid or None)
            await self._authorize_into(target, action, netns, device=device)
        claim = await self._core.claim(device, target, dataclasses.replace(parsed, claimant=uid))
        return self._claim_exported(claim)

    @dbus_method()
    @bus_errors
    async def ClaimFd(
        self, device: DBusStr, netns: DBusUnixFd, options: DBusDict
    ) -> DBusObjectPath:
        with counted(self._core.stats, "claim"):
            try:
                parsed = claim_options(options)
                action = claim_action(parsed)
                uid = await self._credentials.caller_uid(action)
                target = self._resolver.adopt_fd(netns, uid or None)  # dup'ed: ours is closed
            finally:
                os.close(netns)  # dbus-fast hands received fds over and never closes them
            await self._authorize_into(target, action, "", device=device)
        claim = await self._core.claim(device, target, dataclasses.replace(parsed, claimant=uid))
        return self._claim_exported(claim)

    async def _authorize_into(
        self, target: NetnsTarget, action: Action, netns: str, **details: str
    ) -> None:
        """Ask polkit about `action` into the opened `target` (named `netns`, "" for an fd:
        its label then), with `details`; close the target if refused."""
        try:
            netns = netns or netns_label(target.inode)
            await self._credentials.authorize(action, {**details, "netns": netns})
        except BaseException:
            target.close()
            raise

    @dbus_method()
    @bus_errors
    async def Hold(self, device: DBusStr, pod_uid: DBusStr, options: DBusDict) -> DBusObjectPath:
        with counted(self._core.stats, "claim"):
            parsed = claim_options(options)
            details = {"device": device, "pod_uid": pod_uid}
            uid = await self._credentials.authorize(Action.HOLD, details)
        claim = await self._core.hold(device, pod_uid, dataclasses.replace(parsed, claimant=uid))
        return self._claim_exported(claim)

    @dbus_method()
    @bus_errors
    async def Attach(
        self, pod_uid: DBusStr, netns: DBusStr, options: DBusDict
    ) -> Annotated[list[str], DBusSignature("ao")]:
        with counted(self._core.stats, "claim"):
            ifname, parsed = attach_options(options)
            uid = await self._credentials.caller_uid(Action.HOLD)
            self._refuse_others_holds(uid, pod_uid)
            target = self._resolver.open(netns, uid or None)
            await self._authorize_into(target, Action.HOLD, netns, pod_uid=pod_uid)
        return [claim_path(c.id) for c in await self._core.attach(pod_uid, target, ifname, parsed)]

    def _refuse_others_holds(self, uid: int, pod_uid: str) -> None:
        """Attach: a caller that is not root attaches only the holds it made."""
        others = [
            c.id
            for c in self._core.claims()
            if c.hold is not None and c.hold.pod_uid == pod_uid and uid not in (0, c.claimant)
        ]
        if others:
            raise AccessDenied(
                f"{Action.HOLD}: pod {pod_uid}'s holds {', '.join(others)} are not uid {uid}'s"
            )

    @dbus_method()
    @bus_errors
    async def Detach(self, claim_id: DBusStr) -> None:
        with counted(self._core.stats, "release"):
            await authorize_release(self._credentials, self._core, claim_id, Action.HOLD)
        await self._core.detach(claim_id)

    @dbus_method()
    @bus_errors
    async def Release(self, claim_id: DBusStr) -> None:
        with counted(self._core.stats, "release"):
            await authorize_release(self._credentials, self._core, claim_id, Action.RELEASE_OWN)
        await self._core.release(claim_id)

    @dbus_method()
    @bus_errors
    async def SetNetnsMode(self, mode: DBusStr) -> None:
        await self._credentials.authorize(Action.SET_NETNS_MODE, {"mode": mode})
        await self._core.set_netns_mode(parse_netns_mode(mode))


# The Manager's signals: (name, path); (name, path); (claim_id, device, path);
# (claim_id, device, reason). The Service sends them (rdmad.bus.signals says why not dbus-fast).
DEVICE_ADDED: Signal[tuple[str, str]] = Signal(MANAGER_IFACE, "DeviceAdded", "so")
DEVICE_REMOVED: Signal[tuple[str, str]] = Signal(MANAGER_IFACE, "DeviceRemoved", "so")
CLAIMED: Signal[tuple[str, str, str]] = Signal(MANAGER_IFACE, "Claimed", "sso")
RELEASED: Signal[tuple[str, str, str]] = Signal(MANAGER_IFACE, "Released", "sss")
for _signal in (DEVICE_ADDED, DEVICE_REMOVED, CLAIMED, RELEASED):
    _signal.declare_on(ManagerInterface)


MANAGER_PROPERTIES: PropertyTable[CoreAPI] = PropertyTable(
    Prop("Version", "s", lambda core: __version__),
    Prop("NetnsMode", "s", lambda core: str(core.netns_mode)),
    Prop("SharedLimit", "u", lambda core: core.shared_limit),
)
MANAGER_PROPERTIES.export_on(ManagerInterface, lambda self: self._core)


DEVICE_PROPERTIES: PropertyTable[DeviceView] = PropertyTable(
    Prop("Name", "s", lambda v: v.device.name),
    Prop("Index", "u", lambda v: v.device.index),
    Prop("NodeGuid", "s", lambda v: v.device.node_guid),
    Prop("Driver", "s", lambda v: v.device.driver),
    Prop("LinkLayer", "s", lambda v: v.device.link_layer),
    Prop(
        "Ports",
        "a(usss)",
        lambda v: [(p.index, p.state, p.phys_state, p.netdev) for p in v.device.ports],
    ),
    Prop("NetDevice", "s", lambda v: v.device.netdev),
    Prop("Carrier", "b", lambda v: v.carrier),
    Prop("PciAddress", "s", lambda v: v.device.pci_address),
    Prop("NumaNode", "i", lambda v: v.device.numa_node),
    Prop("CharDevices", "as", lambda v: list(v.device.chardevs)),
    Prop("State", "s", lambda v: str(v.state)),
    Prop("Netns", "s", lambda v: v.netns),
    Prop("Claims", "ao", lambda v: [claim_path(c) for c in v.claims]),
)

GidRow = tuple[int, int, str, str, str]


def gid_rows(claim: Claim) -> list[GidRow]:
    return [(g.port, g.index, g.gid, g.type, g.netdev) for g in claim.gids]


def claim_state(claim: Claim) -> str:
    """A claim mid-claim or mid-release is shown as it was until the call returns: held
    until its Attach is done, else active; or not-returned, found so at start."""
    if claim.phase in (ClaimPhase.NOT_RETURNED, ClaimPhase.HELD):
        return str(claim.phase)
    if claim.phase == ClaimPhase.PENDING and claim.hold is not None:
        return str(ClaimPhase.HELD)
    return str(ClaimPhase.ACTIVE)


CLAIM_PROPERTIES: PropertyTable[Claim] = PropertyTable(
    Prop("Id", "s", lambda c: c.id),
    Prop("Device", "s", lambda c: c.device),
    Prop("Netns", "s", lambda c: c.netns),
    Prop("NetnsPath", "s", lambda c: c.attachment.netns_path if c.attachment else ""),
    Prop("InterfaceName", "s", lambda c: c.ifname),
    Prop("Addresses", "as", lambda c: list(c.attachment.ns_addresses) if c.attachment else []),
    Prop("MacAddress", "s", lambda c: c.attachment.ns_mac if c.attachment else ""),
    Prop("Shared", "b", lambda c: c.shared),
    Prop("Owner", "s", lambda c: c.owner),
    Prop("CharDevices", "a(suu)", lambda c: [(d.path, d.major, d.minor) for d in c.chardevs]),
    Prop("CdiDevice", "s", lambda c: c.cdi_device),
    Prop("CreatedAt", "t", lambda c: c.created_at_us),
    Prop("Gids", "a(uusss)", lambda c: gid_rows(c)),
    Prop("RouteTable", "u", lambda c: c.attachment.route_table if c.attachment else 0),
    Prop("PodCdiName", "s", lambda c: c.pod_cdi_name),
    Prop("State", "s", lambda c: claim_state(c)),
    Prop("Failure", "s", lambda c: c.failure),
    Prop("PodUid", "s", lambda c: c.hold.pod_uid if c.hold else ""),
    Prop("Cgroup", "s", lambda c: c.cgroup),
    Prop("RdmaLimit", "a{su}", lambda c: limit_dict(c.limit)),
)


class DeviceInterface(ServiceInterface):
    def __init__(self, view: DeviceView, core: CoreAPI) -> None:
        super().__init__(DEVICE_IFACE)
        self._view = view
        self._core = core
        self._shown = DEVICE_PROPERTIES.values(view)  # as last announced

    def update(self, view: DeviceView) -> dict[str, Variant]:
        """Take a new view; returns the properties whose values changed, for
        PropertiesChanged."""
        self._view = view
        return DEVICE_PROPERTIES.changed(self._shown, view)

    def all_properties(self) -> dict[str, Variant]:
        """For ObjectManager.InterfacesAdded."""
        return DEVICE_PROPERTIES.typed(self._shown)

    @dbus_method()
    @bus_errors
    async def GetCounters(self) -> Annotated[CountersReply, DBusSignature(COUNTERS_SIGNATURE)]:
        return counters_reply(await self._core.device_counters(self._view.device.name))


DEVICE_PROPERTIES.export_on(DeviceInterface, lambda self: self._view)


class ClaimInterface(ServiceInterface):
    def __init__(self, claim: Claim, core: CoreAPI, credentials: Credentials) -> None:
        super().__init__(CLAIM_IFACE)
        self.claim = claim
        self._core = core
        self._credentials = credentials
        self._shown = CLAIM_PROPERTIES.values(claim)  # as last announced: the claim is mutable

    def changed(self) -> dict[str, Variant]:
        """The properties changed since the last call (or the export), for
        PropertiesChanged: the Gids, Addresses and MacAddress, or everything an Attach
        sets."""
        return CLAIM_PROPERTIES.changed(self._shown, self.claim)

    def all_properties(self) -> dict[str, Variant]:
        """For ObjectManager.InterfacesAdded."""
        return CLAIM_PROPERTIES.typed(self._shown)

    @dbus_method()
    @bus_errors
    async def Release(self) -> None:
        with counted(self._core.stats, "release"):
            await authorize_release(
                self._credentials, self._core, self.claim.id, Action.RELEASE_OWN
            )
        await self._core.release(self.claim.id)

    @dbus_method()
    @bus_errors
    async def GetCounters(self) -> Annotated[CountersReply, DBusSignature(COUNTERS_SIGNATURE)]:
        return counters_reply(await self._core.claim_counters(self.claim.id))

    @dbus_method()
    @bus_errors
    async def GetRdmaUsage(self) -> Annotated[list[object], DBusSignature(USAGE_SIGNATURE)]:
        return usage_reply(self.claim, self._core.rdma_usage(self.claim.id))


CLAIM_PROPERTIES.export_on(ClaimInterface, lambda self: self.claim)
