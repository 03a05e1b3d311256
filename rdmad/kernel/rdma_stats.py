"""Per-port RDMA counters: the nldev STAT_GET message and the sysfs counter files.

`rdma statistic show link` sends STAT_GET with a device and port index and no STAT_RES: the
kernel answers with the port's hw counters (the same values as sysfs ports/N/hw_counters,
summed over any per-QP counters); rdmad.kernel.netlink frames it like any nldev message.
Sysfs adds ports/N/counters (the IB PMA counters: port_xmit_data and friends) that netlink
does not carry; a software device (rxe, siw) has none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rdmad.kernel import rdma_nl as nl
from rdmad.kernel import rdma_sysfs
from rdmad.kernel.netlink import NLM_F_ACK, Attrs, Message, attr_u32, iter_attrs

CMD_STAT_GET = 17  # RDMA_NLDEV_CMD_STAT_GET

# enum rdma_nldev_attr
ATTR_STAT_HWCOUNTERS = 80  # nested table of HWCOUNTER_ENTRY
ATTR_STAT_HWCOUNTER_ENTRY = 81  # nested: ENTRY_NAME, ENTRY_VALUE
ATTR_STAT_HWCOUNTER_ENTRY_NAME = 82  # string
ATTR_STAT_HWCOUNTER_ENTRY_VALUE = 83  # u64

# ports/N/hw_counters/lifespan is the driver's cache period in ms, not a counter.
_NOT_COUNTERS = frozenset({"lifespan"})


@dataclass(frozen=True)
class PortStats:
    dev_index: int
    dev_name: str
    port: int
    counters: dict[str, int]  # hw counter name -> value, in the kernel's order


def get_port_stats(seq: int, index: int, port: int) -> bytes:
    """STAT_GET doit for one port's default counter (the kernel requires both indices)."""
    return nl.encode(
        CMD_STAT_GET,
        [attr_u32(nl.Attr.DEV_INDEX, index), attr_u32(nl.Attr.PORT_INDEX, port)],
        seq=seq,
        flags=NLM_F_ACK,
    )


def port_stats(msg: Message) -> PortStats:
    """The counters of a STAT_GET reply (entries appear in a nest, one per counter)."""
    a = nl.attrs_of(msg)
    counters: dict[str, int] = {}
    table = a.raw.get(ATTR_STAT_HWCOUNTERS, b"")
    for kind, payload in iter_attrs(table):
        if kind != ATTR_STAT_HWCOUNTER_ENTRY:
            continue
        entry = Attrs.parse(payload)
        name = entry.string(ATTR_STAT_HWCOUNTER_ENTRY_NAME)
        if name:
            counters[name] = entry.u64(ATTR_STAT_HWCOUNTER_ENTRY_VALUE)
    return PortStats(
        dev_index=a.u32(nl.Attr.DEV_INDEX),
        dev_name=a.string(nl.Attr.DEV_NAME),
        port=a.u32(nl.Attr.PORT_INDEX),
        counters=counters,
    )


def sysfs_port_counters(name: str, port: int) -> dict[str, int]:
    """ports/N/counters and ports/N/hw_counters of a device this process's sysfs shows.

    {} when the device has neither. A file that vanishes or cannot be read (the device went
    away mid-read, or a PMA counter the driver refuses) is left out.
    """
    base = os.path.join(rdma_sysfs.INFINIBAND_CLASS, name, "ports", str(port))
    out: dict[str, int] = {}
    for sub in ("counters", "hw_counters"):
        directory = os.path.join(base, sub)
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for counter in names:
            if counter in _NOT_COUNTERS:
                continue
            try:
                with open(os.path.join(directory, counter)) as f:
                    text = f.read().strip()
            except OSError:
                continue
            if text.isdecimal():
                out.setdefault(counter, int(text))
    return out
