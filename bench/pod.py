"""9. An 8-rail pod: the 8 claims of one netns, each rail with its address (a subnet each),
a table rdmad picks (`table=0`) and the pod's `pod_cdi_name`; 8 whole-device rails, then 4
whole-device and 4 shared. Three columns take turns (bench.columns), one pod each:
  back to back: one client sends the 8 claims one after another, to the last reply;
  at once:      8 clients, one per rail, send their claims at the same moment;
  raw serial:   the same kernel operations rail after rail from one process (RawRail), the
                floor, as the kernel serialises them under the RTNL lock.
Each pod is released untimed, then a pause lets the kernel's RCU work drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from dbus_fast import Variant

from bench.claim import NS_MTU, Raw, netlink_in, serially
from bench.columns import Column, drained, take_turns
from bench.common import (
    BENCH_NET,
    Params,
    Results,
    Row,
    at_once,
    claim,
    claim_options,
    client,
    many_veths,
    ms_since,
    rdmad,
    release,
)
from bench.stats import RatioCheck, spread
from rdmad.kernel.netlink import attr_nest, attr_u32, encode
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
    """A rail's kernel operations: Raw's, then arp_ignore/arp_announce/rp_filter in one
    RTM_SETLINK, the connected route in the rail's table and the rule `from <address>
    lookup <table>`. pyroute2 0.9 cannot encode the devconf as the kernel takes it
    (IFLA_INET_CONF is a nest of attributes, pyroute2 sends a struct), so that one goes
    out as rdmad builds it."""

    def __init__(self, rail: Rail, host: str, netns: str) -> None:
        host_addr = f"{BENCH_NET[rail.index]}/32"  # many_veths's
        super().__init__(host, netns, rail.shared, rail.ifname, rail.address, host_addr)
        self.rail = rail

    async def __aenter__(self) -> Self:
        self._conf = await netlink_in(self.netns)
        return await super().__aenter__()

    async def __aexit__(self, *exc: object) -> None:
        self._conf.close()
        await super().__aexit__()

    def _route(self) -> dict[str, Any]:
        r = self.rail
        return {"dst": r.subnet, "oif": self.ns_index, "table": r.table, "scope": 253, "proto": 4}

    def _rule(self) -> dict[str, Any]:
        src = self.rail.address.split("/")[0]
        return {"family": socket.AF_INET, "src": src, "src_len": 32, "table": self.rail.table,
                "priority": RULE_PRIORITY}  # fmt: skip

    async def claim(self) -> None:
        await super().claim()
        conf = attr_nest(IFLA_INET_CONF, (attr_u32(k, v) for k, v in RAIL_DEVCONF.items()))
        spec = attr_nest(IFLA_AF_SPEC, (attr_nest(socket.AF_INET, (conf,)),))
        body = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, self.ns_index, 0, 0) + spec
        self._conf.send(encode(RTM_SETLINK, body, seq=1, flags=0x4))  # NLM_F_ACK
        errno_ = -int.from_bytes(self._conf.recv(4096)[16:20], "little", signed=True)
        if errno_:
            raise OSError(errno_, os.strerror(errno_))
        await self.ns.route("add", **self._route())
        await self.ns.rule("add", **self._rule())

    async def release(self) -> None:
        await self.ns.rule("del", **self._rule())
        await self.ns.route("del", **self._route())
        await super().release()


def _columns(clients: list[Client], raws: list[RawRail], netns: str, pod: str) -> list[Column]:
    """Each column makes a pod (its time, ms, kept by the column's name) and releases it."""
    claims = [
        (c, f"sim{raw.rail.index}", netns, rail_options(raw.rail, pod))
        for c, raw in zip(clients, raws, strict=True)
    ]

    async def back_to_back() -> float:
        t0 = time.perf_counter()
        ids = [await claim(clients[0], *c[1:]) for c in claims]
        took = ms_since(t0)
        await asyncio.gather(*(release(clients[0], i) for i in ids))
        return took

    return [
        drained("back to back", back_to_back, DRAIN_S),
        drained("at once", lambda: at_once(claims), DRAIN_S),
        drained("raw serial", lambda: serially(raws), DRAIN_S),
    ]


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    with many_veths(RAILS, "p", up=True) as nics, temp_netns("rbp") as netns:
        async with rdmad(bus, nics.sim_spec()), contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(client(bus, signals=False)) for _ in range(RAILS)
            ]
            for kind, shared in KINDS.items():
                async with contextlib.AsyncExitStack() as opened:
                    raws = [
                        await opened.enter_async_context(RawRail(r, nics.hosts[r.index], netns))
                        for r in pod_rails(shared)
                    ]
                    cols = _columns(clients, raws, netns, "benchpod")
                    times = (await take_turns(cols, p.pod_reps, 1)).t
                _report(res, kind, times)


def _report(res: Results, kind: str, times: dict[str, list[float]]) -> None:
    floor = times["raw serial"]
    for name in ("back to back", "at once"):
        ours = times[name]
        res.dists[f"8-rail pod ({kind}): rdmad {name}"] = ours
        check = RatioCheck.of("rdmad/raw", ours, floor, TARGET)
        scenario = f"9. 8-rail pod ({kind}), claims {name}: the pod's time ({len(ours)} pods)"
        res.rows.append(
            Row.of(scenario, spread(ours), f"{spread(floor)} (serial, one process)", check)
        )
    res.dists[f"8-rail pod ({kind}): raw serial"] = floor
