"""An in-memory kernel: netns, netdevs, nsids and RDMA devices, behind the protocols the core
drives (rdmad.core.backend: NetdevBackend, RdmaBackend, NetnsResolver). For tests that run the
real Core without root, a bus or a kernel.

It keeps the kernel's rules that shape the core, as docs/kernel-notes.md states them ("The
rules rdmad is built on", their reference): the RDMA netns mode, moves of RDMA devices and
netdevs, nsids, a netns's life and death, software devices, what RDMA netlink names. A
netns here is named by its inode, and only a name or an open fd keeps it alive: no process
is ever in one.

Kernel events go to the sink the core subscribed (`attach`), as the event sources deliver
them: after the step that caused them. A test can hold them back (`hold_events`) and
`deliver` them late, as a socket not read yet does. `fail` makes the next call of an
operation fail before it changes anything; `pause` stops the next call of an operation
until the test lets it go.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import ipaddress
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from rdmad.core.backend import EventSink, NetnsTarget, PlacedNetdev, Placement
from rdmad.core.events import (
    AddressChanged,
    Event,
    LinkChanged,
    LinkRemoved,
    NetnsGone,
    RdmaChanged,
)
from rdmad.errors import (
    AccessDenied,
    InvalidArgs,
    InvalidNetns,
    KernelError,
    ModeBusy,
    NoSuchDevice,
    NotSupported,
    RdmadError,
    Unavailable,
    from_errno,
)
from rdmad.model import (
    CharDev,
    ChardevKind,
    Cidr,
    Gid,
    HostConfig,
    Netdev,
    NetnsMode,
    Port,
    PortCounters,
    RdmaDevice,
    Route,
)
from tests.support.fake_cgroups import FakeCgroups

INIT = 0  # where init_net's netdevs and RDMA devices live (a netns is named by its inode)
UVERBS_MAJOR, UVERBS_BASE_MINOR = 231, 192
RDMA_CM_MAJOR, RDMA_CM_MINOR = 10, 58
IN_FLIGHT_TURNS = 3


class ProcessGone(RuntimeError):
    """A backend call from a daemon process the test has crashed."""


@dataclass
class FakeNetns:
    inode: int
    name: str
    named: bool = True  # a bind mount under /run/netns holds it
    refs: int = 0  # open fds
    nsid: int | None = None  # init_net's id for it
    dead: bool = False
    cookie: int = 0  # never reused, unlike the inode and the nsid
    owner_uid: int = 0  # its owning user namespace's owner
    # policy routing: (source address, table) per rule; (table, dst, via, ifindex) per route
    rules: set[tuple[str, int]] = field(default_factory=set)
    routes: set[tuple[int, str, str, int]] = field(default_factory=set)

    def tables(self) -> set[int]:
        """The tables that hold a route or that a rule looks up."""
        return {t for _, t in self.rules} | {r[0] for r in self.routes}

    @property
    def alive(self) -> bool:
        return not self.dead and (self.named or self.refs > 0)


@dataclass
class FakeLink:
    ifindex: int
    name: str
    mtu: int = 1500
    up: bool = True
    kind: str = ""  # "" for a physical NIC; veth, macvlan... are virtual
    addresses: tuple[str, ...] = ()  # CIDR strings, as HostConfig keeps them
    netns: int = INIT
    parent: int = 0  # a macvlan's lower netdev
    rail_sysctls: bool = False  # arp_ignore=1, arp_announce=2, rp_filter=2 (its netns's)

    @property
    def mac(self) -> str:
        """A locally administered MAC, from its ifindex."""
        return f"02:00:00:00:{self.ifindex >> 8 & 0xFF:02x}:{self.ifindex & 0xFF:02x}"

    def as_netdev(self) -> Netdev:
        return Netdev(self.ifindex, self.name, self.mtu, self.up, self.kind)

    def placed(self) -> PlacedNetdev:
        """What a claim shows of it in a pod's netns, in PlacedNetdev's order (IPv4 first,
        each family by address, link-local IPv6 left out), as the real adapter gives it."""
        cidrs = sorted(map(ipaddress.ip_interface, self.addresses), key=lambda c: (c.version, c))
        shown = (c for c in cidrs if not (c.version == 6 and c.ip.is_link_local))
        return PlacedNetdev(self.mac, tuple(c.with_prefixlen for c in shown))


@dataclass
class FakeRdmaDevice:
    index: int
    name: str
    ifindex: int  # its port's netdev
    virtual: bool = False  # rxe/siw
    netns: int = INIT
    minor: int = 0
    counters: dict[str, int] = field(default_factory=dict)  # port 1's, set by a test


@dataclass
class Gate:
    """Where `FakeKernel.pause` stops an operation: `reached` is set when a call arrives,
    and the call goes on once `go` is set."""

    reached: asyncio.Event = field(default_factory=asyncio.Event)
    go: asyncio.Event = field(default_factory=asyncio.Event)


class FakeKernel:
    def __init__(self, mode: NetnsMode = NetnsMode.SHARED) -> None:
        self.mode = mode  # UNAVAILABLE: ib_core is not loaded
        self.links: dict[int, FakeLink] = {}
        self.namespaces: dict[int, FakeNetns] = {}
        self.rdma: dict[str, FakeRdmaDevice] = {}
        self.nics_return_late = False  # physical netdevs of a dead netns wait in `parked`
        self.parked: list[FakeLink] = []
        self.sink: EventSink | None = None
        self._held: list[Event] | None = None
        self._failures: dict[str, RdmadError] = {}
        self._gates: dict[str, Gate] = {}
        self._ifindexes = itertools.count(2)  # 1 is lo
        self._inodes = itertools.count(4026532000)
        self._cookies = itertools.count(1)
        self._minors = itertools.count()
        self._fds = itertools.count(100)
        self.calls: collections.Counter[str] = collections.Counter()  # backend calls, by op
        self.cgroups = FakeCgroups()  # the cgroup2 hierarchy, with the rdma controller

    # -- the world, as a test (or another actor on the host) changes it -------------------

    def add_nic(
        self,
        name: str,
        *,
        mtu: int = 1500,
        up: bool = True,
        addresses: tuple[str, ...] = (),
        kind: str = "",
    ) -> FakeLink:
        link = FakeLink(self.new_ifindex(), name, mtu, up, kind, addresses)
        self.check_free(name, INIT)
        self.links[link.ifindex] = link
        self.emit(LinkChanged(link.as_netdev()))
        return link

    def add_rdma(self, name: str, netdev: str, *, virtual: bool = False) -> None:
        link = self.link(netdev)
        assert link is not None, f"no netdev {netdev} in init_net"
        index = max((d.index for d in self.rdma.values()), default=0) + 1
        self.rdma[name] = FakeRdmaDevice(index, name, link.ifindex, virtual, minor=self.new_minor())
        self.emit(RdmaChanged(f"add infiniband/{name}", device=name))

    def remove_rdma(self, name: str) -> None:
        """Hot-unplug (the netdev stays, as a driver unbind of the RDMA part leaves it)."""
        del self.rdma[name]
        self.emit(RdmaChanged(f"remove infiniband/{name}", device=name))

    def add_netns(self, name: str, inode: int | None = None, owner_uid: int = 0) -> FakeNetns:
        inode = inode if inode is not None else next(self._inodes)
        ns = FakeNetns(inode, name, cookie=next(self._cookies), owner_uid=owner_uid)
        self.namespaces[ns.inode] = ns
        return ns

    def delete_netns(self, name: str) -> None:
        """`ip netns del`: the netns dies now, or when the last fd on it closes."""
        ns = self.netns(name)
        ns.named = False
        self._maybe_dies(ns)

    def return_parked(self) -> None:
        """The kernel's cleanup of dead netns gets round to their physical netdevs."""
        parked, self.parked = self.parked, []
        for link in parked:
            self._return_home(link)

    def move_link(self, name: str, netns: str | None, from_netns: str | None = None) -> None:
        """Someone else's `ip link set NAME netns NETNS` (None: init_net)."""
        link = self.link(name, from_netns)
        assert link is not None, f"no netdev {name}"
        self.change_netns(link, self.netns(netns).inode if netns else INIT)

    def set_addresses(
        self, name: str, addresses: tuple[str, ...], netns: str | None = None
    ) -> None:
        """Someone's `ip addr add/del` on NAME: init_net hears of it when it happens there or
        in a netns init_net has an nsid for."""
        link = self.link(name, netns)
        assert link is not None, f"no netdev {name}"
        before, link.addresses = link.addresses, addresses
        nsid = None if link.netns == INIT else self.namespaces[link.netns].nsid
        if link.netns != INIT and nsid is None:
            return
        for cidr, removed in [(a, True) for a in before if a not in addresses] + [
            (a, False) for a in addresses if a not in before
        ]:
            address = ipaddress.ip_interface(cidr).ip
            self.emit(AddressChanged(nsid, link.ifindex, address, removed))

    def rename_link(self, name: str, new: str) -> None:
        link = self.link(name)
        assert link is not None
        self.check_free(new, INIT)
        link.name = new
        self.emit(LinkChanged(link.as_netdev()))

    # -- looking -------------------------------------------------------------------------

    def netns(self, name: str) -> FakeNetns:
        for ns in self.namespaces.values():
            if ns.name == name and not ns.dead:
                return ns
        raise KeyError(f"no netns {name}")

    def link(self, name: str, netns: str | None = None) -> FakeLink | None:
        where = self.netns(netns).inode if netns else INIT
        return next((x for x in self.links.values() if x.name == name and x.netns == where), None)

    def links_in(self, netns: str) -> list[FakeLink]:
        where = self.netns(netns).inode
        return [x for x in self.links.values() if x.netns == where]

    def rdma_netns(self, name: str) -> int:
        return self.rdma[name].netns

    def live_netns(self) -> list[FakeNetns]:
        return [ns for ns in self.namespaces.values() if ns.alive]

    # -- events, failures, pauses ---------------------------------------------------------

    def attach(self, sink: EventSink | None) -> None:
        """Deliver events to `sink` from now on (None: to nobody, as while no daemon runs)."""
        self.sink = sink

    def emit(self, event: Event) -> None:
        if self._held is not None:
            self._held.append(event)
        elif self.sink is not None:
            self.sink(event)

    @contextlib.contextmanager
    def hold_events(self) -> Iterator[list[Event]]:
        """Keep back the events of what happens inside, for the test to `deliver` later
        (as a socket nobody has read yet)."""
        held: list[Event] = []
        self._held = held
        try:
            yield held
        finally:
            self._held = None

    def deliver(self, events: list[Event]) -> None:
        for event in events:
            self.emit(event)

    def fail(self, op: str, error: RdmadError) -> None:
        """The next call of `op` (a backend method name) fails with `error`, changing nothing."""
        self._failures[op] = error

    def pause(self, op: str) -> Gate:
        """Stop the next call of `op` (before it does anything) until `gate.go` is set."""
        gate = self._gates[op] = Gate()
        return gate

    async def enter(self, op: str, process: Process) -> None:
        """Every call starts here. A real one waits for the kernel's reply over a socket,
        and the daemon goes on meanwhile (applying the events of its own last step, among
        others): so does this one, for a few turns of the loop."""
        if process.dead:
            raise ProcessGone(op)
        self.calls[op] += 1
        for _ in range(IN_FLIGHT_TURNS):
            await asyncio.sleep(0)
        gate = self._gates.pop(op, None)
        if gate is not None:
            gate.reached.set()
            await gate.go.wait()
            if process.dead:
                raise ProcessGone(op)
        failure = self._failures.pop(op, None)
        if failure is not None:
            raise failure

    # -- kernel rules ------------------------------------------------------------------------

    def new_minor(self) -> int:
        return next(self._minors)

    def new_ifindex(self) -> int:
        return next(self._ifindexes)

    def check_free(self, name: str, where: int) -> None:
        if any(x.name == name and x.netns == where for x in self.links.values()):
            raise InvalidArgs(f"the name {name} is already taken")

    def assign_nsid(self, ns: FakeNetns) -> int:
        if ns.nsid is None:
            taken = {n.nsid for n in self.namespaces.values() if n.alive}
            ns.nsid = next(i for i in itertools.count() if i not in taken)
        return ns.nsid

    def drop_link_state(self, link: FakeLink) -> None:
        """What a netdev leaving its netns (moved, deleted) takes with it there: its routes
        (in every table) and its IPv4 settings (the next netns gives it its defaults). The
        rules stay: they name addresses, not netdevs."""
        ns = self.namespaces.get(link.netns)
        if ns is not None:
            ns.routes = {r for r in ns.routes if r[3] != link.ifindex}
        link.rail_sysctls = False

    def change_netns(self, link: FakeLink, to: int) -> None:
        self.drop_link_state(link)
        if link.netns == INIT:
            self.emit(LinkRemoved(link.ifindex, link.name))
        link.netns = to
        link.addresses = ()  # a netdev loses its addresses when it changes netns
        if to == INIT:
            self.emit(LinkChanged(link.as_netdev()))
        else:
            self.assign_nsid(self.namespaces[to])
        for dev in [d for d in self.rdma.values() if d.virtual and d.ifindex == link.ifindex]:
            self.remove_rdma(dev.name)  # rxe does not survive its netdev's move

    def open_ref(self, ns: FakeNetns) -> None:
        ns.refs += 1

    def close_ref(self, ns: FakeNetns) -> None:
        ns.refs -= 1
        self._maybe_dies(ns)

    def _maybe_dies(self, ns: FakeNetns) -> None:
        if ns.alive or ns.dead:
            return
        ns.dead = True
        if ns.nsid is not None:
            nsid, ns.nsid = ns.nsid, None
            self.emit(NetnsGone(nsid))
        for link in [x for x in self.links.values() if x.netns == ns.inode]:
            if link.kind:
                del self.links[link.ifindex]
            elif self.nics_return_late:
                link.netns = -1  # on its way home: in no netns anyone can see
                self.parked.append(link)
            else:
                self._return_home(link)
        for dev in self.rdma.values():
            if dev.netns == ns.inode:  # rdma_dev_exit_net
                dev.netns, dev.minor = INIT, self.new_minor()
                self.emit(RdmaChanged(f"move infiniband/{dev.name}", device=dev.name))

    def _return_home(self, link: FakeLink) -> None:
        taken = any(x.name == link.name and x.netns == INIT for x in self.links.values())
        if taken:
            link.name = f"dev{link.ifindex}"
        link.netns, link.up, link.addresses = INIT, False, ()
        self.emit(LinkChanged(link.as_netdev()))

    # -- the daemon's side ---------------------------------------------------------------

    def process(self) -> Process:
        """The backends of one daemon process; `Process.crash` ends it like SIGKILL."""
        return Process(self)

    def new_fd(self) -> int:
        return next(self._fds)

    def describe(self, dev: FakeRdmaDevice) -> RdmaDevice:
        link = self.links.get(dev.ifindex)
        netdev = link.name if link is not None and link.netns == INIT else ""
        state = "ACTIVE" if link is not None and link.up else "DOWN"
        return RdmaDevice(
            index=dev.index,
            name=dev.name,
            driver="rxe" if dev.virtual else "mlx5_core",
            link_layer="Ethernet",
            ports=(Port(1, state, "LINK_UP", netdev),),
            netdev=netdev,
            netdev_ifindex=dev.ifindex if netdev else 0,
            chardevs=(f"/dev/infiniband/uverbs{dev.index - 1}",),
            virtual=dev.virtual,
        )

    def visible_from_init(self, dev: FakeRdmaDevice) -> bool:
        return self.mode == NetnsMode.SHARED or dev.netns == INIT


class Process:
    def __init__(self, kernel: FakeKernel) -> None:
        self.kernel = kernel
        self.dead = False
        self.handles: list[FakeHandle] = []
        self.net = FakeNetdevs(kernel, self)
        self.rdma = FakeRdma(kernel, self)
        self.resolver = FakeResolver(kernel, self)

    def crash(self) -> None:
        """As SIGKILL: every fd it held closes, and it does nothing more."""
        self.dead = True
        for handle in list(self.handles):
            handle.close()


class FakeHandle:
    """An open netns fd (rdmad.core.backend.NetnsTarget): keeps its netns alive until closed."""

    def __init__(self, kernel: FakeKernel, process: Process, ns: FakeNetns, path: str) -> None:
        self._kernel, self._process, self._ns = kernel, process, ns
        self._fd = kernel.new_fd()
        self._path = path
        self._on_close: list[Callable[[], None]] = []
        kernel.open_ref(ns)
        process.handles.append(self)

    @property
    def fd(self) -> int:
        if self._fd < 0:
            raise ValueError(f"netns handle for {self._ns.name} is closed")
        return self._fd

    @property
    def inode(self) -> int:
        return self._ns.inode

    @property
    def path(self) -> str:
        return self._path

    @property
    def closed(self) -> bool:
        return self._fd < 0

    @property
    def ns(self) -> FakeNetns:
        if self._fd < 0:
            raise ValueError(f"netns handle for {self._ns.name} is closed")
        return self._ns

    def on_close(self, callback: Callable[[], None]) -> None:
        self._on_close.append(callback)

    def close(self) -> None:
        if self._fd >= 0:
            self._fd = -1
            self._process.handles.remove(self)
            self._kernel.close_ref(self._ns)
            for callback in self._on_close:
                callback()


def _ns_of(target: NetnsTarget) -> FakeNetns:
    assert isinstance(target, FakeHandle), target
    return target.ns


class FakeResolver:
    """rdmad.core.backend.NetnsResolver: netns by name (`NAME`, `/run/netns/NAME`) or by inode."""

    def __init__(self, kernel: FakeKernel, process: Process) -> None:
        self._kernel, self._process = kernel, process

    def open(self, spec: str, owner: int | None = None) -> FakeHandle:
        name = spec.removeprefix("/run/netns/")
        for ns in self._kernel.namespaces.values():
            if ns.name == name and ns.named and ns.alive:
                return self._handle(ns, spec, owner)
        raise InvalidNetns(f"{spec!r}: /run/netns/{name} does not exist")

    def adopt_fd(self, fd: int, owner: int | None = None) -> FakeHandle:
        inode = os.fstat(fd).st_ino
        ns = self._kernel.namespaces.get(inode)
        if ns is None or not ns.alive:
            raise InvalidNetns(f"fd {fd} is not a network namespace")
        return self._handle(ns, "", owner)

    def _handle(self, ns: FakeNetns, path: str, owner: int | None) -> FakeHandle:
        if owner is not None and ns.owner_uid != owner:
            raise AccessDenied(f"{ns.name} is not uid {owner}'s")
        return FakeHandle(self._kernel, self._process, ns, path)

    def reopen(self, inode: int, path_hint: str) -> FakeHandle | None:
        ns = self._kernel.namespaces.get(inode)
        if ns is None or not ns.alive:
            return None
        return FakeHandle(self._kernel, self._process, ns, path_hint)

    async def cookie(self, target: NetnsTarget) -> int:
        return _ns_of(target).cookie

    def other_netns_exist(self) -> bool:
        return bool(self._kernel.live_netns())


class FakeNetdevs:
    """rdmad.core.backend.NetdevBackend over the fake kernel."""

    def __init__(self, kernel: FakeKernel, process: Process) -> None:
        self._k, self._p = kernel, process

    def _home(self, ifindex: int, what: str) -> FakeLink:
        link = self._k.links.get(ifindex)
        if link is None or link.netns != INIT:
            raise KernelError(errno.ENODEV, f"{what}: no netdev {ifindex} in init_net")
        return link

    async def list_netdevs(self) -> list[Netdev]:
        await self._k.enter("list_netdevs", self._p)
        return [x.as_netdev() for x in self._k.links.values() if x.netns == INIT]

    async def get_netdev(self, ifindex: int) -> Netdev | None:
        await self._k.enter("get_netdev", self._p)
        link = self._k.links.get(ifindex)
        return link.as_netdev() if link is not None and link.netns == INIT else None

    async def has_netdev(self, ifindex: int) -> bool:
        return await self.get_netdev(ifindex) is not None

    async def host_config(self, ifindex: int) -> HostConfig:
        await self._k.enter("host_config", self._p)
        link = self._home(ifindex, "reading a netdev")
        return HostConfig(link.ifindex, link.name, link.mtu, link.up, link.addresses)

    async def place(
        self,
        ifindex: int,
        target: NetnsTarget,
        ifname: str,
        mtu: int | None,
        addresses: tuple[Cidr, ...],
        host: HostConfig | None = None,
    ) -> Placement:
        await self._k.enter("place", self._p)
        ns = _ns_of(target)
        link = self._home(ifindex, f"moving into {ns.name}")
        self._k.check_free(ifname, ns.inode)
        self._k.change_netns(link, ns.inode)
        link.name, link.up = ifname, True
        link.addresses = tuple(a.with_prefixlen for a in addresses)
        if mtu is not None:
            link.mtu = mtu
        return Placement(self._k.assign_nsid(ns), link.ifindex, ifname, link.placed())

    async def add_macvlan(
        self,
        parent_ifindex: int,
        target: NetnsTarget,
        ifname: str,
        mtu: int | None,
        addresses: tuple[Cidr, ...],
    ) -> Placement:
        await self._k.enter("add_macvlan", self._p)
        ns = _ns_of(target)
        parent = self._home(parent_ifindex, "creating a macvlan")
        self._k.check_free(ifname, ns.inode)
        child = FakeLink(
            self._k.new_ifindex(),
            ifname,
            mtu or parent.mtu,
            True,
            "macvlan",
            tuple(a.with_prefixlen for a in addresses),
            ns.inode,
            parent.ifindex,
        )
        self._k.links[child.ifindex] = child  # created in the netns: init_net hears nothing
        return Placement(self._k.assign_nsid(ns), child.ifindex, ifname, child.placed())

    async def read_placed(self, placement: Placement) -> PlacedNetdev:
        await self._k.enter("read_placed", self._p)
        link = self._k.links.get(placement.ifindex)
        if link is None or link.netns == INIT:
            raise KernelError(errno.ENODEV, f"no netdev {placement.ifindex} in netns id")
        return link.placed()

    async def bring_home(
        self, placement: Placement, host: HostConfig, source: NetnsTarget | None = None
    ) -> Netdev:
        await self._k.enter("bring_home", self._p)
        if source is not None:
            ns = _ns_of(source)
        else:
            found = [n for n in self._k.live_netns() if n.nsid == placement.nsid]
            if not found:
                raise InvalidNetns(f"no live netns has nsid {placement.nsid}")
            ns = found[0]
        link = self._k.links.get(placement.ifindex)
        if link is None or link.netns != ns.inode:
            raise KernelError(errno.ENODEV, f"no netdev {placement.ifindex} in {ns.name}")
        self._k.check_free(host.name, INIT)
        # As the kernel has it: the netdev arrives down and without addresses (under the name
        # and MTU the move set); the backend then adds the host's addresses and sets it up.
        link.name, link.mtu, link.up, link.addresses = host.name, host.mtu, False, ()
        self._k.change_netns(link, INIT)
        await self._k.enter("configure_home", self._p)
        link.addresses, link.up = host.addresses, host.up
        return link.as_netdev()  # the caller takes the inventory's view from this

    async def restore(self, ifindex: int, host: HostConfig) -> None:
        await self._k.enter("restore", self._p)
        link = self._home(ifindex, f"restoring {host.name}")
        if link.name != host.name:
            self._k.check_free(host.name, INIT)
        link.name, link.mtu, link.up, link.addresses = host.name, host.mtu, host.up, host.addresses
        self._k.emit(LinkChanged(link.as_netdev()))

    async def delete(self, placement: Placement) -> None:
        await self._k.enter("delete", self._p)
        found = [n for n in self._k.live_netns() if n.nsid == placement.nsid]
        if not found:
            return  # the netns died and took the netdev with it
        for link in [x for x in self._k.links.values() if x.netns == found[0].inode]:
            if placement.ifindex:
                hit = link.ifindex == placement.ifindex
            else:  # by name, and only a macvlan: never a netdev of the container's own
                hit = link.kind == "macvlan" and link.name == placement.ifname
            if hit:
                self._k.drop_link_state(link)
                del self._k.links[link.ifindex]

    async def free_table(self, target: NetnsTarget, candidates: Iterable[int]) -> int:
        await self._k.enter("free_table", self._p)
        in_use = _ns_of(target).tables()
        return next((t for t in candidates if t not in in_use), 0)

    async def add_policy_routing(
        self,
        target: NetnsTarget,
        ifindex: int,
        table: int,
        addresses: tuple[Cidr, ...],
        extra: tuple[Route, ...],
    ) -> None:
        await self._k.enter("add_policy_routing", self._p)
        ns = _ns_of(target)
        link = self._k.links.get(ifindex)
        if link is None or link.netns != ns.inode:
            raise KernelError(errno.ENODEV, f"no netdev {ifindex} in {ns.name}")
        link.rail_sysctls = True
        for r in (*(Route(a.network) for a in addresses), *extra):
            ns.routes.add((table, str(r.dst), str(r.via or ""), ifindex))
        ns.rules |= {(str(a.ip), table) for a in addresses}

    async def remove_policy_routing(self, target: NetnsTarget, table: int) -> None:
        await self._k.enter("remove_policy_routing", self._p)
        ns = _ns_of(target)
        ns.rules = {r for r in ns.rules if r[1] != table}
        ns.routes = {r for r in ns.routes if r[0] != table}

    async def nsid(self, target: NetnsTarget) -> int:
        await self._k.enter("nsid", self._p)
        return self._k.assign_nsid(_ns_of(target))

    async def live_nsids(self) -> set[int]:
        await self._k.enter("live_nsids", self._p)
        return {n.nsid for n in self._k.live_netns() if n.nsid is not None}


class FakeRdma:
    """rdmad.core.backend.RdmaBackend over the fake kernel."""

    def __init__(self, kernel: FakeKernel, process: Process) -> None:
        self._k, self._p = kernel, process

    def _by_index(self, index: int) -> FakeRdmaDevice | None:
        return next((d for d in self._k.rdma.values() if d.index == index), None)

    async def netns_mode(self) -> NetnsMode:
        await self._k.enter("netns_mode", self._p)
        return self._k.mode

    async def set_netns_mode(self, mode: NetnsMode) -> None:
        await self._k.enter("set_netns_mode", self._p)
        if self._k.mode == NetnsMode.UNAVAILABLE:
            raise Unavailable("no RDMA subsystem")
        if mode == self._k.mode:
            return
        if self._k.live_netns():
            raise ModeBusy("other network namespaces exist (kernel EBUSY)")
        self._k.mode = mode

    async def list_devices(self) -> list[RdmaDevice]:
        await self._k.enter("list_devices", self._p)
        devs = sorted(self._k.rdma.values(), key=lambda d: d.index)
        return [self._k.describe(d) for d in devs if self._k.visible_from_init(d)]

    async def get_device(self, index: int) -> RdmaDevice | None:
        await self._k.enter("get_device", self._p)
        dev = self._by_index(index)
        if dev is None or not self._k.visible_from_init(dev):
            return None
        return self._k.describe(dev)

    async def move(self, index: int, target: NetnsTarget) -> None:
        await self._k.enter("move", self._p)
        ns = _ns_of(target)
        if self._k.mode != NetnsMode.EXCLUSIVE:
            raise NotSupported("shared mode: RDMA devices cannot change netns (EOPNOTSUPP)")
        dev = self._by_index(index)
        if dev is None or dev.netns != INIT:
            raise from_errno(errno.EINVAL, f"move RDMA device {index}: not in init_net")
        dev.netns, dev.minor = ns.inode, self._k.new_minor()
        self._k.emit(RdmaChanged(f"move infiniband/{dev.name}", device=dev.name))

    async def move_home(self, name: str, source: NetnsTarget) -> None:
        await self._k.enter("move_home", self._p)
        ns = _ns_of(source)
        dev = self._k.rdma.get(name)
        if dev is None or dev.netns != ns.inode:
            raise from_errno(errno.EINVAL, f"move {name} home: not in {ns.name}")
        dev.netns, dev.minor = INIT, self._k.new_minor()
        self._k.emit(RdmaChanged(f"move infiniband/{name}", device=name))

    async def chardevs(
        self, device: RdmaDevice, kinds: tuple[ChardevKind, ...], inside: NetnsTarget | None
    ) -> tuple[CharDev, ...]:
        await self._k.enter("chardevs", self._p)
        dev = self._k.rdma.get(device.name)
        where = _ns_of(inside).inode if inside is not None else INIT
        if dev is None or (self._k.mode == NetnsMode.EXCLUSIVE and dev.netns != where):
            raise KernelError(errno.ENODEV, f"GET_CHARDEV {device.name}")
        out = []
        for kind in kinds:
            if kind == ChardevKind.RDMA_CM:
                out.append(CharDev(kind, "/dev/infiniband/rdma_cm", RDMA_CM_MAJOR, RDMA_CM_MINOR))
            else:
                path = f"/dev/infiniband/{kind.value}{dev.index - 1}"
                out.append(CharDev(kind, path, UVERBS_MAJOR, UVERBS_BASE_MINOR + dev.minor))
        return tuple(out)

    async def gids(
        self, device: str, inside: NetnsTarget | None, netdev: Placement | None
    ) -> tuple[Gid, ...]:
        await self._k.enter("gids", self._p)
        dev = self._k.rdma.get(device)
        if dev is None:
            raise NoSuchDevice(f"RDMA device {device} went away while its GIDs were read")
        # One RoCE v2 entry per IPv4 address of the netdev (a shared claim's: its child), as
        # rxe's table has; ifindexes are unique across this fake's netns.
        link = self._k.links.get(netdev.ifindex if netdev is not None else dev.ifindex)
        if link is None:
            return ()
        v4 = [a.split("/")[0] for a in link.addresses if ":" not in a]
        return tuple(
            Gid(1, i, ipaddress.IPv6Address(f"::ffff:{a}").exploded, "RoCE v2", link.name)
            for i, a in enumerate(v4, start=1)
        )

    async def counters(
        self, device: RdmaDevice, inside: NetnsTarget | None
    ) -> tuple[PortCounters, ...]:
        await self._k.enter("counters", self._p)
        dev = self._k.rdma.get(device.name)
        where = _ns_of(inside).inode if inside is not None else INIT
        if dev is None or (self._k.mode == NetnsMode.EXCLUSIVE and dev.netns != where):
            raise NoSuchDevice(f"RDMA device {device.name} went away while its counters were read")
        return (PortCounters(1, dict(dev.counters)),)

    async def close(self) -> None:
        return None
