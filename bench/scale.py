"""3. Scale on a modelled node: N RDMA-capable netdevs (sim devices on real veths) and M
unrelated interfaces, all up with addresses. At each size: ListDevices latency, and claim
and release, settled, beside raw pyroute2 (bench.claim.Raw) on a veth of the same node,
with the CPU per operation: the daemon's from /proc (CpuMeter, which charges the work after
a reply to the operation that caused it), this process's for raw. Targets on rdmad over raw
(latency ratio and CPU difference) flat within FLAT from the smallest node to the largest;
the guard fails the run, smoke mode included, when the daemon's CPU per claim on the
largest node is more than GUARD times the smallest's.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from bench.claim import NS_ADDR, NS_IFNAME, NS_MTU, Raw
from bench.columns import Column, Op, Samples, take_turns
from bench.common import (
    Params,
    Results,
    Row,
    Settler,
    claim_cycle,
    claim_options,
    client,
    cpu_seconds,
    many_veths,
    ms_since,
    pid_of,
    rdmad,
)
from bench.stats import JUDGED, RatioCheck, pct, with_p99
from testbed.net import temp_netns

FLAT = 1.15  # rdmad over raw, latency and CPU per operation, largest node against smallest
GUARD = 3.0  # CPU per claim, largest node against the smallest: beyond it the run fails


class CpuRegression(AssertionError):
    """The daemon's CPU per claim grows with the node's interfaces."""


@dataclass
class Node:
    netdevs: int  # RDMA-capable (a sim device each)
    others: int  # unrelated interfaces
    lists: list[float]  # ListDevices, ms
    t: dict[str, list[float]]  # "rc", "rr" (rdmad's claim, release), "wc", "wr" (raw's)

    @property
    def label(self) -> str:
        return f"N={self.netdevs}, M={self.others}"

    @property
    def interfaces(self) -> int:
        return self.netdevs + self.others

    def cpu(self, key: str) -> float:
        """Mean CPU (ms) per operation `key`: the daemon's for rdmad's, this process's for
        raw's."""
        return statistics.fmean(self.t[key + " cpu"])

    def own_cpu(self, op: str) -> float:
        """rdmad's CPU per operation ("c" or "r") over the kernel's own (raw's)."""
        return self.cpu("r" + op) - self.cpu("w" + op)


class CpuMeter:
    """Charges the daemon's CPU between two marks to whatever was marked first."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._into: list[float] | None = None
        self._at = cpu_seconds(pid)

    def mark(self, into: list[float] | None) -> None:
        now = cpu_seconds(self._pid)
        if self._into is not None:
            self._into.append((now - self._at) * 1000.0)
        self._into, self._at = into, now


def _columns(meter: CpuMeter, rdmad_ops: tuple[Op, Op], raw: Raw, settle: Settler) -> list[Column]:
    """rdmad's claim and release, and raw's, each settled and timed with its CPU."""

    def column(key: str, ops: tuple[Op, Op], daemon: bool) -> Column:
        async def run(s: Samples) -> None:
            for op, fn in zip("cr", ops, strict=True):
                await settle()
                # the daemon's CPU while raw works is nobody's operation
                meter.mark(s.t.setdefault(f"{key}{op} cpu", []) if daemon else None)
                c0, t0 = time.process_time(), time.perf_counter()
                await fn()
                s.add(key + op, ms_since(t0))
                if not daemon:
                    s.add(f"{key}{op} cpu", (time.process_time() - c0) * 1000.0)

        return run

    return [column("r", rdmad_ops, True), column("w", (raw.claim, raw.release), False)]


async def _measure(bus: str, p: Params, netdevs: int, others: int) -> Node:
    with (
        many_veths(netdevs, "s", up=True) as nics,
        many_veths(others, "o", up=True),
        # raw's veth like the sim devices' (peer up, so carrier and an IPv6 link-local
        # address): bringing one home up then inserts a route among every other
        # interface's fe80::/64, a kernel cost that grows with the node
        many_veths(1, "x", up=True) as spare,
    ):
        async with rdmad(bus, nics.sim_spec()) as d, client(bus) as c:
            lists = []
            for i in range(p.warmup + p.reps):
                t0 = time.perf_counter()
                rows = await c.manager("ListDevices")
                if i >= p.warmup:
                    lists.append(ms_since(t0))
            assert len(rows) == netdevs, f"ListDevices returned {len(rows)} of {netdevs}"
            with temp_netns("rbs") as netns, temp_netns("rbw") as raw_netns:
                async with Raw(spare.hosts[0], raw_netns) as raw:
                    opts = claim_options(NS_IFNAME, NS_MTU, [NS_ADDR])  # raw's claim
                    ops = claim_cycle(c, f"sim{netdevs // 2}", netns, opts)
                    meter, settle = CpuMeter(pid_of(d)), Settler(p)
                    t = (await take_turns(_columns(meter, ops, raw, settle), p.scale_reps,
                                          p.warmup)).t  # fmt: skip
                    await settle()
                    meter.mark(None)  # the last operation's CPU, up to now
    return Node(netdevs, others, lists, t)


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    nodes = [await _measure(bus, p, netdevs, others) for netdevs, others in p.scale_nodes]
    for node in nodes:
        big = node.netdevs >= 1024  # where the ListDevices target is set
        res.dists[f"ListDevices N={node.netdevs}"] = node.lists
        res.rows.append(
            Row(
                f"3. ListDevices latency, {node.label}",
                with_p99(node.lists),
                target="< 5 ms at p50 and p90, at N=1024" if big else "",
                met=all(pct(node.lists, q) < 5 for q in JUDGED) if big else None,
            )
        )
    _flat_rows(res, nodes[0], nodes[-1])


def _flat_rows(res: Results, small: Node, large: Node) -> None:
    sizes = f"{large.label} against {small.label}"
    for op, name in (("c", "Claim"), ("r", "Release")):
        over = RatioCheck.of_ratios(
            "rdmad/raw",
            (large.t["r" + op], large.t["w" + op]),
            (small.t["r" + op], small.t["w" + op]),
            FLAT,
        )
        own = large.own_cpu(op) / small.own_cpu(op)
        res.rows.append(
            Row(
                f"3. {name} over the kernel's own, flat, settled: {sizes}",
                f"rdmad's CPU over raw's {small.own_cpu(op):.1f} -> {large.own_cpu(op):.1f} ms",
                ratio=f"{over.text()} (large over small); own CPU {own:.2f}",
                target=f"rdmad/raw and rdmad's own CPU <= {FLAT}x at p50 and p90",
                met=over.met and own <= FLAT,
            )
        )
    cpu = large.cpu("rc") / small.cpu("rc")
    res.rows.append(
        Row(
            f"3. Guard: daemon CPU per claim, {large.interfaces} interfaces against"
            f" {small.interfaces}",
            f"{cpu:.2f}x",
            target=f"<= {GUARD:g}x, or the run fails",
            met=cpu <= GUARD,
        )
    )
    if cpu > GUARD:
        raise CpuRegression(
            f"the daemon's CPU per claim is {cpu:.2f}x on a node with {large.interfaces}"
            f" interfaces ({large.label}) what it is with {small.interfaces} ({small.label});"
            f" the guard allows {GUARD:g}x: a per-claim path grows with the node's interfaces"
        )
