"""1. Claim and release latency, settled (bench.common.Settler): rdmad over D-Bus (call to
reply) vs raw pyroute2 (Raw: an in-netns socket kept open, the ifindex known, the floor a
hand-written tool could reach) vs the `ip` CLI, taking turns (bench.columns), and rdmad's
claim with an RDMA limit (LIMIT) against the same claim without. The host has no rdma
controller, so the cgroup2 mount is a tree of plain files on tmpfs (limited_tree): it
measures rdmad's side of the limit, not the kernel's.
  claim:   move into the netns + rename, MTU 1400, add an address, set up;
  release: move back + rename to the host name, MTU 1500, host address back, set up.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Self

from dbus_fast import Variant
from pyroute2 import AsyncIPRoute

from bench.columns import Ways, blocking, side_by_side
from bench.common import (
    SHM,
    Params,
    Results,
    Row,
    Settler,
    claim_cycle,
    claim_options,
    client,
    many_veths,
    ms_since,
    rdmad,
)
from bench.stats import RatioCheck, spread
from rdmad.kernel.netns import run_in_netns
from testbed.net import addresses, ip, link, netns_fd, temp_netns

HOST_MTU, NS_MTU = 1500, 1400
HOST_ADDR, NS_ADDR = "192.0.2.1/24", "198.51.100.2/24"
NS_IFNAME = "bench0"
POD_CGROUP = "kubepods/pod1"
LIMIT = {
    "cgroup": Variant("s", POD_CGROUP),
    "hca_handles": Variant("u", 4),
    "hca_objects": Variant("u", 4096),
}


@contextlib.contextmanager
def limited_tree() -> Iterator[Path]:
    """A cgroup2 mount of plain files on tmpfs, with rdma, holding POD_CGROUP."""
    root = Path(tempfile.mkdtemp(prefix="rdmad-bench-cgroup-", dir=SHM))
    try:
        for directory in (root, root / "kubepods", root / POD_CGROUP):
            directory.mkdir(exist_ok=True)
            (directory / "cgroup.controllers").write_text("cpu memory rdma\n")
            (directory / "cgroup.subtree_control").write_text("")
        yield root
    finally:
        shutil.rmtree(root)


async def netlink_in(netns: str) -> socket.socket:
    """An rtnetlink socket in `netns` (a socket keeps the netns it was made in)."""
    with netns_fd(netns) as fd:
        return await run_in_netns(
            fd, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 0)
        )


class Raw:
    """A claim's kernel operations, in-process with pyroute2, and nothing else: the netdev
    moved and renamed (or, `shared`, a macvlan of it made in the netns under that name),
    then its MTU, address and up; released: back home with its MTU and `host_addr`, up (or
    the macvlan deleted). Opened as an async context manager."""

    ns: AsyncIPRoute

    def __init__(
        self, host: str, netns: str, shared: bool = False, ifname: str = NS_IFNAME,
        address: str = NS_ADDR, host_addr: str = HOST_ADDR,
    ) -> None:  # fmt: skip
        self.host, self.netns, self.shared = host, netns, shared
        self.ifname, self.address, self.host_addr = ifname, address, host_addr
        self.index = self.ns_index = socket.if_nametoindex(host)
        self.init = AsyncIPRoute()
        self._init_fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    async def __aenter__(self) -> Self:
        await self.init.setup_endpoint()
        self._ns_sock = await netlink_in(self.netns)
        self.ns = AsyncIPRoute(use_socket=self._ns_sock)
        await self.ns.setup_endpoint()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.init.close()
        self.ns.close()
        self._ns_sock.close()
        os.close(self._init_fd)

    async def claim(self) -> None:
        with netns_fd(self.netns) as fd:
            if self.shared:
                await self.init.link(
                    "add", ifname=self.ifname, kind="macvlan", macvlan_mode="bridge",
                    link=self.index, net_ns_fd=fd, mtu=NS_MTU,
                )  # fmt: skip
            else:  # one message: the move and the rename
                await self.init.link("set", index=self.index, net_ns_fd=fd, ifname=self.ifname)
        if self.shared:
            (self.ns_index,) = await self.ns.link_lookup(ifname=self.ifname)
        else:
            await self.ns.link("set", index=self.index, mtu=NS_MTU)
        addr, plen = self.address.split("/")
        await self.ns.addr("add", index=self.ns_index, address=addr, prefixlen=int(plen))
        await self.ns.link("set", index=self.ns_index, state="up")

    async def release(self) -> None:
        if self.shared:
            await self.ns.link("del", index=self.ns_index)
            return
        # as rdmad does: the MTU in the netns, where the kernel's walk of IPv6 routes is short
        await self.ns.link("set", index=self.index, mtu=HOST_MTU)
        await self.ns.link("set", index=self.index, net_ns_fd=self._init_fd, ifname=self.host)
        addr, plen = self.host_addr.split("/")
        await self.init.addr("add", index=self.index, address=addr, prefixlen=int(plen))
        await self.init.link("set", index=self.index, state="up")


async def serially(raws: Sequence[Raw]) -> float:
    """Until the last of `raws` has claimed (ms), one after another; then released."""
    t0 = time.perf_counter()
    for raw in raws:
        await raw.claim()
    took = ms_since(t0)
    for raw in raws:
        await raw.release()
    return took


def cli_claim(host: str, netns: str) -> None:
    """What a shell script would run."""
    ip("link", "set", "dev", host, "netns", netns)
    ip("link", "set", "dev", host, "name", NS_IFNAME, "mtu", str(NS_MTU), netns=netns)
    ip("addr", "add", NS_ADDR, "dev", NS_IFNAME, netns=netns)
    ip("link", "set", "dev", NS_IFNAME, "up", netns=netns)


def cli_release(host: str, netns: str) -> None:
    # `netns PID`: this process is in init_net (ip -n has already entered the netns)
    ip("link", "set", "dev", NS_IFNAME, "netns", str(os.getpid()), netns=netns)
    ip("link", "set", "dev", NS_IFNAME, "name", host, "mtu", str(HOST_MTU))
    ip("addr", "add", HOST_ADDR, "dev", host)
    ip("link", "set", "dev", host, "up")


def check_claimed(netns: str, kind: str | None = None) -> None:
    """NS_IFNAME in `netns` with NS_MTU and NS_ADDR, of `kind` (None: a moved veth)."""
    info = link(NS_IFNAME, netns)
    assert info is not None and info["mtu"] == NS_MTU, f"not claimed: {info}"
    assert info.get("linkinfo", {}).get("info_kind", "veth") == (kind or "veth"), info
    assert NS_ADDR in addresses(NS_IFNAME, netns), addresses(NS_IFNAME, netns)


def check_home(host: str) -> None:
    info = link(host)
    assert info is not None and info["mtu"] == HOST_MTU, f"not home: {info}"
    assert HOST_ADDR in addresses(host), addresses(host)


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    with many_veths(1, "c") as nics, temp_netns("rbc") as netns, limited_tree() as cgroups:
        host = nics.hosts[0]
        ip("link", "set", "dev", host, "mtu", str(HOST_MTU), "up")
        ip("addr", "add", HOST_ADDR, "dev", host)
        opts = claim_options(NS_IFNAME, NS_MTU, [NS_ADDR])
        async with (
            Raw(host, netns) as raw,
            rdmad(bus, nics.sim_spec(), extra=["--cgroup-root", str(cgroups)]),
            client(bus) as c,
        ):
            ways: Ways = {
                "r": claim_cycle(c, "sim0", netns, opts),
                "w": (raw.claim, raw.release),
                "c": (blocking(cli_claim, host, netns), blocking(cli_release, host, netns)),
                "l": claim_cycle(c, "sim0", netns, {**opts, **LIMIT}),
            }
            t = await side_by_side(
                ways, p.latency_reps, p.warmup, Settler(p),
                lambda: check_claimed(netns), lambda: check_home(host),
            )  # fmt: skip
    for op, label in (("c", "Claim"), ("r", "Release")):
        r, w, cl = t["r" + op], t["w" + op], t["c" + op]
        res.dists[f"{label}: rdmad"] = r
        res.dists[f"{label}: raw pyroute2"] = w
        res.dists[f"{label}: iproute2 CLI"] = cl
        checks = [
            RatioCheck.of("rdmad/raw", r, w, 1.3),
            RatioCheck.of("rdmad/CLI", r, cl, 1.0, True),
        ]
        res.rows.append(
            Row(
                f"1. {label} latency (whole device, veth), settled",
                spread(r),
                spread(w),
                spread(cl),
                "; ".join(c.text() for c in checks),
                "; ".join(c.target() for c in checks),
                all(c.met for c in checks),
            )
        )
        limited = RatioCheck.of("limit/none", t["l" + op], r, 1.1)
        scenario = f"1. {label} latency with an RDMA limit (tmpfs cgroup tree), settled"
        res.rows.append(Row.of(scenario, spread(t["l" + op]), spread(r), limited))
