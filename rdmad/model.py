"""The things rdmad knows about: devices, ports, netdevs, claims.

Plain data only. Nothing here talks to the kernel or the bus.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass


class NetnsMode(enum.StrEnum):
    SHARED = "shared"
    EXCLUSIVE = "exclusive"
    UNAVAILABLE = "unavailable"  # no RDMA subsystem (ib_core not loaded)


class DeviceState(enum.StrEnum):
    AVAILABLE = "available"
    CLAIMED = "claimed"  # the whole device belongs to one netns
    SHARED = "shared"  # one or more shared (macvlan) claims
    UNAVAILABLE = "unavailable"  # e.g. no netdev to hand out


class ReleaseReason(enum.StrEnum):
    REQUESTED = "requested"
    NETNS_GONE = "netns-gone"
    DEVICE_REMOVED = "device-removed"
    RECONCILED = "reconciled"


class ChardevKind(enum.StrEnum):
    UVERBS = "uverbs"
    RDMA_CM = "rdma_cm"
    UMAD = "umad"
    ISSM = "issm"


DEFAULT_CHARDEVS: tuple[ChardevKind, ...] = (ChardevKind.UVERBS, ChardevKind.RDMA_CM)

INIT_NETNS = "init"


def netns_label(inode: int) -> str:
    """The kernel's own spelling of a netns identity, as readlink(/proc/X/ns/net) shows it."""
    return f"net:[{inode}]"


@dataclass(frozen=True)
class Port:
    index: int
    state: str  # e.g. ACTIVE, DOWN
    phys_state: str  # e.g. LINK_UP, DISABLED
    netdev: str  # "" when the port has no netdev in the daemon's netns


class CounterScope(enum.StrEnum):
    """Whose traffic a device's counters count."""

    DEVICE = "device"  # everything on the device: shared by all its shared claims
    CLAIM = "claim"  # the claim's own: it holds the whole device


@dataclass(frozen=True)
class PortCounters:
    """One port's counters, read from the kernel on demand (names as the kernel spells them)."""

    port: int
    counters: dict[str, int]


@dataclass(frozen=True)
class Counters:
    scope: CounterScope
    ports: tuple[PortCounters, ...]


@dataclass(frozen=True)
class CharDev:
    """A char device a claimant may open, read from the kernel after any move."""

    kind: ChardevKind
    path: str  # /dev/infiniband/uverbs0
    major: int
    minor: int


@dataclass(frozen=True)
class Gid:
    """One entry of a port's GID table, as the kernel lists it (sysfs gids, gid_attrs)."""

    port: int
    index: int
    gid: str  # as sysfs spells it: eight groups of four hex digits
    type: str  # "IB/RoCE v1" or "RoCE v2"
    netdev: str  # the netdev the entry was made for, "" if none (InfiniBand)


ROCE_V2 = "RoCE v2"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Cidr = ipaddress.IPv4Interface | ipaddress.IPv6Interface  # an address with its prefix


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Route:
    """A route a claim asks for in its routing table: to `dst`, through `via` (None: on-link,
    out of the claim's interface)."""

    dst: Network
    via: IPAddress | None = None


_V4_MAPPED = bytes(10) + b"\xff\xff"  # ::ffff:0:0/96


def gid_of(address: IPAddress) -> str:
    """The GID the kernel makes for an address, spelt as sysfs does (IPv4: ::ffff:a.b.c.d).
    Formatted from the bytes: 2 us, where IPv6Address.exploded takes 13."""
    packed = address.packed if address.version == 6 else _V4_MAPPED + address.packed
    digits = packed.hex()
    return ":".join(digits[i : i + 4] for i in range(0, 32, 4))


@dataclass(frozen=True)
class RdmaDevice:
    """One RDMA device as the kernel reports it (RDMA netlink + sysfs)."""

    index: int
    name: str
    node_guid: str = ""
    driver: str = ""
    link_layer: str = ""  # "InfiniBand" or "Ethernet"
    ports: tuple[Port, ...] = ()
    netdev: str = ""  # the netdev of port 1 in init_net, "" if none
    netdev_ifindex: int = 0
    pci_address: str = ""
    numa_node: int = -1
    chardevs: tuple[str, ...] = ()  # /dev/infiniband paths
    parent: str = ""  # SR-IOV: the PF's RDMA device name, for a VF
    virtual: bool = False  # software device (rxe, siw): its netdev must not move


@dataclass(frozen=True)
class Netdev:
    """A netdev in init_net as rtnetlink reports it."""

    ifindex: int
    name: str
    mtu: int
    up: bool
    kind: str = ""  # rtnl link kind: veth, macvlan, "" for physical
    carrier: bool = False  # IFF_LOWER_UP: up, with a link


@dataclass(frozen=True)
class HostConfig:
    """What a whole-device claim must put back: the netdev as it was in init_net."""

    ifindex: int
    name: str
    mtu: int
    up: bool
    addresses: tuple[str, ...]  # CIDRs, as the state file saves them
    kind: str = ""  # rtnl link kind; "" (physical) is what the kernel hands back on netns death


@dataclass(frozen=True)
class RdmaLimit:
    """One device's line in a cgroup's rdma.max (or rdma.current): user contexts
    (hca_handle) and verbs objects (hca_object); None is the kernel's `max`, no limit."""

    hca_handle: int | None = None
    hca_object: int | None = None


@dataclass(frozen=True)
class RdmaUsage:
    """A claim's device in its cgroup: what is in use (rdma.current) and the limit (rdma.max)."""

    cgroup: str  # relative to the cgroup2 mount
    current: RdmaLimit
    max: RdmaLimit


@dataclass(frozen=True)
class ClaimOptions:
    """The validated a{sv} options of a Claim call."""

    ifname: str | None = None
    mtu: int | None = None
    addresses: tuple[Cidr, ...] = ()  # parsed once, by rdmad.options
    shared: bool = False
    chardevs: tuple[ChardevKind, ...] = DEFAULT_CHARDEVS
    owner: str = ""
    netdev: bool = True
    cdi_name: str = ""  # an extra CDI device name the caller chose (e.g. from its attachment)
    pod_cdi_name: str = ""  # a CDI device name for all the claims of its netns (rdmad.daemon.cdi)
    table: int | None = None  # policy routing: the claim's table; TABLE_AUTO: rdmad picks
    routes: tuple[Route, ...] = ()  # placed in `table`, beside the connected routes
    claimant: int = 0  # the caller's uid (not an a{sv} option: the bus edge sets it)
    cgroup: str = ""  # a cgroup v2 directory as the caller named it, "" for none
    limit: RdmaLimit | None = None  # its device's line in that cgroup's rdma.max


TABLE_AUTO = 0  # the kernel's RT_TABLE_UNSPEC, never a real table: "choose one for me"


class ClaimPhase(enum.StrEnum):
    """Where a claim stands, saved with it: PENDING before the claim's first kernel step,
    ACTIVE once its last is done, RELEASING before a release's first step. A restarted
    daemon undoes a PENDING claim and finishes a RELEASING one. When the kernel refuses that
    give-back at start, the claim stays listed as NOT_RETURNED, with the reason: tried again
    on the next kernel change to its device or netns, on a Release, and at the next start."""

    PENDING = "pending"  # claim in progress: undo it at start
    ACTIVE = "active"
    RELEASING = "releasing"  # release in progress: finish it at start
    NOT_RETURNED = "not-returned"  # its give-back failed at start: `Claim.failure` says why
    HELD = "held"  # kept for a pod whose netns does not exist yet: nothing moved (Hold)
    # Over, its end saved: the file is removed once Released is sent, so a daemon killed
    # in between sends it at its next start (`Claim.end_reason` says why it ended).
    ENDED = "ended"


@dataclass(frozen=True)
class HoldSpec:
    """What a Hold asked for that its Attach needs, saved with the claim: the pod it is
    held for (its UID, as Kubernetes and CNI_ARGS' K8S_POD_UID name it) and the options
    applied only when the netns exists."""

    pod_uid: str
    mtu: int = 0  # 0: keep the netdev's
    chardevs: tuple[ChardevKind, ...] = DEFAULT_CHARDEVS
    netdev: bool = True


@dataclass
class Attachment:
    """Where a claim is: its netns, and what it took there. A claim made by Claim has one
    from the start; one made by Hold has none (HELD) until its Attach, and none again once
    Detach, or its netns's death, brings it home."""

    netns_inode: int
    netns_path: str  # the path the caller named (hint for re-opening), "" for ClaimFd
    nsid: int  # the netns's id as seen from init_net; -1 if none was assigned
    # the netns's cookie, which no other netns gets (its inode and nsid go to the next ones
    # made once it dies); 0 if unknown (saved by an older rdmad)
    netns_cookie: int = 0
    # the ifindex inside the netns (macvlan child, or the moved netdev); 0 if unknown
    ns_ifindex: int = 0
    route_table: int = 0  # its policy-routing table in its netns, 0 if none
    host: HostConfig | None = None  # whole-device claims that moved the netdev
    netdev_moved: bool = False
    rdma_moved: bool = False
    # exclusive mode: the device as init_net listed it before the claim moved it, which the
    # next start lists again while the move hides it (None: not moving it, or an older rdmad)
    moved_device: RdmaDevice | None = None
    gids: tuple[Gid, ...] = ()  # the entries of the GID table that are the claim's
    # its netdev inside the netns as last read (after its steps, and after each address
    # change there): its MAC, and its addresses as CIDRs, link-local IPv6 left out (the
    # kernel makes those itself); "" and () for a claim that moved no netdev
    ns_mac: str = ""
    ns_addresses: tuple[str, ...] = ()


@dataclass
class Claim:
    """A live claim. Persisted, so every field is plain data."""

    id: str
    device: str
    ifname: str  # the netdev's name inside the netns ("" when no netdev moved)
    shared: bool
    owner: str
    created_at_us: int
    attachment: Attachment | None  # None while HELD: no netns yet
    chardevs: tuple[CharDev, ...] = ()
    cdi_device: str = ""
    phase: ClaimPhase = ClaimPhase.ACTIVE
    cdi_name: str = ""  # a second CDI device name for the same char devices, "" if none
    pod_cdi_name: str = ""  # the CDI device name of its pod's spec (rdmad.daemon.cdi), "" if none
    failure: str = ""  # NOT_RETURNED: the error of the last give-back tried at start
    hold: HoldSpec | None = None  # made by Hold: the pod it is for, what Attach applies
    end_reason: ReleaseReason | None = None  # ENDED: why, for its Released
    claimant: int = 0  # the uid that made the claim (0 when saved by an older rdmad)
    # the cgroup (relative to the cgroup2 mount) whose rdma.max holds the claim's limit on
    # its device, and that limit; "" and None without one. Lifted back to `max` at the end.
    cgroup: str = ""
    limit: RdmaLimit | None = None

    @property
    def attached(self) -> Attachment:
        """Its attachment, where only an attached claim can be (its kernel steps, its
        give-back, its GIDs)."""
        assert self.attachment is not None, f"claim {self.id} is held, not attached"
        return self.attachment

    @property
    def netns_inode(self) -> int:
        """Its netns's inode, 0 while HELD."""
        return self.attachment.netns_inode if self.attachment is not None else 0

    @property
    def netns(self) -> str:
        """ "" while HELD: no netns yet."""
        return netns_label(self.netns_inode) if self.netns_inode else ""

    @property
    def gids(self) -> tuple[Gid, ...]:
        """The GID entries that are the claim's: none while HELD."""
        return self.attachment.gids if self.attachment is not None else ()


@dataclass(frozen=True)
class DeviceView:
    """A device as the bus shows it: kernel facts plus the daemon's claims."""

    device: RdmaDevice
    state: DeviceState
    netns: str  # INIT_NETNS or net:[INODE]
    claims: tuple[str, ...]  # claim ids
    carrier: bool = False  # its netdev's, while that is in init_net
