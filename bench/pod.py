"""9. An 8-rail pod: the 8 claims of one pod into one netns, each rail with its own
address (one subnet per rail), policy routing (a table rdmad picks, `table=0`) and the
pod's CDI name (`pod_cdi_name`); 8 whole-device rails, then 4 whole-device and 4 shared.

Three columns, one pod each per rep, in turn (bench.columns' cycle of orders):
  back to back: one client sends the 8 claims one after another; the pod's time runs to the
                last reply;
  at once:      8 clients, one per rail, send their claims at the same moment (makespan);
  raw serial:   the same kernel operations, rail after rail from one process: the floor, as
                the kernel serialises moves, links and routes under the RTNL lock. Per rail:
                bench.claim.Raw's (whole device) or bench.shared.RawShared's (macvlan), then
                arp_ignore/arp_announce/rp_filter in one RTM_SETLINK, the connected route in
                the rail's table and the rule `from <address> lookup <table>`.
Each pod is released after its column (untimed: the removal of rules and routes first, as
rdmad does), and a pause lets the kernel's RCU work drain before the next. rdmad's share
beyond raw is its D-Bus round trips, its lookups (the netns's rules and a free table's
routes), the state saves and the pod-wide CDI rewrite of every spec of the netns at each
claim.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from dbus_fast import Variant

from bench.claim import NS_MTU, Raw
from bench.columns import ORDERS
from bench.common import (
    BENCH_NET,
    Params,
    Results,
    Row,
    claim,
    claim_options,
    many_veths,
    ms_since,
    rdmad,
    release,
)
from bench.stats import RatioCheck, spread
from rdmad.kernel.netlink import attr_nest, attr_u32, encode
from rdmad.kernel.netns import run_in_netns
from rdmad.kernel.rtnl_routing import (
    IFLA_AF_SPEC,
    IFLA_INET_CONF,
    RAIL_DEVCONF,
    RTM_SETLINK,
    RULE_PRIORITY,
)
from testbed.daemon import Client
from testbed.net import temp_netns

RAILS = 8
TARGET = 1.15
DRAIN_S = 0.1  # after a pod's release: 16 moves' RCU work
FIRST_TABLE = 1000  # rdmad's route_tables start: table=0 gives rail i table 1000 + i
KINDS = {"8 whole-device": 0, "4 whole-device + 4 shared": 4}  # kind -> shared rails


@dataclass(frozen=True)
class Rail:
    index: int
    shared: bool

    @property
    def ifname(self) -> str:
        return f"rail{self.index}"

    @property
    def address(self) -> str:
        return f"10.77.{self.index}.2/24"

    @property
    def subnet(self) -> str:
        return f"10.77.{self.index}.0/24"

    @property
    def table(self) -> int:
        return FIRST_TABLE + self.index


def pod_rails(shared: int, rails: int = RAILS) -> list[Rail]:
    """The pod's rails: the first `rails - shared` whole-device, the rest shared."""
    return [Rail(i, i >= rails - shared) for i in range(rails)]


def rail_options(rail: Rail, pod: str) -> dict[str, Variant]:
    opts = claim_options(rail.ifname, NS_MTU, [rail.address], shared=rail.shared)
    opts["table"] = Variant("u", 0)
    opts["pod_cdi_name"] = Variant("s", pod)
    return opts


class RawRail(Raw):
    """One rail's kernel operations, in-process: pyroute2 for all but the devconf, which
    pyroute2 0.9 cannot encode as the kernel takes it (IFLA_INET_CONF is a nest of
    attributes, pyroute2 sends a struct), so that one goes out as rdmad builds it."""

    def __init__(self, rail: Rail, host: str, netns: str) -> None:
        super().__init__(host, socket.if_nametoindex(host), netns)
        self.rail = rail
        self.host_addr = f"{BENCH_NET[rail.index]}/32"  # many_veths's
        self.ns_index = self.index
        self._conf: socket.socket | None = None

    async def open(self) -> None:
        await super().open()
        fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._conf = await run_in_netns(
                fd, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
            )
        finally:
            os.close(fd)

    def close(self) -> None:
        super().close()
        if self._conf is not None:
            self._conf.close()

    async def claim(self) -> None:
        assert self.ns is not None
        r = self.rail
        fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if r.shared:
                await self.init.link(
                    "add",
                    ifname=r.ifname,
                    kind="macvlan",
                    macvlan_mode="bridge",
                    link=self.index,
                    net_ns_fd=fd,
                    mtu=NS_MTU,
                )
            else:
                await self.init.link("set", index=self.index, net_ns_fd=fd, ifname=r.ifname)
        finally:
            os.close(fd)
        if r.shared:
            (self.ns_index,) = await self.ns.link_lookup(ifname=r.ifname)
        else:
            await self.ns.link("set", index=self.ns_index, mtu=NS_MTU)
        addr, plen = r.address.split("/")
        await self.ns.addr("add", index=self.ns_index, address=addr, prefixlen=int(plen))
        await self.ns.link("set", index=self.ns_index, state="up")
        self._set_devconf()
        await self.ns.route(
            "add", dst=r.subnet, oif=self.ns_index, table=r.table, scope=253, proto=4
        )
        await self.ns.rule(
            "add", family=socket.AF_INET, src=addr, src_len=32, table=r.table,
            priority=RULE_PRIORITY,
        )  # fmt: skip

    def _set_devconf(self) -> None:
        assert self._conf is not None
        conf = attr_nest(IFLA_INET_CONF, (attr_u32(k, v) for k, v in RAIL_DEVCONF.items()))
        spec = attr_nest(IFLA_AF_SPEC, (attr_nest(socket.AF_INET, (conf,)),))
        body = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, self.ns_index, 0, 0) + spec
        self._conf.send(encode(RTM_SETLINK, body, seq=1, flags=0x4))  # NLM_F_ACK
        ack = self._conf.recv(4096)
        errno_ = -int.from_bytes(ack[16:20], "little", signed=True)
        if errno_:
            raise OSError(errno_, os.strerror(errno_))

    async def release(self) -> None:
        assert self.ns is not None
        r = self.rail
        addr = r.address.split("/")[0]
        await self.ns.rule(
            "del", family=socket.AF_INET, src=addr, src_len=32, table=r.table,
            priority=RULE_PRIORITY,
        )  # fmt: skip
        await self.ns.route(
            "del", dst=r.subnet, oif=self.ns_index, table=r.table, scope=253, proto=4
        )
        if r.shared:
            await self.ns.link("del", index=self.ns_index)
            return
        await self.ns.link("set", index=self.index, mtu=1500)
        await self.ns.link("set", index=self.index, net_ns_fd=self._init_fd, ifname=self.host)
        addr, plen = self.host_addr.split("/")
        await self.init.addr("add", index=self.index, address=addr, prefixlen=int(plen))
        await self.init.link("set", index=self.index, state="up")


Column = tuple[Callable[[], Awaitable[float]], Callable[[], Awaitable[None]]]


def _columns(
    clients: list[Client], raws: list[RawRail], netns: str, rails: list[Rail], pod: str
) -> dict[str, Column]:
    """Each column: a pod's claims (returns the pod's time, ms) and its release."""
    devices = [f"sim{r.index}" for r in rails]
    opts = [rail_options(r, pod) for r in rails]
    made: list[tuple[Client, str]] = []

    async def back_to_back() -> float:
        t0 = time.perf_counter()
        for device, o in zip(devices, opts, strict=True):
            made.append((clients[0], await claim(clients[0], device, netns, o)))
        return ms_since(t0)

    async def at_once() -> float:
        t0 = time.perf_counter()
        ids = await asyncio.gather(
            *(claim(c, d, netns, o) for c, d, o in zip(clients, devices, opts, strict=True))
        )
        made.extend(zip(clients, ids, strict=True))
        return ms_since(t0)

    async def release_rdmad() -> None:
        await asyncio.gather(*(release(c, cid) for c, cid in made))
        made.clear()

    async def raw_serial() -> float:
        t0 = time.perf_counter()
        for raw in raws:
            await raw.claim()
        return ms_since(t0)

    async def release_raw() -> None:
        for raw in raws:
            await raw.release()

    return {
        "back to back": (back_to_back, release_rdmad),
        "at once": (at_once, release_rdmad),
        "raw serial": (raw_serial, release_raw),
    }


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    with many_veths(RAILS, "p", up=True) as nics, temp_netns("rbp") as netns:
        async with rdmad(bus, nics.sim_spec()) as _d:
            clients = [await Client.connect(bus, signals=False) for _ in range(RAILS)]
            try:
                for kind, shared in KINDS.items():
                    rails = pod_rails(shared)
                    raws = [RawRail(r, nics.hosts[r.index], netns) for r in rails]
                    for raw in raws:
                        await raw.open()
                    try:
                        cols = _columns(clients, raws, netns, rails, "benchpod")
                        times = await measure_pods(cols, p.pod_reps)
                    finally:
                        for raw in raws:
                            raw.close()
                    _report(res, kind, times)
            finally:
                for c in clients:
                    c.close()


async def measure_pods(cols: dict[str, Column], reps: int) -> dict[str, list[float]]:
    """One warm-up rep, then `reps` pods per column, in bench.columns' cycle of orders for
    three columns (so each column's pod follows each column's release alike)."""
    key = dict(zip("rcw", cols, strict=True))  # ORDERS["rwc"]'s letters
    orders = ORDERS["rwc"]
    times: dict[str, list[float]] = {name: [] for name in cols}
    for i in range(-1, reps):
        for letter in orders[i % len(orders)]:
            make, end = cols[key[letter]]
            took = await make()
            await end()
            if i >= 0:
                times[key[letter]].append(took)
            await asyncio.sleep(DRAIN_S)
    return times


def _report(res: Results, kind: str, times: dict[str, list[float]]) -> None:
    floor = times["raw serial"]
    for name in ("back to back", "at once"):
        ours = times[name]
        res.dists[f"8-rail pod ({kind}): rdmad {name}"] = ours
        check = RatioCheck.of("rdmad/raw", ours, floor, TARGET)
        res.rows.append(
            Row(
                f"9. 8-rail pod ({kind}), claims {name}: the pod's time ({len(ours)} pods)",
                spread(ours),
                f"{spread(floor)} (serial, one process)",
                "-",
                check.text(),
                check.target(),
                check.met,
            )
        )
    res.dists[f"8-rail pod ({kind}): raw serial"] = floor
