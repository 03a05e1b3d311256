"""1. Claim and release latency: rdmad over D-Bus vs raw pyroute2 vs the iproute2 CLI.

All three do the same kernel work on the same veth, interleaved rep by rep (in a cycle of
orders where each column's claim follows each column's release equally often: bench.columns)
so that drift on the host, and what one operation leaves the next, hit all of them alike:
  claim:   move into the netns + rename, MTU 1400, add an address, set up;
  release: move back + rename to the host name, MTU 1500, host address back, set up.
rdmad's time is D-Bus call to reply (the reply comes once the netdev is configured in the
netns). Raw keeps an in-netns netlink socket open across reps and knows the ifindex, so it
is the floor a hand-written tool could reach; rdmad may not keep such a socket (it must
never pin a netns) and has to look things up and persist its state file.

A fourth column is rdmad's claim with an RDMA limit (bench.claim.LIMIT: a cgroup, its
hca_handle and hca_object line in rdma.max): against the same claim without, at most 1.1x.
This host's kernel has no rdma controller, so the cgroup2 mount is a tree of plain files on
tmpfs (limited_tree): it measures rdmad's side of it (the cgroup's checks, the writes and
the state they add), not the kernel's handling of the writes.

Settled: each operation starts 50-60 ms after the previous one ended (bench.common.Settler),
so it pays for little of what the operation before left behind (not nothing: see
bench.columns) and starts at a random phase of the tick, as a claim on a node does
(docs/performance.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
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
    rdmad,
)
from bench.stats import RatioCheck, spread
from rdmad.kernel.netns import run_in_netns
from testbed.net import addresses, ip, link, temp_netns

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


class Raw:
    """The kernel operations, in-process with pyroute2, and nothing else."""

    def __init__(self, host: str, host_index: int, netns: str) -> None:
        self.host, self.index, self.netns = host, host_index, netns
        self.init = AsyncIPRoute()
        self.ns: AsyncIPRoute | None = None
        self._ns_sock: socket.socket | None = None
        self._init_fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    @classmethod
    @contextlib.asynccontextmanager
    async def opened(cls, host: str, netns: str) -> AsyncIterator[Self]:
        """Raw on netdev `host`, its socket in `netns` open; closed afterwards."""
        raw = cls(host, socket.if_nametoindex(host), netns)
        await raw.open()
        try:
            yield raw
        finally:
            raw.close()

    async def open(self) -> None:
        await self.init.setup_endpoint()
        fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            # a netlink socket keeps the netns it was created in
            self._ns_sock = await run_in_netns(
                fd, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 0)
            )
        finally:
            os.close(fd)
        self.ns = AsyncIPRoute(use_socket=self._ns_sock)
        await self.ns.setup_endpoint()

    def close(self) -> None:
        self.init.close()
        if self.ns is not None:
            self.ns.close()
        if self._ns_sock is not None:
            self._ns_sock.close()
        os.close(self._init_fd)

    async def claim(self) -> None:
        assert self.ns is not None
        fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            # one message: the move and the rename
            await self.init.link("set", index=self.index, net_ns_fd=fd, ifname=NS_IFNAME)
        finally:
            os.close(fd)
        addr, plen = NS_ADDR.split("/")
        await self.ns.link("set", index=self.index, mtu=NS_MTU)
        await self.ns.addr("add", index=self.index, address=addr, prefixlen=int(plen))
        await self.ns.link("set", index=self.index, state="up")

    async def release(self) -> None:
        assert self.ns is not None
        # as rdmad does: the MTU in the netns, where the kernel's walk of IPv6 routes is short
        await self.ns.link("set", index=self.index, mtu=HOST_MTU)
        await self.ns.link("set", index=self.index, net_ns_fd=self._init_fd, ifname=self.host)
        addr, plen = HOST_ADDR.split("/")
        await self.init.addr("add", index=self.index, address=addr, prefixlen=int(plen))
        await self.init.link("set", index=self.index, state="up")


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


def check_claimed(netns: str) -> None:
    info = link(NS_IFNAME, netns)
    assert info is not None and info["mtu"] == NS_MTU, f"not claimed: {info}"
    assert addresses(NS_IFNAME, netns) == {NS_ADDR}, addresses(NS_IFNAME, netns)


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
            Raw.opened(host, netns) as raw,
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
        res.rows.append(
            Row(
                f"1. {label} latency with an RDMA limit (tmpfs cgroup tree), settled",
                spread(t["l" + op]),
                spread(r),
                ratio=limited.text(),
                target=limited.target(),
                met=limited.met,
            )
        )
