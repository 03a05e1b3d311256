"""A simulated RDMA half, bound to real netdevs. Chosen only with --sim-devices.

It exists for host tests, benchmarks, and the one path no kernel here can show: a hardware
device (mlx5-like) whose netdev and RDMA device move together. It follows the kernel's
rules of its RDMA half as docs/kernel-notes.md states them ("The rules rdmad is built on",
their reference): the netns mode, moves and their char devices, a dying netns, the GID table
(a v1 and v2 pair per address, as mlx5's). Every netdev stays real: the sim only reads
init_net netdevs, and never touches them.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import socket
import struct
from dataclasses import dataclass, field

from rdmad.core.backend import NetnsResolver, NetnsTarget, Placement
from rdmad.errors import KernelError, ModeBusy, NoSuchDevice, NotSupported, from_errno
from rdmad.kernel.netns import run_in_netns
from rdmad.kernel.nlsocket import NlChannel
from rdmad.kernel.rdma_gids import addresses_of
from rdmad.model import (
    ROCE_V2,
    CharDev,
    ChardevKind,
    Gid,
    NetnsMode,
    Port,
    PortCounters,
    RdmaDevice,
    gid_of,
)

UVERBS_MAJOR = 231  # the kernel's IB_UVERBS_MAJOR
UVERBS_BASE_MINOR = 192
ISSM_BASE_MINOR = 64
RDMA_CM_MAJOR, RDMA_CM_MINOR = 10, 58  # misc device, dynamic on real systems


@dataclass
class _SimDevice:
    index: int
    name: str
    netdev: str  # bound at start by name; followed by ifindex afterwards
    ifindex: int
    netns_inode: int = 0  # 0: init_net
    netns_path: str = ""
    netns_cookie: int = 0  # the netns's identity: the kernel gives a dead one's inode to the next
    uverbs_minor: int = 0
    umad_minor: int = 0
    pci_address: str = ""  # as given: NAME=NETDEV@PCI (selectors and deviceID match on it)
    node_guid: str = ""  # of its name, hashed once: each look-up and GID read gives it
    # GID table entries past the default pair: (gid, netns inode) -> index of its v1 entry
    gid_slots: dict[tuple[str, int], int] = field(default_factory=dict)


def parse_sim_devices(spec: str) -> list[tuple[str, str]]:
    """'mlx5_0=eth1,mlx5_1=eth2' -> [('mlx5_0', 'eth1'), ('mlx5_1', 'eth2')].
    A netdev may carry the PCI address the device reports: 'mlx5_0=eth1@0000:5e:00.0'."""
    pairs = []
    for item in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, netdev = item.partition("=")
        if not sep or not name or not netdev:
            raise ValueError(f"bad --sim-devices entry {item!r}: expected NAME=NETDEV")
        pairs.append((name, netdev))
    return pairs


def _node_guid(name: str) -> str:
    """A simulated device's node GUID: stable for its name, as a real one is for its NIC."""
    guid = hashlib.sha256(name.encode()).hexdigest()[:16]
    return ":".join(guid[i : i + 4] for i in range(0, 16, 4))


class SimRdma:
    """RdmaBackend whose devices are simulated and whose netdevs are real."""

    def __init__(
        self,
        devices: list[tuple[str, str]],
        resolver: NetnsResolver,
        rtnl: NlChannel,
        mode: NetnsMode = NetnsMode.SHARED,
    ) -> None:
        self._resolver = resolver
        self._rtnl = rtnl  # init_net's: a GID table follows its netdevs' addresses
        self._mode = mode
        self._minors = itertools.count()
        self._names = _IfNames()
        self._devs: dict[str, _SimDevice] = {}
        self._by_index: dict[int, _SimDevice] = {}  # a lookup costs O(1), as the kernel's
        for index, (name, bound) in enumerate(devices, start=1):
            netdev, _, pci = bound.partition("@")
            dev = _SimDevice(
                index,
                name,
                netdev,
                self._names.index_of(netdev),
                pci_address=pci,
                node_guid=_node_guid(name),
            )
            self._recreate_chardevs(dev)
            self._devs[name] = self._by_index[index] = dev

    def _recreate_chardevs(self, dev: _SimDevice) -> None:
        # A move tears clients down and re-adds them: new nodes, possibly new minors.
        n = next(self._minors)
        dev.uverbs_minor = UVERBS_BASE_MINOR + n % 64
        dev.umad_minor = n % 64

    async def netns_mode(self) -> NetnsMode:
        return self._mode

    async def set_netns_mode(self, mode: NetnsMode) -> None:
        if mode == self._mode:
            return
        if self._resolver.other_netns_exist():
            raise ModeBusy(
                "cannot change the RDMA netns mode while other network namespaces exist "
                "(kernel EBUSY); delete them, or set ib_core netns_mode at boot"
            )
        self._mode = mode

    async def list_devices(self) -> list[RdmaDevice]:
        for dev in self._devs.values():
            await self._return_if_orphaned(dev)
        visible = [
            d for d in self._devs.values() if self._mode == NetnsMode.SHARED or d.netns_inode == 0
        ]
        return [self._describe(d) for d in visible]

    async def get_device(self, index: int) -> RdmaDevice | None:
        dev = self._by_index.get(index)
        if dev is not None:
            await self._return_if_orphaned(dev)
        if dev is None or (self._mode == NetnsMode.EXCLUSIVE and dev.netns_inode):
            return None
        return self._describe(dev)

    async def _return_if_orphaned(self, dev: _SimDevice) -> None:
        """rdma_dev_exit_net: a device whose netns died is back in init_net, for a listing or
        a look-up made after the death. The netns found by its inode may be a newer one: its
        cookie tells."""
        if dev.netns_inode and not await self._netns_lives(dev):
            dev.netns_inode, dev.netns_path, dev.netns_cookie = 0, "", 0
            self._recreate_chardevs(dev)

    async def _netns_lives(self, dev: _SimDevice) -> bool:
        target = self._resolver.reopen(dev.netns_inode, dev.netns_path)
        if target is None:
            return False
        try:
            return await self._resolver.cookie(target) == dev.netns_cookie
        finally:
            target.close()

    def _describe(self, dev: _SimDevice) -> RdmaDevice:
        if not dev.ifindex:  # its netdev did not exist at start: bind when it shows up
            dev.ifindex = self._names.index_of(dev.netdev)
        name = self._names.name_of(dev.ifindex) if dev.netns_inode == 0 else None
        netdev = name or ""
        return RdmaDevice(
            index=dev.index,
            name=dev.name,
            node_guid=dev.node_guid,
            driver="rdmad_sim",
            link_layer="Ethernet",
            # A RoCE port is ACTIVE while its netdev is up and has carrier (mlx5, rxe).
            ports=(Port(1, "ACTIVE" if self._names.running(name) else "DOWN", "LINK_UP", netdev),),
            netdev=netdev,
            netdev_ifindex=dev.ifindex if netdev else 0,
            chardevs=(f"/dev/infiniband/uverbs{dev.index - 1}",),
            pci_address=dev.pci_address,
        )

    async def move(self, index: int, target: NetnsTarget) -> None:
        dev = self._by_index.get(index)
        if self._mode != NetnsMode.EXCLUSIVE:
            raise NotSupported(
                "the RDMA subsystem is in shared mode: devices cannot change netns (EOPNOTSUPP)"
            )
        if dev is None or dev.netns_inode != 0:
            raise from_errno(errno.EINVAL, f"move RDMA device {index}: not in init_net")
        # The cookie first: a look-up while it is read must not find the device in a netns
        # whose cookie it lacks, and send it home as orphaned (the kernel's move is atomic).
        cookie = await self._resolver.cookie(target)
        dev.netns_inode, dev.netns_path, dev.netns_cookie = target.inode, target.path, cookie
        self._recreate_chardevs(dev)

    async def move_home(self, name: str, source: NetnsTarget) -> None:
        dev = self._devs.get(name)
        # The kernel looks the device up in the socket's netns (here: `source`).
        if dev is None or dev.netns_inode != source.inode:
            raise from_errno(errno.EINVAL, f"move {name} home: not in {source.path or 'netns'}")
        dev.netns_inode, dev.netns_path, dev.netns_cookie = 0, "", 0
        self._recreate_chardevs(dev)

    async def chardevs(
        self, device: RdmaDevice, kinds: tuple[ChardevKind, ...], inside: NetnsTarget | None
    ) -> tuple[CharDev, ...]:
        dev = self._devs.get(device.name)
        if dev is None:
            raise KernelError(errno.ENODEV, f"GET_CHARDEV {device.name}")
        where = inside.inode if inside is not None else 0
        if self._mode == NetnsMode.EXCLUSIVE and dev.netns_inode != where:
            raise KernelError(errno.ENODEV, f"GET_CHARDEV {device.name}: not in this netns")
        out: list[CharDev] = []
        for kind in kinds:
            n = dev.index - 1
            if kind == ChardevKind.UVERBS:
                path = f"/dev/infiniband/uverbs{n}"
                out.append(CharDev(kind, path, UVERBS_MAJOR, dev.uverbs_minor))
            elif kind == ChardevKind.UMAD:
                out.append(CharDev(kind, f"/dev/infiniband/umad{n}", UVERBS_MAJOR, dev.umad_minor))
            elif kind == ChardevKind.ISSM:
                minor = ISSM_BASE_MINOR + dev.umad_minor
                out.append(CharDev(kind, f"/dev/infiniband/issm{n}", UVERBS_MAJOR, minor))
            else:
                out.append(CharDev(kind, "/dev/infiniband/rdma_cm", RDMA_CM_MAJOR, RDMA_CM_MINOR))
        return tuple(out)

    async def gids(
        self, device: str, inside: NetnsTarget | None, netdev: Placement | None
    ) -> tuple[Gid, ...]:
        dev = self._devs.get(device)
        if dev is None:
            raise KernelError(errno.ENODEV, f"GID table of {device}")
        default = "fe80:0000:0000:0000:" + dev.node_guid
        if netdev is None:
            types = ("IB/RoCE v1", ROCE_V2)
            return tuple(Gid(1, i, default, t, dev.netdev) for i, t in enumerate(types))
        assert inside is not None
        out: list[Gid] = []
        for cidr in await addresses_of(self._rtnl, netdev):
            gid = gid_of(cidr.ip)
            slots = dev.gid_slots
            index = slots.setdefault((gid, inside.inode), 2 + 2 * len(slots))
            out.append(Gid(1, index, gid, "IB/RoCE v1", netdev.ifname))
            out.append(Gid(1, index + 1, gid, ROCE_V2, netdev.ifname))
        return tuple(out)

    async def counters(
        self, device: RdmaDevice, inside: NetnsTarget | None
    ) -> tuple[PortCounters, ...]:
        """A simulated device's traffic is its real netdev's: its packet counts, read where
        the netdev is now (init_net, else the claim's netns)."""
        dev = self._devs.get(device.name)
        where = inside.inode if inside is not None else 0
        if dev is None or (self._mode == NetnsMode.EXCLUSIVE and dev.netns_inode != where):
            raise NoSuchDevice(f"RDMA device {device.name} went away while its counters were read")
        name = self._names.name_of(dev.ifindex)
        if name:
            stats = _netdev_packets(name)
        elif inside is not None:
            stats = await run_in_netns(inside.fd, lambda: _netdev_packets(dev.ifindex))
        else:
            stats = {}
        return (PortCounters(1, stats),)

    async def close(self) -> None:
        self._names.close()

    def remove_device(self, name: str) -> None:
        """Hot-unplug a simulated device (what udev's "remove infiniband/NAME" reports)."""
        dev = self._devs.pop(name, None)
        if dev is not None:
            del self._by_index[dev.index]


SIOCGIFNAME, SIOCGIFFLAGS, SIOCGIFINDEX = 0x8910, 0x8913, 0x8933
IFF_RUNNING = 0x40  # in ifr_flags, the union's first short
IFNAMSIZ = 16
_IFREQ = struct.Struct("16si20x")  # struct ifreq: the name, then ifr_ifindex in the union


def _netdev_packets(netdev: str | int) -> dict[str, int]:
    """sent_pkts/rcvd_pkts (rxe's names) of a netdev in the calling thread's netns, by name
    or ifindex; {} if it is not there."""
    try:
        name = socket.if_indextoname(netdev) if isinstance(netdev, int) else netdev
        with open("/proc/thread-self/net/dev") as f:
            lines = f.readlines()[2:]
    except OSError:
        return {}
    for line in lines:
        ifname, _, fields = line.partition(":")
        if ifname.strip() == name:
            values = fields.split()  # rx: bytes packets ... (8 fields), then tx: bytes packets
            return {"sent_pkts": int(values[9]), "rcvd_pkts": int(values[1])}
    return {}


class _IfNames:
    """Netdev name <-> ifindex in init_net, by ioctl on one long-lived socket.

    socket.if_indextoname() opens and closes a socket per call, and each close frees an
    inode through RCU: on a link event during a netns move, that made the move wait a tick
    longer (docs/kernel-notes.md). The real backend reads the name from its nldev dump on
    a long-lived socket and has no such cost; neither should its stand-in.
    """

    def __init__(self) -> None:
        # created by the daemon's thread in init_net, so it looks names up there
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def index_of(self, name: str) -> int:
        if not name or len(name.encode()) >= IFNAMSIZ:  # as if_nametoindex(): no such netdev
            return 0
        try:
            req = _IFREQ.pack(name.encode(), 0)
            return int(_IFREQ.unpack(fcntl.ioctl(self._sock, SIOCGIFINDEX, req))[1])
        except OSError:
            return 0

    def name_of(self, ifindex: int) -> str | None:
        if not ifindex:
            return None
        try:
            out = fcntl.ioctl(self._sock, SIOCGIFNAME, _IFREQ.pack(b"", ifindex))
        except OSError:
            return None
        return bytes(_IFREQ.unpack(out)[0]).split(b"\0", 1)[0].decode()

    def running(self, name: str | None) -> bool:
        """Whether netdev `name` is up with carrier (IFF_RUNNING: operationally up)."""
        if not name:
            return False
        try:
            out = fcntl.ioctl(self._sock, SIOCGIFFLAGS, _IFREQ.pack(name.encode(), 0))
        except OSError:
            return False
        return bool(_IFREQ.unpack(out)[1] & 0xFFFF & IFF_RUNNING)

    def close(self) -> None:
        self._sock.close()
