"""KEP-4817: each prepared claim's devices in its ResourceClaim's `status.devices[]`, as
`kubectl get resourceclaim -o yaml` shows them: a `Ready` condition once rdmad holds the
device, and once the pod's netns has it (rdmad-cni's Attach) a `NetworkReady` condition
and `networkData` (the interface name in the pod, its addresses as CIDRs, its MAC).

Everything comes from the bus: the properties of rdmad's claim object for each device,
read again after each PropertiesChanged that touches them (an Attach, a Detach, an address
the pod adds or removes: rdmad follows the netns's address events), no polling.

Each write is a server-side apply of the status subresource by the field manager named
after the driver, forced, carrying all of this claim's entries of the driver and no
other's: the API server merges them by (driver, pool, device, shareID), keeps other
drivers' entries, and drops the ones this manager no longer sends. So the unprepare's
write, with none, removes them. A claim's writes are serialized and coalesced: a burst of
changes costs one write of the newest state.

Policy on a failed write: logged, never the prepare's or unprepare's failure (the pod runs
without the status), and written again at the claim's next change or prepare; there is
no retry loop. After a restart of the plugin, the claims prepared before it are followed
again once the kubelet prepares them again (as it does for a pod starting anew); until
then their status is as last written.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from dbus_fast import Message, MessageType
from dbus_fast.errors import DBusError

from rdmad.bus.client import Client, Unreachable
from rdmad.bus.names import BUS_NAME, CLAIM_IFACE, CLAIM_PREFIX, PROPERTIES_IFACE
from rdmad.dra.slices import ApiFailed

log = logging.getLogger("rdmad.dra")

READY = "Ready"
NETWORK_READY = "NetworkReady"
# The claim properties the status is made of: a change to another does not write.
SHOWN = frozenset({"State", "Failure", "InterfaceName", "Addresses", "MacAddress"})
MAX_IPS = 16  # NetworkDeviceData.ips: the API's limit
MATCH_RULE = (
    f"type='signal',sender='{BUS_NAME}',interface='{PROPERTIES_IFACE}',"
    f"member='PropertiesChanged',path_namespace='{CLAIM_PREFIX}'"
)


class StatusApi(Protocol):
    """The API server, as far as the status needs it (rdmad/dra/kube.py). Blocking."""

    def apply_status(self, namespace: str, name: str, devices: list[dict[str, Any]]) -> None:
        """Apply `devices` as this driver's entries of the claim's status.devices; ApiFailed
        if it cannot (NotFound included: the claim is gone)."""
        ...


@dataclass(frozen=True)
class Held:
    """One device of a prepared claim: the allocation's key of it, and rdmad's claim object
    that holds it."""

    pool: str
    device: str
    path: str


@dataclass
class _Claim:
    namespace: str
    name: str
    devices: tuple[Held, ...]  # () once unprepared: its entries are to be removed
    since: dict[tuple[str, str, str], str] = field(default_factory=dict)  # see _condition


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def network_data(props: dict[str, Any]) -> dict[str, Any]:
    """NetworkDeviceData of an attached claim's properties, empty fields left out."""
    data: dict[str, Any] = {
        "interfaceName": props["InterfaceName"],
        "ips": list(props["Addresses"])[:MAX_IPS],
        "hardwareAddress": props["MacAddress"],
    }
    return {k: v for k, v in data.items() if v}


def conditions(props: dict[str, Any], was_attached: bool) -> list[tuple[str, str, str, str]]:
    """(type, status, reason, message) of a device whose rdmad claim has `props`;
    `was_attached`: it was in the pod's netns before (whose end left it held again)."""
    device, state = props["Device"], props["State"]
    if state == "not-returned":
        failure = f"rdmad cannot give {device} back: {props['Failure']}"
        return [(READY, "False", "NotReturned", failure)]
    out = [(READY, "True", "Held", f"rdmad holds {device} for the pod (claim {props['Id']})")]
    if state == "active":
        where = props["InterfaceName"] or device
        out.append((NETWORK_READY, "True", "Attached", f"{where} is in the pod's netns"))
    elif was_attached:
        gone = f"{device} is out of the pod's netns, held for the pod's next sandbox"
        out.append((NETWORK_READY, "False", "Detached", gone))
    return out


class ClaimStatus:
    def __init__(self, api: StatusApi, rdmad: Client, driver: str) -> None:
        self._api = api
        self._rdmad = rdmad
        self._driver = driver
        self._claims: dict[str, _Claim] = {}  # by claim UID
        self._paths: dict[str, str] = {}  # rdmad claim path -> claim UID
        self._dirty: set[str] = set()
        self._writers: dict[str, asyncio.Task[None]] = {}

    async def follow(self) -> None:
        """Write again on each PropertiesChanged of a prepared claim's rdmad claims."""

        def on_message(msg: Message) -> None:
            if (
                msg.message_type is MessageType.SIGNAL
                and msg.member == "PropertiesChanged"
                and msg.path in self._paths
                and msg.body[0] == CLAIM_IFACE
                and SHOWN & set(msg.body[1])
            ):
                self._schedule(self._paths[msg.path])

        self._rdmad.bus.add_message_handler(on_message)
        await self._rdmad.add_match(MATCH_RULE)

    def prepared(self, uid: str, namespace: str, name: str, devices: list[Held]) -> None:
        """The claim's devices are held: write their status, and follow them."""
        claim = self._claims.setdefault(uid, _Claim(namespace, name, ()))
        self._forget_paths(claim)
        claim.devices = tuple(devices)
        self._paths.update((d.path, uid) for d in devices)
        self._schedule(uid)

    def unprepared(self, uid: str, namespace: str, name: str) -> None:
        """The claim's devices are released: remove their entries."""
        claim = self._claims.setdefault(uid, _Claim(namespace, name, ()))
        self._forget_paths(claim)
        claim.devices = ()
        self._schedule(uid)

    def _forget_paths(self, claim: _Claim) -> None:
        for d in claim.devices:
            self._paths.pop(d.path, None)

    def _schedule(self, uid: str) -> None:
        self._dirty.add(uid)
        if uid not in self._writers:
            self._writers[uid] = asyncio.ensure_future(self._write_while_dirty(uid))

    async def _write_while_dirty(self, uid: str) -> None:
        try:
            while uid in self._dirty:
                self._dirty.discard(uid)
                await self._write(uid)
        finally:
            del self._writers[uid]
            claim = self._claims.get(uid)
            if claim is not None and not claim.devices and uid not in self._dirty:
                del self._claims[uid]  # its entries are removed (or the claim is gone)

    async def _write(self, uid: str) -> None:
        claim = self._claims[uid]
        entries = [e for d in claim.devices if (e := await self._entry(claim, d)) is not None]
        where = f"ResourceClaim {claim.namespace}/{claim.name}"
        try:
            await asyncio.to_thread(self._api.apply_status, claim.namespace, claim.name, entries)
        except ApiFailed as e:
            log.warning(
                "%s: its device status is not written (the pod runs without it; written "
                "again at its next change): %s",
                where,
                e,
            )
            return
        log.info("%s: device status written (%d devices)", where, len(entries))

    async def _entry(self, claim: _Claim, held: Held) -> dict[str, Any] | None:
        """The AllocatedDeviceStatus of one device; None if its rdmad claim is gone."""
        try:
            props = await self._rdmad.get_all(held.path, CLAIM_IFACE)
        except (DBusError, Unreachable) as e:
            log.info("claim %s: %s is not shown in the status: %s", held.path, held.device, e)
            return None
        entry: dict[str, Any] = {
            "driver": self._driver,
            "pool": held.pool,
            "device": held.device,
            "conditions": [
                self._condition(claim, held, *c)
                for c in conditions(props, _attached_before(claim, held))
            ],
        }
        data = network_data(props) if props["State"] == "active" else {}
        if data:  # none for a device moved without its netdev
            entry["networkData"] = data
        return entry

    def _condition(
        self, claim: _Claim, held: Held, type_: str, status: str, reason: str, message: str
    ) -> dict[str, Any]:
        """A metav1.Condition whose lastTransitionTime is when it took this status."""
        key = (held.device, type_, status)
        since = claim.since.setdefault(key, _now())
        for other in ("True", "False"):
            if other != status:
                claim.since.pop((held.device, type_, other), None)
        return {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since,
        }


def _attached_before(claim: _Claim, held: Held) -> bool:
    return any(k[:2] == (held.device, NETWORK_READY) for k in claim.since)
