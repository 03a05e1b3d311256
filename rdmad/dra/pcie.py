"""The PCIe root complex of a PCI device, as Kubernetes' standard device attribute
resource.kubernetes.io/pcieRoot spells it (`pci<domain>:<bus>`), so that a claim can ask for
an RDMA device under the same root as its GPU (a matchAttribute constraint)."""

from __future__ import annotations

import os
import re

PCI_DEVICES = "/sys/bus/pci/devices"
# /sys/bus/pci/devices/0000:3b:00.0 -> /sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0
_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")


def pcie_root(pci_address: str) -> str | None:
    """The root complex above `pci_address`, from sysfs; None when the address is not a PCI
    device of this host (software devices have none)."""
    if not pci_address or "/" in pci_address:
        return None
    link = os.path.join(PCI_DEVICES, pci_address)
    if not os.path.exists(link):
        return None
    for part in os.path.realpath(link).split("/"):
        if _ROOT.fullmatch(part):
            return part
    return None
