"""A pure codec for the kernel's RDMA netlink device interface (nldev), on the framing of
rdmad.kernel.netlink.

Bytes in, bytes out: no sockets here, so every message can be unit-tested from hand-built
bytes. Numbers come from include/uapi/rdma/rdma_netlink.h; iproute2's rdma/ tool speaks the
same protocol and is the reference client.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from rdmad.kernel.netlink import (
    NLM_F_ACK,
    NLM_F_DUMP,
    Attrs,
    Message,
    attr_str,
    attr_u8,
    attr_u32,
)
from rdmad.kernel.netlink import encode as encode_msg

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5
RDMA_NL_GROUP_NOTIFY = 4


class Cmd(enum.IntEnum):
    GET = 1
    SET = 2
    PORT_GET = 5
    SYS_GET = 6
    SYS_SET = 7
    GET_CHARDEV = 15
    MONITOR = 28


class Attr(enum.IntEnum):
    PAD = 0
    DEV_INDEX = 1  # u32
    DEV_NAME = 2  # string
    PORT_INDEX = 3  # u32; in a GET reply: the number of ports
    NODE_GUID = 6  # u64, host byte order
    PORT_STATE = 12  # u8
    PORT_PHYS_STATE = 13  # u8
    NDEV_INDEX = 50  # u32
    NDEV_NAME = 51  # string
    SYS_NETNS_MODE = 66  # u8: 1 shared, 0 exclusive
    DEV_PROTOCOL = 67  # string: ib, roce, iw, opa
    NET_NS_FD = 68  # u32
    CHARDEV_TYPE = 69  # string
    CHARDEV_NAME = 70  # string
    CHARDEV = 72  # u64, huge_encode_dev()
    UVERBS_DRIVER_ID = 73  # u64
    EVENT_TYPE = 102  # u8
    SYS_MONITOR_MODE = 103  # u8: present and 1 when MONITOR exists


class EventType(enum.IntEnum):
    """enum rdma_nl_notify_event_type: what a MONITOR notification announces."""

    REGISTER = 0
    UNREGISTER = 1
    NETDEV_ATTACH = 2
    NETDEV_DETACH = 3
    RENAME = 4
    NETDEV_RENAME = 5


# iproute2 rdma/link.c spells port states this way (IB spec enums).
PORT_STATES = ("NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")
PHYS_STATES = (
    "NOP",
    "SLEEP",
    "POLLING",
    "DISABLED",
    "ARMED",
    "LINK_UP",
    "LINK_ERROR_RECOVER",
    "PHY_TEST",
    "UNKNOWN",
    "OPA_OFFLINE",
    "UNKNOWN",
    "OPA_TEST",
)

# enum rdma_driver_id (ib_user_ioctl_verbs.h), only the software drivers rdmad cares about.
DRIVER_ID_RXE = 14
DRIVER_ID_SIW = 18


def msg_type(cmd: int) -> int:
    """RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, cmd)."""
    return (RDMA_NL_NLDEV << 10) + cmd


def cmd_of(nlmsg_type: int) -> int | None:
    """The nldev op of a message type, None for another RDMA netlink client."""
    if (nlmsg_type >> 10) & 0x3F != RDMA_NL_NLDEV:
        return None
    return nlmsg_type & 0x3FF


def attrs_of(msg: Message) -> Attrs:
    """An nldev message's attributes: they start right after the netlink header."""
    return Attrs.parse(msg.payload)


def encode(cmd: int, attrs: Iterable[bytes] = (), *, seq: int, flags: int = 0) -> bytes:
    """A request: nlmsghdr + attributes."""
    return encode_msg(msg_type(cmd), b"".join(attrs), seq=seq, flags=flags)


# ---------------------------------------------------------------- typed replies


def decode_chardev(value: int) -> tuple[int, int]:
    """(major, minor) of a huge_encode_dev() value (the kernel's new_encode_dev layout)."""
    major = (value & 0xFFF00) >> 8
    minor = (value & 0xFF) | ((value >> 12) & 0xFFF00)
    return major, minor


def format_guid(value: int) -> str:
    """As `rdma dev` and sysfs node_guid print it: four 16-bit groups, high first."""
    return ":".join(f"{(value >> shift) & 0xFFFF:04x}" for shift in (48, 32, 16, 0))


def _enum_name(names: tuple[str, ...], value: int) -> str:
    return names[value] if value < len(names) else "UNKNOWN"


@dataclass(frozen=True)
class DevInfo:
    index: int
    name: str
    ports: int
    node_guid: str
    protocol: str  # ib, roce, iw, opa ("" on kernels that do not say)


@dataclass(frozen=True)
class PortInfo:
    port: int
    state: str
    phys_state: str
    netdev: str  # "" when the port has no netdev in the socket's netns
    netdev_index: int


@dataclass(frozen=True)
class SysInfo:
    netns_shared: bool
    monitor: bool  # the kernel has RDMA_NLDEV_CMD_MONITOR


@dataclass(frozen=True)
class ChardevInfo:
    name: str  # the node's name under /dev/infiniband, e.g. uverbs0
    major: int
    minor: int
    driver_id: int  # uverbs only: enum rdma_driver_id, else 0


@dataclass(frozen=True)
class MonitorEvent:
    event: int  # EventType value (kept an int: newer kernels add types)
    dev_index: int
    dev_name: str


def dev_info(msg: Message) -> DevInfo:
    a = attrs_of(msg)
    return DevInfo(
        index=a.u32(Attr.DEV_INDEX),
        name=a.string(Attr.DEV_NAME),
        ports=a.u32(Attr.PORT_INDEX),
        node_guid=format_guid(a.u64(Attr.NODE_GUID)) if Attr.NODE_GUID in a else "",
        protocol=a.string(Attr.DEV_PROTOCOL),
    )


def port_info(msg: Message) -> PortInfo:
    a = attrs_of(msg)
    return PortInfo(
        port=a.u32(Attr.PORT_INDEX),
        state=_enum_name(PORT_STATES, a.u8(Attr.PORT_STATE)),
        phys_state=_enum_name(PHYS_STATES, a.u8(Attr.PORT_PHYS_STATE)),
        netdev=a.string(Attr.NDEV_NAME),
        netdev_index=a.u32(Attr.NDEV_INDEX),
    )


def sys_info(msg: Message) -> SysInfo:
    a = attrs_of(msg)
    return SysInfo(
        netns_shared=bool(a.u8(Attr.SYS_NETNS_MODE, 1)),
        monitor=bool(a.u8(Attr.SYS_MONITOR_MODE)),
    )


def chardev_info(msg: Message) -> ChardevInfo:
    a = attrs_of(msg)
    major, minor = decode_chardev(a.u64(Attr.CHARDEV))
    return ChardevInfo(
        name=a.string(Attr.CHARDEV_NAME),
        major=major,
        minor=minor,
        driver_id=a.u64(Attr.UVERBS_DRIVER_ID),
    )


def monitor_event(msg: Message) -> MonitorEvent:
    a = attrs_of(msg)
    return MonitorEvent(
        event=a.u8(Attr.EVENT_TYPE),
        dev_index=a.u32(Attr.DEV_INDEX),
        dev_name=a.string(Attr.DEV_NAME),
    )


# ---------------------------------------------------------------- requests


def get_dev(seq: int, index: int | None = None) -> bytes:
    """GET: one device (doit) or, without an index, a dump of all devices."""
    if index is None:
        return encode(Cmd.GET, seq=seq, flags=NLM_F_DUMP)
    return encode(Cmd.GET, [attr_u32(Attr.DEV_INDEX, index)], seq=seq, flags=NLM_F_ACK)


def get_ports(seq: int, index: int) -> bytes:
    """PORT_GET dump: every port of one device (the kernel requires DEV_INDEX)."""
    return encode(Cmd.PORT_GET, [attr_u32(Attr.DEV_INDEX, index)], seq=seq, flags=NLM_F_DUMP)


def get_sys(seq: int) -> bytes:
    return encode(Cmd.SYS_GET, seq=seq, flags=NLM_F_ACK)


def set_netns_mode(seq: int, shared: bool) -> bytes:
    return encode(
        Cmd.SYS_SET, [attr_u8(Attr.SYS_NETNS_MODE, int(shared))], seq=seq, flags=NLM_F_ACK
    )


def set_dev_netns(seq: int, index: int, netns_fd: int) -> bytes:
    """SET DEV_INDEX + NET_NS_FD: move a device (looked up in the socket's netns) from the
    sending thread's netns into the netns behind `netns_fd`."""
    return encode(
        Cmd.SET,
        [attr_u32(Attr.DEV_INDEX, index), attr_u32(Attr.NET_NS_FD, netns_fd)],
        seq=seq,
        flags=NLM_F_ACK,
    )


def get_chardev(seq: int, kind: str, index: int | None = None, port: int | None = None) -> bytes:
    """GET_CHARDEV: uverbs needs the device, umad/issm the device and port, rdma_cm neither."""
    attrs = [attr_str(Attr.CHARDEV_TYPE, kind)]
    if index is not None:
        attrs.append(attr_u32(Attr.DEV_INDEX, index))
    if port is not None:
        attrs.append(attr_u32(Attr.PORT_INDEX, port))
    return encode(Cmd.GET_CHARDEV, attrs, seq=seq, flags=NLM_F_ACK)
