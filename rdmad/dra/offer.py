"""What the node offers: rdmad's devices as resource.k8s.io/v1 Devices (API JSON), within
the API's limits, in slices of at most 128 (64 once they consume counters).

Each RDMA device is offered whole while rdmad lists it as `available`. In the kernel's
shared netns mode it is also offered as share slots: one device of the slice per share
rdmad's shared limit allows (a macvlan child for one pod each), which the scheduler
allocates one at a time, like any device (docs/kubernetes.md says why slots and not
consumable capacity). A share taken outside Kubernetes withdraws a slot; the slots
Kubernetes holds stay published under their names, as the scheduler counts them allocated.
Held whole, or unavailable (its netdev out of the host netns), a device offers nothing, so
the scheduler never hands out what rdmad would refuse. In exclusive mode an RDMA device
belongs to one netns and rdmad refuses shared claims: no slots.

Where the API server has partitionable devices (KEP-4815), the slots and the whole device
are partitions of one counter set (`partitioned`), so that the scheduler itself never
allocates both.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rdmad.dra.owner import parse_owner
from rdmad.dra.pcie import pcie_root

log = logging.getLogger("rdmad.dra")

# The API's limits (resource.k8s.io/v1 validation).
DEVICES_PER_SLICE = 128
DEVICES_PER_SLICE_WITH_COUNTERS = 64  # once any device of the slice consumes counters or is tainted
COUNTER_SETS_PER_SLICE = 8  # in a slice of its own: no devices beside them
ATTRIBUTES_PER_DEVICE = 32  # attributes and capacities together
STRING_BYTES = 64  # a string attribute's value
LABEL_BYTES = 63  # a device name: a DNS label
SHORT_NAME_BYTES = 32  # an attribute name without a domain: a C identifier

# Kubernetes' standard attributes (k8s.io/dynamic-resource-allocation/deviceattribute).
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"

OFFERED_STATE = "available"
SHARED_STATE = "shared"  # rdmad's device state while it has shared claims
SHAREABLE_STATES = (OFFERED_STATE, SHARED_STATE)  # the states that can take a share
SHARED_NETNS_MODE = "shared"
SHARED = "shared"  # the bool attribute: a share slot (true) or the whole device (false)
SHARES_COUNTER = "shares"  # a device's counter set: its slots; the whole device takes all
SLOT_MARK = "--share-"  # a slot's name: <device>--share-<n>; no whole device's has "--"
_SLOT = re.compile(r"(.+)--share-(0|[1-9][0-9]*)")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SHORT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KERNEL_STYLE = re.compile(r"[a-z0-9]+(_[a-z0-9]+)*")


def device_name(rdma_name: str) -> str:
    """A DNS label for the device's name in its slice. Kernel-style names map one to one
    (mlx5_0 -> mlx5-0: they have no '-' to collide with); any other name is hashed, and the
    `rdmaDevice` attribute always carries the real one."""
    if _KERNEL_STYLE.fullmatch(rdma_name) and len(rdma_name) <= LABEL_BYTES:
        return rdma_name.replace("_", "-")
    return _hashed(rdma_name)


def _hashed(rdma_name: str) -> str:
    return "rdma-" + hashlib.sha256(rdma_name.encode()).hexdigest()[:16]


def slot_name(rdma_name: str, index: int) -> str:
    """The name of share slot `index` of the device: mlx5-0--share-3. A whole device's name
    never holds "--" (kernel-style names have no "__"), so the two never collide; a base
    too long for the label is hashed."""
    suffix = f"{SLOT_MARK}{index}"
    base = device_name(rdma_name)
    if len(base) + len(suffix) > LABEL_BYTES:
        base = _hashed(rdma_name)
    return base + suffix


def is_slot(name: str) -> bool:
    """Whether `name`, a device of the slice, is a share slot (else a whole device)."""
    return _SLOT.fullmatch(name) is not None


def rdma_device_of(name: str, rdma_names: Iterable[str]) -> str | None:
    """The RDMA device among `rdma_names` that `name` (whole, or one of its slots) stands
    for; None if none does."""
    slot = _SLOT.fullmatch(name)
    for rdma in rdma_names:
        if name == (slot_name(rdma, int(slot[2])) if slot else device_name(rdma)):
            return rdma
    return None


def _attributes(props: Mapping[str, Any], netns_mode: str) -> dict[str, dict[str, Any]]:
    pci = props["PciAddress"]
    strings = {
        "rdmaDevice": props["Name"],
        "netdev": props["NetDevice"],
        "driver": props["Driver"],
        "linkLayer": props["LinkLayer"],
        "nodeGuid": props["NodeGuid"],
        "netnsMode": netns_mode,
        PCI_BUS_ID: pci,
        PCIE_ROOT: pcie_root(pci) or "",
    }
    out: dict[str, dict[str, Any]] = {}
    for name, value in strings.items():
        if not value:  # unknown: left out, so a selector cannot match an empty value
            continue
        if len(value.encode()) > STRING_BYTES:
            log.warning(
                "device %s: attribute %s left out: %r is over %d bytes",
                props["Name"],
                name,
                value,
                STRING_BYTES,
            )
            continue
        out[name] = {"string": value}
    if props["NumaNode"] >= 0:
        out["numaNode"] = {"int": props["NumaNode"]}
    return out


def check_device(device: Mapping[str, Any]) -> None:
    """Raise ValueError if `device` breaks a limit of the API."""
    name = device["name"]
    if len(name) > LABEL_BYTES or not _LABEL.fullmatch(name):
        raise ValueError(f"device name {name!r} is not a DNS label")
    attributes = device.get("attributes", {})
    if len(attributes) + len(device.get("capacity", {})) > ATTRIBUTES_PER_DEVICE:
        raise ValueError(f"device {name}: over {ATTRIBUTES_PER_DEVICE} attributes and capacities")
    for key, value in attributes.items():
        short = key.rpartition("/")[2]
        if len(short) > SHORT_NAME_BYTES or not _SHORT_NAME.fullmatch(short):
            raise ValueError(f"device {name}: bad attribute name {key!r}")
        if len(value) != 1:
            raise ValueError(f"device {name}: attribute {key} needs exactly one value")
        text = value.get("string")
        if text is not None and len(text.encode()) > STRING_BYTES:
            raise ValueError(f"device {name}: attribute {key} is over {STRING_BYTES} bytes")


@dataclass(frozen=True)
class RdmadState:
    """One read of rdmad: its devices' and claims' properties (as GetManagedObjects gives
    them), the kernel's RDMA netns mode, and the shared claims rdmad allows a device."""

    devices: list[dict[str, Any]]
    claims: list[dict[str, Any]]
    netns_mode: str
    shared_limit: int


def offered(state: RdmadState) -> list[dict[str, Any]]:
    """The devices to publish, by name."""
    owners: dict[str, list[str]] = {}  # the owner labels of each device's live claims
    for claim in state.claims:
        owners.setdefault(claim["Device"], []).append(claim["Owner"])
    out: dict[str, dict[str, Any]] = {}
    for props in sorted(state.devices, key=lambda p: str(p["Name"])):
        for device in _devices_of(props, owners.get(props["Name"], []), state):
            name = device["name"]
            try:
                check_device(device)
            except ValueError as e:
                log.warning("device %s not offered as %s: %s", props["Name"], name, e)
                continue
            if name in out:
                log.warning("device %s not offered: its name %s is taken", props["Name"], name)
                continue
            out[name] = device
    return [out[name] for name in sorted(out)]


def _devices_of(
    props: Mapping[str, Any], owners: list[str], state: RdmadState
) -> Iterator[dict[str, Any]]:
    rdma = props["Name"]
    attributes = _attributes(props, state.netns_mode)
    if props["State"] == OFFERED_STATE:
        yield {"name": device_name(rdma), "attributes": {**attributes, SHARED: {"bool": False}}}
    if (
        state.netns_mode == SHARED_NETNS_MODE
        and props["State"] in SHAREABLE_STATES
        and props["NetDevice"]  # a share is a macvlan child of it
    ):
        for index in _slots(rdma, owners, state.shared_limit):
            yield {
                "name": slot_name(rdma, index),
                "attributes": {**attributes, SHARED: {"bool": True}},
            }


def _slots(rdma: str, owners: list[str], limit: int) -> list[int]:
    """The share slots of device `rdma` to publish: those Kubernetes holds (named in their
    holds' owner labels), and as many free ones, lowest first, as the shares rdmad has left
    (every live claim of the device, held by Kubernetes or not, takes one)."""
    held = set()
    for owner in owners:
        parsed = parse_owner(owner)
        slot = _SLOT.fullmatch(parsed[1]) if parsed else None
        if slot and slot_name(rdma, int(slot[2])) == slot[0]:
            held.add(int(slot[2]))
    free = max(0, limit - len(owners))
    unused = (i for i in range(limit + len(held)) if i not in held)
    return sorted(held) + [next(unused) for _ in range(free)]


def partitioned(devices: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`devices` as partitions of their RDMA devices (KEP-4815), and the counter sets they
    consume: each RDMA device with share slots has a counter set named as its whole device,
    of one `shares` per slot published; a slot consumes one, the whole device all of them.
    So the scheduler never allocates the whole device and a slot of it, nor two wholes."""
    slots: dict[str, int] = {}
    for device in devices:
        if device["attributes"][SHARED]["bool"]:
            rdma = _rdma_attribute(device)
            slots[rdma] = slots.get(rdma, 0) + 1
    out = []
    for device in devices:
        rdma = _rdma_attribute(device)
        if rdma not in slots:  # no slots: nothing to share the device with
            out.append(device)
            continue
        take = 1 if device["attributes"][SHARED]["bool"] else slots[rdma]
        consumes = {"counterSet": device_name(rdma), "counters": _shares(take)}
        out.append({**device, "consumesCounters": [consumes]})
    counter_sets = [
        {"name": device_name(r), "counters": _shares(n)} for r, n in sorted(slots.items())
    ]
    return out, counter_sets


def _rdma_attribute(device: Mapping[str, Any]) -> str:
    # every device carries it: a kernel RDMA device name is at most 63 bytes
    return str(device["attributes"]["rdmaDevice"]["string"])


def _shares(n: int) -> dict[str, dict[str, str]]:
    return {SHARES_COUNTER: {"value": str(n)}}


def in_slices(
    devices: list[dict[str, Any]],
    counter_sets: Sequence[dict[str, Any]] = (),
    tainting: bool = False,
) -> list[dict[str, Any]]:
    """The pool's slices' contents (the devices, or the counter sets, of each spec): the
    counter sets by at most COUNTER_SETS_PER_SLICE, then the devices by at most
    DEVICES_PER_SLICE (DEVICES_PER_SLICE_WITH_COUNTERS once any consumes counters, and
    whenever the pool's devices may be `tainting`: a port going down then rewrites the
    devices' slices without moving devices between them). No
    device at all is one empty slice, which tells the scheduler the pool exists and is
    empty."""
    step = COUNTER_SETS_PER_SLICE
    out = [
        {"sharedCounters": list(counter_sets[i : i + step])}
        for i in range(0, len(counter_sets), step)
    ]
    step = DEVICES_PER_SLICE
    if tainting or any("consumesCounters" in d for d in devices):
        step = DEVICES_PER_SLICE_WITH_COUNTERS
    out += [{"devices": devices[i : i + step]} for i in range(0, len(devices), step)]
    return out or [{"devices": []}]
