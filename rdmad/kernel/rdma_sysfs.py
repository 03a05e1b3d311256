"""What sysfs knows about an RDMA device that RDMA netlink does not: its bus device.

/sys/class/infiniband/NAME/device links to the parent (PCI) device of a hardware driver;
software devices (rxe, siw) live under /sys/devices/virtual and have no such link.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# The RDMA devices this process's sysfs shows (its netns's, as sysfs was mounted from init_net).
INFINIBAND_CLASS = "/sys/class/infiniband"


@dataclass(frozen=True)
class SysfsFacts:
    driver: str = ""  # kernel driver bound to the parent device, e.g. mlx5_core
    pci_address: str = ""
    numa_node: int = -1
    parent: str = ""  # SR-IOV VF: the RDMA device name of its PF
    virtual: bool = False  # no parent device: a software device
    link_layer: str = ""  # of port 1: "InfiniBand" or "Ethernet"


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _link_name(path: str) -> str:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return ""


def _pf_rdma_name(device_dir: str) -> str:
    """The RDMA device of a VF's physical function (PCI dir/infiniband/NAME), or ""."""
    try:
        names = sorted(os.listdir(os.path.join(device_dir, "physfn", "infiniband")))
    except OSError:
        return ""
    return names[0] if names else ""


def sysfs_facts(name: str) -> SysfsFacts:
    base = os.path.join(INFINIBAND_CLASS, name)
    link_layer = _read(os.path.join(base, "ports", "1", "link_layer"))
    device_dir = os.path.join(base, "device")
    if not os.path.exists(device_dir):
        return SysfsFacts(virtual=True, link_layer=link_layer)
    real = os.path.realpath(device_dir)
    bus = os.path.basename(os.path.realpath(os.path.join(real, "subsystem")))
    driver = _link_name(os.path.join(real, "driver"))  # "" when no driver is bound
    numa = _read(os.path.join(real, "numa_node"))
    return SysfsFacts(
        driver=driver,
        pci_address=os.path.basename(real) if bus == "pci" else "",
        numa_node=int(numa) if numa.lstrip("-").isdecimal() else -1,
        parent=_pf_rdma_name(real),
        link_layer=link_layer,
    )
