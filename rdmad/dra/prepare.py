"""NodePrepareResources and NodeUnprepareResources, per claim: read the ResourceClaim from
the API server, Hold its devices in rdmad for its pod, answer their CDI device IDs; release
them on unprepare.

A share slot of the slice is held shared (a macvlan child of the device's netdev, one of
rdmad's shared claims on it), a whole device whole.

Idempotent per claim UID, with no state of the plugin's own: each hold carries the owner
label dra/<claim UID>/<device> (rdmad/dra/owner.py), and rdmad lists and persists it. A
prepare called again (the kubelet retries, and calls again after its own and the plugin's
restarts) finds the holds a prepare before made, killed part-way or not, and makes only the
missing ones; an unprepare releases whatever holds carry the claim's UID. A prepare that
fails releases the holds it made itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from dbus_fast import Variant
from dbus_fast.errors import DBusError

from rdmad.bus.client import Client, Unreachable
from rdmad.bus.names import CLAIM_IFACE
from rdmad.dra.allocation import Refused, Wanted, allocation_of
from rdmad.dra.claim_status import ClaimStatus, Held
from rdmad.dra.offer import SHARED_STATE, rdma_device_of
from rdmad.dra.owner import owner_label, parse_owner
from rdmad.dra.podcgroup import find_pod_cgroup, pod_cgroups
from rdmad.dra.slices import ApiFailed

log = logging.getLogger("rdmad.dra")

NO_SUCH_CLAIM = "io.rdmad1.Error.NoSuchClaim"
T = TypeVar("T")


class ClaimApi(Protocol):
    """The API server, as far as prepare needs it (rdmad/dra/kube.py). Blocking."""

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim as API JSON; ApiFailed if it cannot be read."""
        ...


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class Prepared:
    """One device of a prepared claim, as NodePrepareResources answers it."""

    request: str
    pool: str
    device: str
    cdi_device_id: str
    path: str  # rdmad's claim object that holds it


class Preparer:
    def __init__(
        self,
        api: ClaimApi,
        rdmad: Client,
        status: ClaimStatus,
        driver: str,
        node: str,
        cgroup_root: Path,
    ) -> None:
        self._api = api
        self._status = status
        self._cgroup_root = cgroup_root  # the cgroup2 mount, where the pods' cgroups are
        self._rdmad = rdmad
        self._driver = driver
        self._node = node
        self._locks: dict[str, asyncio.Lock] = {}  # by claim UID: one call at a time

    async def prepare(self, ref: ClaimRef) -> list[Prepared]:
        """Refused with the claim's error."""
        async with self._lock(ref.uid):
            where = f"ResourceClaim {ref.namespace}/{ref.name}"
            try:
                claim = await asyncio.to_thread(self._api.read_claim, ref.namespace, ref.name)
            except ApiFailed as e:
                raise Refused(f"cannot read {where} from the API server: {e}") from e
            allocation = allocation_of(claim, ref.uid, self._driver, self._node)
            prepared = await self._rdmad_call(
                lambda: self._hold(ref, allocation.pod_uid, allocation.devices)
            )
            held = [Held(p.pool, p.device, p.path) for p in prepared]
            self._status.prepared(ref.uid, ref.namespace, ref.name, held)
            return prepared

    async def unprepare(self, ref: ClaimRef) -> None:
        """Release the claim's holds; none is no error (never prepared, or released)."""
        async with self._lock(ref.uid):
            await self._rdmad_call(lambda: self._release_all(ref.uid))
            self._status.unprepared(ref.uid, ref.namespace, ref.name)

    def _lock(self, uid: str) -> asyncio.Lock:
        return self._locks.setdefault(uid, asyncio.Lock())

    async def _rdmad_call(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except Unreachable as e:
            raise Refused(f"rdmad is not reachable on its bus: {e}") from e

    async def _hold(
        self, ref: ClaimRef, pod_uid: str, wanted: tuple[Wanted, ...]
    ) -> list[Prepared]:
        claims = await self._claims()
        held = {row[1]: row[5] for row in claims if _claim_of(row[4]) == ref.uid}
        (listed,) = await self._rdmad.call("ListDevices")
        states = {str(row[0]): str(row[1]) for row in listed}
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        devices = [_rdma_device(where, w, states, claims, held) for w in wanted]
        twice = {d for d in devices if devices.count(d) > 1}
        if twice:
            raise Refused(
                f"{where}: it was allocated {', '.join(sorted(twice))} more than once (two "
                "shares of it, or it and a share); a pod holds a device once, whole or one share"
            )
        made: list[str] = []  # the rdmad claims this call held: released if it fails
        out: list[Prepared] = []
        try:
            for w, rdma in zip(wanted, devices, strict=True):
                path = held.get(rdma)
                if path is None:
                    path = held[rdma] = await self._hold_one(ref, rdma, pod_uid, w)
                    props = await self._rdmad.get_all(path, CLAIM_IFACE)
                    made.append(str(props["Id"]))
                else:
                    props = await self._rdmad.get_all(path, CLAIM_IFACE)
                out.append(Prepared(w.request, w.pool, w.device, str(props["CdiDevice"]), path))
        except BaseException:
            for claim_id in made:
                await self._release(claim_id)
            raise
        return out

    async def _hold_one(self, ref: ClaimRef, rdma: str, pod_uid: str, w: Wanted) -> str:
        options: dict[str, Variant] = {
            "owner": Variant("s", owner_label(ref.uid, w.device)),
            "shared": Variant("b", w.shared),
        }
        if w.params.ifname:
            options["ifname"] = Variant("s", w.params.ifname)
        if w.params.mtu:
            options["mtu"] = Variant("u", w.params.mtu)
        if w.params.chardevs:
            options["chardevs"] = Variant("as", list(w.params.chardevs))
        if w.params.limited:
            options.update(self._limits(ref, pod_uid, w))
        try:
            (path,) = await self._rdmad.call("Hold", "ssa{sv}", [rdma, pod_uid, options])
        except DBusError as e:
            raise Refused(
                f"ResourceClaim {ref.namespace}/{ref.name}: rdmad cannot hold {rdma} for pod "
                f"{pod_uid}: {e.text} ({e.type})"
            ) from e
        log.info(
            "claim %s/%s (%s): %s held%s for pod %s",
            ref.namespace,
            ref.name,
            ref.uid,
            rdma,
            " shared" if w.shared else "",
            pod_uid,
        )
        return str(path)

    def _limits(self, ref: ClaimRef, pod_uid: str, w: Wanted) -> dict[str, Variant]:
        """The limit options: the pod's cgroup (the kubelet made it before this prepare),
        and the parameters' hcaHandles and hcaObjects."""
        try:
            cgroup = find_pod_cgroup(self._cgroup_root, pod_uid)
        except ValueError as e:
            raise Refused(f"ResourceClaim {ref.namespace}/{ref.name}: {e}") from e
        if cgroup is None:
            raise Refused(
                f"ResourceClaim {ref.namespace}/{ref.name}: parameters hcaHandles/hcaObjects "
                f"need the cgroup of pod {pod_uid}, and {self._cgroup_root} has none of "
                f"{', '.join(pod_cgroups(pod_uid))}"
            )
        options = {"cgroup": Variant("s", cgroup)}
        for name, value in (
            ("hca_handles", w.params.hca_handles),
            ("hca_objects", w.params.hca_objects),
        ):
            if value is not None:
                options[name] = Variant("u", value)
        return options

    async def _claims(self) -> list[Any]:
        (rows,) = await self._rdmad.call("ListClaims")
        return list(rows)

    async def _release_all(self, uid: str) -> None:
        """Only the claim's own holds: a share of it leaves the device's other shares be."""
        for row in await self._claims():
            if _claim_of(row[4]) == uid:
                await self._release(row[0])
                log.info("claim %s: released %s (rdmad claim %s)", uid, row[1], row[0])

    async def _release(self, claim_id: str) -> None:
        try:
            await self._rdmad.call("Release", "s", [claim_id])
        except DBusError as e:
            if e.type != NO_SUCH_CLAIM:  # ended meanwhile: what we wanted
                raise Refused(f"rdmad cannot release claim {claim_id}: {e.text} ({e.type})") from e


def _claim_of(owner: str) -> str | None:
    parsed = parse_owner(owner)
    return parsed[0] if parsed else None


def _rdma_device(
    where: str, w: Wanted, states: dict[str, str], claims: list[Any], held: dict[str, str]
) -> str:
    """The RDMA device the allocation's `w` stands for; Refused, before anything is held,
    if it is gone, or if it was allocated whole while it has live shares (the scheduler
    allocated it before the offer withdrew it). rdmad would refuse that hold too; this
    says why."""
    rdma = rdma_device_of(w.device, states)
    if rdma is None:
        raise Refused(f"{where}: device {w.device} is gone from this node (rdmad does not list it)")
    if not w.shared and states[rdma] == SHARED_STATE and rdma not in held:
        live = sum(1 for row in claims if row[1] == rdma)
        raise Refused(
            f"{where}: device {w.device} was allocated whole, but {rdma} has {live} live "
            "shared claims: a whole-device hold needs it free (the pod waits until they are "
            "released)"
        )
    return rdma
