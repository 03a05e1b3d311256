"""The interfaces the core drives. Adapters in rdmad.kernel (and the simulator) implement them.

The core never sees a socket: it sees these protocols, plain data from rdmad.model and the
events in rdmad.core.events. Every operation that changes the kernel has an inverse, so the core
can roll a half-done claim back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from rdmad.core.events import Event
from rdmad.model import (
    CharDev,
    ChardevKind,
    Cidr,
    Gid,
    HostConfig,
    Netdev,
    NetnsMode,
    PortCounters,
    RdmaDevice,
    RdmaLimit,
    RdmaUsage,
    Route,
)


class NetnsTarget(Protocol):
    """An open network namespace, held only for the duration of one operation.

    The core calls close() as soon as the operation is over: an open fd keeps a dead netns
    alive, and rdmad must never pin a claimed netns.
    """

    @property
    def fd(self) -> int: ...

    @property
    def inode(self) -> int: ...

    @property
    def path(self) -> str: ...  # what the caller named, "" for an fd

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call `callback` when the handle closes: what an adapter opened in the netns for
        this operation (a socket, which pins the netns too) goes with it."""
        ...

    def close(self) -> None: ...


class NetnsResolver(Protocol):
    def open(self, spec: str, owner: int | None = None) -> NetnsTarget:
        """Open a netns named as /run/netns/NAME, /proc/PID/ns/net, NAME or pid:PID.

        Raises InvalidNetns for anything that is not a netns other than init_net, and, when
        `owner` is a uid, AccessDenied for a netns whose owning user namespace's owner is
        another uid (init_net's is root's), checked before init_net is.
        """
        ...

    def adopt_fd(self, fd: int, owner: int | None = None) -> NetnsTarget:
        """Wrap a caller's netns fd (dup'ed; the caller keeps its own). Same checks as open."""
        ...

    def reopen(self, inode: int, path_hint: str) -> NetnsTarget | None:
        """Find a live netns by inode (hint first, then bind mounts, processes, fds).

        None when no reachable holder is left, which for a claim means the netns is gone or
        about to be.
        """
        ...

    async def cookie(self, target: NetnsTarget) -> int:
        """The netns's cookie: the kernel gives no other netns the same until reboot, while
        it gives a dead netns's inode and nsid to the next ones made (lowest free first)."""
        ...

    def other_netns_exist(self) -> bool:
        """Whether any netns besides init_net is reachable (the kernel's EBUSY rule for
        changing the RDMA netns mode)."""
        ...


@dataclass(frozen=True)
class PlacedNetdev:
    """What a claim's user sees of its netdev in its netns: its MAC (aa:bb:...), and its
    addresses as CIDRs, link-local IPv6 left out, IPv4 first, each family by address."""

    mac: str
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class Placement:
    """Where a netdev ended up inside a claimant's netns; from `place` and `add_macvlan`,
    also what they left it as there (`netdev`), so that a claim reads nothing back."""

    nsid: int  # the netns's id from init_net (-1 if the kernel assigned none)
    ifindex: int  # the netdev's ifindex inside the netns
    ifname: str
    netdev: PlacedNetdev | None = None  # None: a placement rebuilt from a claim's record


class NetdevBackend(Protocol):
    """rtnetlink, always real: every netdev operation happens in the kernel."""

    async def list_netdevs(self) -> list[Netdev]:
        """All netdevs in init_net."""
        ...

    async def get_netdev(self, ifindex: int) -> Netdev | None:
        """One netdev in init_net, or None if init_net has no such ifindex."""
        ...

    async def has_netdev(self, ifindex: int) -> bool:
        """Whether init_net has a netdev of that ifindex: get_netdev without reading it."""
        ...

    async def host_config(self, ifindex: int) -> HostConfig:
        """Name, MTU, admin state and addresses of a netdev in init_net."""
        ...

    async def place(
        self,
        ifindex: int,
        target: NetnsTarget,
        ifname: str,
        mtu: int | None,
        addresses: tuple[Cidr, ...],
        host: HostConfig | None = None,
    ) -> Placement:
        """Move an init_net netdev into `target`, rename it, set MTU and addresses, bring it up.

        `host` is the netdev's host_config() when the caller has just read it. All or
        nothing: on failure the netdev is back in init_net as it was.
        """
        ...

    async def add_macvlan(
        self,
        parent_ifindex: int,
        target: NetnsTarget,
        ifname: str,
        mtu: int | None,
        addresses: tuple[Cidr, ...],
    ) -> Placement:
        """Create a bridge-mode macvlan child of an init_net netdev inside `target`.

        All or nothing: on failure no child is left anywhere.
        """
        ...

    async def read_placed(self, placement: Placement) -> PlacedNetdev:
        """The MAC and addresses of a netdev placed in a claimant's netns, read by nsid."""
        ...

    async def bring_home(
        self, placement: Placement, host: HostConfig, source: NetnsTarget | None = None
    ) -> Netdev:
        """Move a netdev from a claimant's netns back to init_net and restore `host`.

        Needs a socket inside the netns (the kernel's SETLINK ignores IFLA_TARGET_NETNSID),
        so pass `source` when the caller has it open; otherwise the netns is found by nsid.
        Returns the netdev as it now is in init_net (ahead of the events that will tell).
        """
        ...

    async def restore(self, ifindex: int, host: HostConfig) -> None:
        """Put an init_net netdev back to `host` (name, MTU, addresses, admin state).

        For a netdev the kernel returned on netns death, as its in-netns name or devN.
        """
        ...

    async def delete(self, placement: Placement) -> None:
        """Delete a netdev (a macvlan child) inside a claimant's netns, by nsid."""
        ...

    async def free_table(self, target: NetnsTarget, candidates: Iterable[int]) -> int:
        """The first of `candidates` (table ids above 0) that holds no route in `target` and
        that no rule there looks up; 0 if none does."""
        ...

    async def add_policy_routing(
        self,
        target: NetnsTarget,
        ifindex: int,
        table: int,
        addresses: tuple[Cidr, ...],
        extra: tuple[Route, ...],
    ) -> None:
        """In `target`: the rule `from <address> lookup <table>` per address, the addresses'
        connected routes and `extra` out of netdev `ifindex` in `table`, and the rail
        sysctls (arp_ignore=1, arp_announce=2, rp_filter=2) on it. All or nothing."""
        ...

    async def remove_policy_routing(self, target: NetnsTarget, table: int) -> None:
        """Delete every rule looking up `table` in `target`, and every route in it."""
        ...

    async def nsid(self, target: NetnsTarget) -> int:
        """The id init_net has for `target`, assigning one if needed."""
        ...

    async def live_nsids(self) -> set[int]:
        """The nsids init_net currently knows about (a dump of RTM_GETNSID)."""
        ...


class RdmaBackend(Protocol):
    """The RDMA half: the kernel's RDMA netlink, or the explicit simulator."""

    async def netns_mode(self) -> NetnsMode:
        """UNAVAILABLE when there is no RDMA subsystem."""
        ...

    async def set_netns_mode(self, mode: NetnsMode) -> None:
        """Raises ModeBusy while other netns exist, Unavailable without RDMA."""
        ...

    async def list_devices(self) -> list[RdmaDevice]:
        """The RDMA devices visible in init_net."""
        ...

    async def get_device(self, index: int) -> RdmaDevice | None:
        """One RDMA device visible in init_net, or None if init_net sees no such index."""
        ...

    async def move(self, index: int, target: NetnsTarget) -> None:
        """Move an RDMA device from init_net into `target` (exclusive mode only)."""
        ...

    async def move_home(self, name: str, source: NetnsTarget) -> None:
        """Move an RDMA device from `source` back to init_net, from a thread inside `source`
        (the kernel takes the calling thread's netns as the source)."""
        ...

    async def chardevs(
        self,
        device: RdmaDevice,
        kinds: tuple[ChardevKind, ...],
        inside: NetnsTarget | None,
    ) -> tuple[CharDev, ...]:
        """Ask the kernel (GET_CHARDEV) for the char devices of `device`, from inside
        `inside` when the device lives there. Never reuse values from before a move."""
        ...

    async def gids(
        self, device: str, inside: NetnsTarget | None, netdev: Placement | None
    ) -> tuple[Gid, ...]:
        """The entries of `device`'s GID table a claim gets, as `inside` (a claimant's netns;
        None: init_net) sees the device: every entry, or with `netdev` (a netdev placed in
        `inside`) the entries made for that netdev's addresses."""
        ...

    async def counters(
        self, device: RdmaDevice, inside: NetnsTarget | None
    ) -> tuple[PortCounters, ...]:
        """Read every port's counters now, from inside `inside` when the device lives there.

        Raises NoSuchDevice when the device is gone before or during the read.
        """
        ...

    async def close(self) -> None: ...


class CgroupBackend(Protocol):
    """The rdma controller of cgroup v2: a device's line in a cgroup's rdma.max and
    rdma.current. Cgroups are named relative to the cgroup2 mount."""

    def resolve(self, path: str) -> str:
        """The cgroup `path` names (relative to the mount, or absolute under it), as its
        real path relative to the mount. InvalidArgs for a path that leaves the mount (by
        `..` or a symlink) or names its root, NoSuchCgroup for one that does not exist,
        NotSupported when the host's cgroup2 has no rdma controller."""
        ...

    def set_limit(self, cgroup: str, device: str, limit: RdmaLimit) -> None:
        """Enable rdma in the subtree_control of each ancestor that lacks it, then write
        `device`'s line into the cgroup's rdma.max."""
        ...

    def lift(self, cgroup: str, device: str) -> None:
        """Put `device`'s line in rdma.max back to `max`; nothing if the cgroup or the
        device is gone (the line went with it). Idempotent."""
        ...

    def usage(self, cgroup: str, device: str) -> RdmaUsage | None:
        """`device`'s lines in rdma.current and rdma.max, None once the cgroup is gone."""
        ...


EventSink = Callable[[Event], None]


class EventSource(Protocol):
    """A kernel event stream (rtnetlink, udev, RDMA netlink monitor).

    `start` returns once the source is subscribed, so the caller can enumerate afterwards
    and miss nothing. An overrun (ENOBUFS) is reported as a Resync event.
    """

    async def start(self, sink: EventSink) -> None: ...

    async def stop(self) -> None: ...
