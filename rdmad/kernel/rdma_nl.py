"""A pure codec for the kernel's RDMA netlink device interface (nldev).

Bytes in, bytes out: no sockets here, so every message can be unit-tested from hand-built
bytes. Numbers come from include/uapi/rdma/rdma_netlink.h; iproute2's rdma/ tool speaks the
same protocol and is the reference client.
"""

from __future__ import annotations

import enum
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5
RDMA_NL_GROUP_NOTIFY = 4

# netlink core (include/uapi/linux/netlink.h)
NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSG_OVERRUN = 4
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_CAPPED = 0x100  # in an NLMSG_ERROR: the echoed request has no payload
NLM_F_ACK_TLVS = 0x200  # in an NLMSG_ERROR: extended-ack attributes follow
NLMSGERR_ATTR_MSG = 1
NLA_TYPE_MASK = 0x3FFF  # strips NLA_F_NESTED and NLA_F_NET_BYTEORDER

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NLATTR = struct.Struct("=HH")  # len, type


class Cmd(enum.IntEnum):
    GET = 1
    SET = 2
    NEWLINK = 3
    DELLINK = 4
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
    CAP_FLAGS = 4  # u64
    FW_VERSION = 5  # string
    NODE_GUID = 6  # u64, host byte order
    SYS_IMAGE_GUID = 7  # u64
    PORT_STATE = 12  # u8
    PORT_PHYS_STATE = 13  # u8
    DEV_NODE_TYPE = 14  # u8
    NDEV_INDEX = 50  # u32
    NDEV_NAME = 51  # string
    LINK_TYPE = 65  # string
    SYS_NETNS_MODE = 66  # u8: 1 shared, 0 exclusive
    DEV_PROTOCOL = 67  # string: ib, roce, iw, opa
    NET_NS_FD = 68  # u32
    CHARDEV_TYPE = 69  # string
    CHARDEV_NAME = 70  # string
    CHARDEV_ABI = 71  # u64
    CHARDEV = 72  # u64, huge_encode_dev()
    UVERBS_DRIVER_ID = 73  # u64
    SYS_COPY_ON_FORK = 93  # u8
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


def _align(n: int) -> int:
    return (n + 3) & ~3


# ---------------------------------------------------------------- attributes (encode)


def attr(kind: int, payload: bytes) -> bytes:
    """One nlattr, padded to 4 bytes (the length field excludes the padding)."""
    size = _NLATTR.size + len(payload)
    return _NLATTR.pack(size, kind) + payload + b"\0" * (_align(size) - size)


def attr_u8(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=B", value))


def attr_u32(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=I", value))


def attr_u64(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=Q", value))


def attr_str(kind: int, value: str) -> bytes:
    """NUL-terminated, as mnl_attr_put_strz and the kernel's NLA_NUL_STRING expect."""
    return attr(kind, value.encode() + b"\0")


def encode(cmd: int, attrs: Iterable[bytes] = (), *, seq: int, flags: int = 0) -> bytes:
    """A request: nlmsghdr + attributes. NLM_F_REQUEST is always set; pid 0 is the kernel."""
    body = b"".join(attrs)
    header = _NLMSGHDR.pack(
        _NLMSGHDR.size + len(body), msg_type(cmd), flags | NLM_F_REQUEST, seq, 0
    )
    return header + body


# ---------------------------------------------------------------- attributes (decode)


@dataclass(frozen=True)
class Attrs:
    """Decoded attributes of one message or nest: the last value of each type wins."""

    raw: dict[int, bytes] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: bytes) -> Attrs:
        return cls(dict(iter_attrs(data)))

    def __contains__(self, kind: int) -> bool:
        return kind in self.raw

    def u8(self, kind: int, default: int = 0) -> int:
        v = self.raw.get(kind)
        return v[0] if v else default

    def u32(self, kind: int, default: int = 0) -> int:
        v = self.raw.get(kind)
        return int(struct.unpack_from("=I", v)[0]) if v is not None and len(v) >= 4 else default

    def u64(self, kind: int, default: int = 0) -> int:
        v = self.raw.get(kind)
        return int(struct.unpack_from("=Q", v)[0]) if v is not None and len(v) >= 8 else default

    def string(self, kind: int, default: str = "") -> str:
        v = self.raw.get(kind)
        return v.split(b"\0", 1)[0].decode(errors="replace") if v is not None else default

    def nested(self, kind: int) -> Attrs:
        return Attrs.parse(self.raw.get(kind, b""))


def iter_attrs(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(type, payload) pairs; flag bits stripped, PAD skipped, a truncated tail ignored."""
    offset = 0
    while offset + _NLATTR.size <= len(data):
        size, kind = _NLATTR.unpack_from(data, offset)
        if size < _NLATTR.size or offset + size > len(data):
            break
        kind &= NLA_TYPE_MASK
        if kind != Attr.PAD:
            yield kind, data[offset + _NLATTR.size : offset + size]
        offset += _align(size)


# ---------------------------------------------------------------- messages


@dataclass(frozen=True)
class Message:
    type: int
    flags: int
    seq: int
    pid: int
    payload: bytes

    @property
    def cmd(self) -> int | None:
        return cmd_of(self.type)

    @property
    def attrs(self) -> Attrs:
        return Attrs.parse(self.payload)


def split(data: bytes) -> list[Message]:
    """Every netlink message in one datagram (a dump packs several per read)."""
    out: list[Message] = []
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        size, typ, flags, seq, pid = _NLMSGHDR.unpack_from(data, offset)
        if size < _NLMSGHDR.size or offset + size > len(data):
            raise ValueError(f"truncated netlink message at offset {offset}")
        out.append(Message(typ, flags, seq, pid, data[offset + _NLMSGHDR.size : offset + size]))
        offset += _align(size)
    return out


class NetlinkError(OSError):
    """The kernel answered with a negative errno; `extack` is its extended-ack text, if any."""

    def __init__(self, err: int, extack: str = "") -> None:
        super().__init__(err, extack or os.strerror(err))
        self.extack = extack


def parse_error(msg: Message) -> tuple[int, str]:
    """(errno, extack message) of an NLMSG_ERROR; errno 0 is an ACK."""
    (code,) = struct.unpack_from("=i", msg.payload)
    extack = ""
    if msg.flags & NLM_F_ACK_TLVS:
        # the echoed request: only its header when capped, else the whole message
        echoed = _NLMSGHDR.unpack_from(msg.payload, 4)[0] if len(msg.payload) >= 20 else 0
        skip = 4 + (_NLMSGHDR.size if msg.flags & NLM_F_CAPPED else _align(echoed))
        extack = Attrs.parse(msg.payload[skip:]).string(NLMSGERR_ATTR_MSG)
    return -code, extack


@dataclass
class Reply:
    """Collects the answer to one request, fed message by message (any order of datagrams).

    A doit request carries NLM_F_ACK, so it ends with an NLMSG_ERROR (errno 0 = ACK). A dump
    ends with NLMSG_DONE, whose payload may carry an error of its own.
    """

    seq: int
    messages: list[Message] = field(default_factory=list)
    done: bool = False

    def feed(self, msg: Message) -> bool:
        """True once the reply is complete; raises NetlinkError for a kernel error."""
        if msg.type == NLMSG_ERROR:
            err, extack = parse_error(msg)
            self.done = True
            if err:
                raise NetlinkError(err, extack)
        elif msg.type == NLMSG_DONE:
            self.done = True
            if len(msg.payload) >= 4:
                (code,) = struct.unpack_from("=i", msg.payload)
                if code < 0:
                    raise NetlinkError(-code)
        elif msg.type not in (NLMSG_NOOP, NLMSG_OVERRUN):
            self.messages.append(msg)
        return self.done


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
    fw_version: str
    protocol: str  # ib, roce, iw, opa ("" on kernels that do not say)


@dataclass(frozen=True)
class PortInfo:
    dev_index: int
    dev_name: str
    port: int
    state: str
    phys_state: str
    netdev: str  # "" when the port has no netdev in the socket's netns
    netdev_index: int


@dataclass(frozen=True)
class SysInfo:
    netns_shared: bool
    copy_on_fork: bool
    monitor: bool  # the kernel has RDMA_NLDEV_CMD_MONITOR


@dataclass(frozen=True)
class ChardevInfo:
    name: str  # the node's name under /dev/infiniband, e.g. uverbs0
    major: int
    minor: int
    abi: int
    driver_id: int  # uverbs only: enum rdma_driver_id, else 0


@dataclass(frozen=True)
class MonitorEvent:
    event: int  # EventType value (kept an int: newer kernels add types)
    dev_index: int
    dev_name: str
    port: int
    netdev_index: int
    netdev_name: str


def dev_info(msg: Message) -> DevInfo:
    a = msg.attrs
    return DevInfo(
        index=a.u32(Attr.DEV_INDEX),
        name=a.string(Attr.DEV_NAME),
        ports=a.u32(Attr.PORT_INDEX),
        node_guid=format_guid(a.u64(Attr.NODE_GUID)) if Attr.NODE_GUID in a else "",
        fw_version=a.string(Attr.FW_VERSION),
        protocol=a.string(Attr.DEV_PROTOCOL),
    )


def port_info(msg: Message) -> PortInfo:
    a = msg.attrs
    return PortInfo(
        dev_index=a.u32(Attr.DEV_INDEX),
        dev_name=a.string(Attr.DEV_NAME),
        port=a.u32(Attr.PORT_INDEX),
        state=_enum_name(PORT_STATES, a.u8(Attr.PORT_STATE)),
        phys_state=_enum_name(PHYS_STATES, a.u8(Attr.PORT_PHYS_STATE)),
        netdev=a.string(Attr.NDEV_NAME),
        netdev_index=a.u32(Attr.NDEV_INDEX),
    )


def sys_info(msg: Message) -> SysInfo:
    a = msg.attrs
    return SysInfo(
        netns_shared=bool(a.u8(Attr.SYS_NETNS_MODE, 1)),
        copy_on_fork=bool(a.u8(Attr.SYS_COPY_ON_FORK)),
        monitor=bool(a.u8(Attr.SYS_MONITOR_MODE)),
    )


def chardev_info(msg: Message) -> ChardevInfo:
    a = msg.attrs
    major, minor = decode_chardev(a.u64(Attr.CHARDEV))
    return ChardevInfo(
        name=a.string(Attr.CHARDEV_NAME),
        major=major,
        minor=minor,
        abi=a.u64(Attr.CHARDEV_ABI),
        driver_id=a.u64(Attr.UVERBS_DRIVER_ID),
    )


def monitor_event(msg: Message) -> MonitorEvent:
    a = msg.attrs
    return MonitorEvent(
        event=a.u8(Attr.EVENT_TYPE),
        dev_index=a.u32(Attr.DEV_INDEX),
        dev_name=a.string(Attr.DEV_NAME),
        port=a.u32(Attr.PORT_INDEX),
        netdev_index=a.u32(Attr.NDEV_INDEX),
        netdev_name=a.string(Attr.NDEV_NAME),
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


def new_link(seq: int, name: str, link_type: str, netdev: str) -> bytes:
    """NEWLINK: `rdma link add NAME type rxe|siw netdev NETDEV`."""
    attrs = [
        attr_str(Attr.DEV_NAME, name),
        attr_str(Attr.LINK_TYPE, link_type),
        attr_str(Attr.NDEV_NAME, netdev),
    ]
    return encode(Cmd.NEWLINK, attrs, seq=seq, flags=NLM_F_ACK)


def del_link(seq: int, index: int) -> bytes:
    return encode(Cmd.DELLINK, [attr_u32(Attr.DEV_INDEX, index)], seq=seq, flags=NLM_F_ACK)
