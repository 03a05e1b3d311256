"""What the node offers: rdmad's devices as resource.k8s.io/v1 Devices (API JSON), within
the API's limits, in slices of at most 128.

Only a device rdmad lists as `available` is offered. One that is claimed or shared (held
for a prepared claim, or taken outside Kubernetes) or unavailable (its netdev out of the
host netns) is withdrawn, so the scheduler never hands out a device rdmad would refuse.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from rdmad.dra.pcie import pcie_root

log = logging.getLogger("rdmad.dra")

# The API's limits (resource.k8s.io/v1 validation).
DEVICES_PER_SLICE = 128
ATTRIBUTES_PER_DEVICE = 32  # attributes and capacities together
STRING_BYTES = 64  # a string attribute's value
LABEL_BYTES = 63  # a device name: a DNS label
SHORT_NAME_BYTES = 32  # an attribute name without a domain: a C identifier

# Kubernetes' standard attributes (k8s.io/dynamic-resource-allocation/deviceattribute).
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"

OFFERED_STATE = "available"
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SHORT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KERNEL_STYLE = re.compile(r"[a-z0-9]+(_[a-z0-9]+)*")


def device_name(rdma_name: str) -> str:
    """A DNS label for the device's name in its slice. Kernel-style names map one to one
    (mlx5_0 -> mlx5-0: they have no '-' to collide with); any other name is hashed, and the
    `rdmaDevice` attribute always carries the real one."""
    if _KERNEL_STYLE.fullmatch(rdma_name) and len(rdma_name) <= LABEL_BYTES:
        return rdma_name.replace("_", "-")
    return "rdma-" + hashlib.sha256(rdma_name.encode()).hexdigest()[:16]


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


def offered(devices: Iterable[Mapping[str, Any]], netns_mode: str) -> list[dict[str, Any]]:
    """The devices to publish, by name: `devices` are rdmad's Device properties."""
    out: dict[str, dict[str, Any]] = {}
    for props in sorted(devices, key=lambda p: str(p["Name"])):
        if props["State"] != OFFERED_STATE:
            continue
        name = device_name(props["Name"])
        device = {"name": name, "attributes": _attributes(props, netns_mode)}
        try:
            check_device(device)
        except ValueError as e:
            log.warning("device %s not offered: %s", props["Name"], e)
            continue
        if name in out:
            log.warning("device %s not offered: its name %s is taken", props["Name"], name)
            continue
        out[name] = device
    return [out[name] for name in sorted(out)]


def in_slices(devices: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """`devices` split into slices of at most DEVICES_PER_SLICE; no device at all is one
    empty slice, which tells the scheduler the pool exists and is empty."""
    step = DEVICES_PER_SLICE
    return [devices[i : i + step] for i in range(0, len(devices), step)] or [[]]
