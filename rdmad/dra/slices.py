"""The node's ResourceSlices: one pool named after the node, owned by its Node object, made
to match the offer through the API server, with backoff when the API server fails.

The kubernetes client is synchronous (urllib3): its calls run on one worker thread, one at a
time, while the event loop goes on following rdmad. The publisher wakes only when the offer
changes or the kubelet registers the plugin again (it wipes a node's slices when it starts),
and after a failure it waits out its backoff before it tries the newest offer.

A device whose port is not ACTIVE is tainted (KEP-5055): the scheduler places no new claim
on it (NoSchedule, the default) or also evicts the pods using it (NoExecute); `None`
publishes no taint. The API allows 64 devices in a slice once one of them has a taint:
while tainting is on, every slice holds at most 64, so a port going down rewrites the
devices' slices without moving devices between them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rdmad.dra.health import ACTIVE, port_state
from rdmad.dra.offer import RdmadState, in_slices, partitioned, rdma_device_of

log = logging.getLogger("rdmad.dra")

API_VERSION = "resource.k8s.io/v1"
# what makes a published device the wanted one
_SAME = ("name", "attributes", "capacity", "consumesCounters", "taints")
# The first release whose API server has partitionable devices on by default (KEP-4815).
PARTITIONABLE_SINCE = (1, 36)
SHARING = ("auto", "counters", "slots")  # how share slots are published: --sharing
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")  # the first: the default
NO_TAINT = "None"
PORT_DOWN = "rdmad.io/port-down"  # the taint's key; its value: the port's state


def tainted(devices: list[dict[str, Any]], state: RdmadState, effect: str) -> list[dict[str, Any]]:
    """`devices` (the offer of `state`), each whose RDMA device's port is not ACTIVE with a
    taint of `effect`; with no taint at all for effect None."""
    if effect == NO_TAINT:
        return devices
    by_rdma = {str(p["Name"]): p for p in state.devices}
    out = []
    for device in devices:
        rdma = rdma_device_of(device["name"], by_rdma)
        port = port_state(by_rdma[rdma])[1] if rdma is not None else ACTIVE
        if port != ACTIVE:
            taint = {"key": PORT_DOWN, "value": port, "effect": effect}
            device = {**device, "taints": [taint]}
        out.append(device)
    return out


class SliceApi(Protocol):
    """What the publisher needs of the API server (rdmad/dra/kube.py). Blocking calls;
    failures raise ApiFailed."""

    def node_uid(self, node: str) -> str: ...
    def server_version(self) -> tuple[int, int]: ...
    def list_slices(self, driver: str, node: str) -> list[dict[str, Any]]: ...
    def create_slice(self, body: dict[str, Any]) -> None: ...
    def replace_slice(self, name: str, body: dict[str, Any]) -> None: ...
    def delete_slice(self, name: str) -> None: ...


class ApiFailed(Exception):
    """The API server refused a call or could not be reached."""


@dataclass(frozen=True)
class Backoff:
    initial: float = 1.0
    factor: float = 2.0
    cap: float = 60.0

    def delay(self, failures: int) -> float:
        return float(min(self.cap, self.initial * self.factor ** max(0, failures - 1)))


def _comparable(device: dict[str, Any]) -> dict[str, Any]:
    out = {k: device[k] for k in _SAME if device.get(k)}
    if "taints" in out:  # the API server adds timeAdded to each
        out["taints"] = [{k: v for k, v in t.items() if k != "timeAdded"} for t in out["taints"]]
    return out


def _contents(spec: dict[str, Any]) -> dict[str, Any]:
    """A slice's devices (as far as _SAME goes) or counter sets, as in_slices gives them."""
    if spec.get("sharedCounters"):
        return {"sharedCounters": spec["sharedCounters"]}
    return {"devices": [_comparable(d) for d in spec.get("devices") or []]}


def _canonical(contents: Iterable[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(c, sort_keys=True) for c in contents)


class Pool:
    """The node's pool of this driver's devices, as the API server should hold it."""

    def __init__(
        self,
        api: SliceApi,
        driver: str,
        node: str,
        sharing: str = "auto",
        taint: str = NO_TAINT,
    ) -> None:
        self._api = api
        self.driver = driver
        self.node = node
        self._sharing = sharing
        self._tainting = taint != NO_TAINT
        self._counters: bool | None = None  # auto: known once the API server answered

    def _partitionable(self) -> bool:
        """Whether slots are published as partitions of counter sets: `counters`, or
        `auto` with an API server of PARTITIONABLE_SINCE or newer (read once)."""
        if self._counters is None:
            if self._sharing == "auto":
                version = self._api.server_version()
                self._counters = version >= PARTITIONABLE_SINCE
                log.info(
                    "API server %d.%d: share slots published %s",
                    *version,
                    "as partitions of counter sets" if self._counters else "plain",
                )
            else:
                self._counters = self._sharing == "counters"
        return self._counters

    def _body(
        self,
        node_uid: str,
        contents: dict[str, Any],
        generation: int,
        count: int,
        existing: str | None,
    ) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": self.node,
                    "uid": node_uid,
                    "controller": True,
                }
            ]
        }
        if existing is None:
            metadata["generateName"] = f"{self.node}-{self.driver}-"
        else:
            metadata["name"] = existing
        return {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": metadata,
            "spec": {
                "driver": self.driver,
                "nodeName": self.node,
                "pool": {"name": self.node, "generation": generation, "resourceSliceCount": count},
                **contents,
            },
        }

    def _current(
        self, node_uid: str, slices: list[dict[str, Any]], wanted: list[dict[str, Any]]
    ) -> bool:
        if len(slices) != len(wanted):
            return False
        generations = {s["spec"]["pool"].get("generation", 0) for s in slices}
        for s in slices:
            owners = s["metadata"].get("ownerReferences") or []
            if (
                len(generations) != 1
                or s["spec"]["pool"].get("name") != self.node
                or s["spec"]["pool"].get("resourceSliceCount") != len(wanted)
                or [o.get("uid") for o in owners] != [node_uid]
            ):
                return False
        # in any order: a new slice's name is the API server's choice
        return _canonical(_contents(s["spec"]) for s in slices) == _canonical(
            _contents(c) for c in wanted
        )

    def sync(self, devices: list[dict[str, Any]]) -> bool:
        """Make the API server's slices hold `devices`; True if anything was written.
        Blocking; raises ApiFailed."""
        # Read each time: a node deleted and made again under its name has a new UID, and
        # slices owned by the old one would be garbage-collected.
        node_uid = self._api.node_uid(self.node)
        if self._partitionable():
            wanted = in_slices(*partitioned(devices), tainting=self._tainting)
        else:
            wanted = in_slices(devices, tainting=self._tainting)
        slices = sorted(
            self._api.list_slices(self.driver, self.node), key=lambda s: s["metadata"]["name"]
        )
        if self._current(node_uid, slices, wanted):
            return False
        # A new generation for the whole pool: the scheduler takes only the newest one's
        # slices, so it never sees a device twice or half a pool while slices are rewritten.
        generation = 1 + max((s["spec"]["pool"].get("generation", 0) for s in slices), default=0)
        for i, chunk in enumerate(wanted):
            if i < len(slices):
                name = slices[i]["metadata"]["name"]
                body = self._body(node_uid, chunk, generation, len(wanted), name)
                body["metadata"]["resourceVersion"] = slices[i]["metadata"]["resourceVersion"]
                self._api.replace_slice(name, body)
            else:
                self._api.create_slice(self._body(node_uid, chunk, generation, len(wanted), None))
        for extra in slices[len(wanted) :]:
            self._api.delete_slice(extra["metadata"]["name"])
        log.info(
            "published %d devices of pool %s in %d slices, generation %d",
            len(devices),
            self.node,
            len(wanted),
            generation,
        )
        return True


class SlicePublisher:
    """Keeps the pool equal to the newest offer, from the event loop."""

    def __init__(self, pool: Pool, backoff: Backoff = Backoff()) -> None:
        self._pool = pool
        self._backoff = backoff
        self._wanted: list[dict[str, Any]] | None = None  # None: not read from rdmad yet
        self._wake = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kube-api")

    def offer(self, devices: Sequence[dict[str, Any]]) -> None:
        self._wanted = list(devices)
        self._wake.set()

    def recheck(self) -> None:
        """Compare the API server's copy again (someone else may have deleted it)."""
        self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if self._wanted is None:
                    continue
                try:
                    await loop.run_in_executor(self._executor, self._pool.sync, self._wanted)
                except ApiFailed as e:
                    failures += 1
                    delay = self._backoff.delay(failures)
                    log.warning("publishing ResourceSlices failed (%s); again in %g s", e, delay)
                    await asyncio.sleep(delay)
                    self._wake.set()
                    continue
                failures = 0
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)
