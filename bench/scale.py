"""3. Scale on a modelled node: N RDMA-capable netdevs (sim devices on real veths) and M
unrelated interfaces, all up with addresses, as on a node with VFs and one veth per pod.

At each size: start to READY=1, RSS, ListDevices latency, and claim and release latency
with the daemon's CPU time per operation, settled and back to back. The CPU an operation
costs is read from /proc/<pid>/stat (utime + stime, all threads) when it starts and when
the next one starts, so work the daemon does after its reply (the events the move causes)
is charged to the operation that caused it.

Beside rdmad, rep by rep, the same kernel operations in-process with pyroute2 (bench.claim's
raw column) on a veth of the same node, with this process's CPU time (user + system) per
operation. The kernel's own work in a move grows with the interfaces of the netns it
leaves or joins, whoever sends it; raw shows by how much.

Targets: claim and release latency (p50 and p90) and CPU per operation flat within 1.15x
from the smallest node to the largest, in absolute terms and over raw (rdmad's latency as
a ratio of raw's, rdmad's CPU minus raw's). The
guard: if the daemon's CPU per claim on the largest node is more than GUARD times the
smallest node's, the scenario fails, loudly, in smoke mode too (a ratio within one run, not
an absolute time).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.claim import NS_ADDR, NS_IFNAME, NS_MTU, Raw
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
    rss_mb,
)
from bench.stats import JUDGED, RatioCheck, p99_text, pct, spread
from testbed.daemon import ROOT, Client
from testbed.net import temp_netns

FLAT = 1.15  # latency and CPU per operation, largest node against the smallest
GUARD = 3.0  # CPU per claim, largest node against the smallest: beyond it the run fails
PASSES = ("settled", "back to back")


class CpuRegression(AssertionError):
    """The daemon's CPU per claim grows with the node's interfaces."""


@dataclass
class Ops:
    """One pass's claims and releases: latency (ms) and the daemon's CPU (ms) per op."""

    claim_ms: list[float] = field(default_factory=list)
    release_ms: list[float] = field(default_factory=list)
    claim_cpu: list[float] = field(default_factory=list)
    release_cpu: list[float] = field(default_factory=list)

    def cpu_per(self, op: str) -> float:
        return statistics.fmean(self.claim_cpu if op == "claim" else self.release_cpu)

    def latency(self, op: str) -> list[float]:
        return self.claim_ms if op == "claim" else self.release_ms


@dataclass
class Pass:
    """One pass over a node: rdmad's operations (the daemon's CPU) and raw's (ours)."""

    rdmad: Ops = field(default_factory=Ops)
    raw: Ops = field(default_factory=Ops)

    def own_cpu(self, op: str) -> float:
        """rdmad's CPU per operation over the kernel's own (raw's)."""
        return self.rdmad.cpu_per(op) - self.raw.cpu_per(op)


@dataclass
class Node:
    netdevs: int  # RDMA-capable (a sim device each)
    others: int  # unrelated interfaces
    starts: list[float] = field(default_factory=list)
    rss: float = 0.0
    lists: list[float] = field(default_factory=list)
    passes: dict[str, Pass] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"N={self.netdevs}, M={self.others}"

    @property
    def interfaces(self) -> int:
        return self.netdevs + self.others


def python_floor_ms() -> float:
    """Interpreter start + importing the daemon's modules: the part of 'start' that is not
    rdmad's own work (best of 3)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import rdmad.daemon.main"], check=True, cwd=ROOT)
        best = min(best, ms_since(t0))
    return best


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


async def _cycles(
    c: Client,
    pid: int,
    device: str,
    netns: str,
    raw: Raw,
    reps: int,
    warmup: int,
    settle: Settler | None,
) -> Pass:
    """rdmad's claim and release, and raw's, in alternating order rep by rep: each column's
    claim follows each column's release equally often."""
    ps = Pass()
    meter = CpuMeter(pid)
    opts = claim_options(NS_IFNAME, NS_MTU, [NS_ADDR])  # raw's claim, over D-Bus
    rd_claim, rd_release = claim_cycle(c, device, netns, opts)
    Step = tuple[Callable[[], Awaitable[None]], list[float], list[float], bool]
    rdmad_steps: list[Step] = [
        (rd_claim, ps.rdmad.claim_ms, ps.rdmad.claim_cpu, True),
        (rd_release, ps.rdmad.release_ms, ps.rdmad.release_cpu, True),
    ]
    raw_steps: list[Step] = [
        (raw.claim, ps.raw.claim_ms, ps.raw.claim_cpu, False),
        (raw.release, ps.raw.release_ms, ps.raw.release_cpu, False),
    ]
    for i in range(warmup + reps):
        measured = i >= warmup
        order = rdmad_steps + raw_steps if i % 2 == 0 else raw_steps + rdmad_steps
        for work, took, cpu, daemon in order:
            if settle is not None:
                await settle()
            # the daemon's CPU while raw works is nobody's operation
            meter.mark(cpu if measured and daemon else None)
            c0, t0 = time.process_time(), time.perf_counter()
            await work()
            if measured:
                took.append(ms_since(t0))
                if not daemon:
                    cpu.append((time.process_time() - c0) * 1000.0)
    if settle is not None:
        await settle()
    meter.mark(None)
    return ps


async def _measure(bus: str, p: Params, netdevs: int, others: int) -> Node:
    node = Node(netdevs, others)
    with (
        many_veths(netdevs, "s", up=True) as nics,
        many_veths(others, "o", up=True),
        # raw's veth like the sim devices' (peer up, so carrier and an IPv6 link-local
        # address): bringing one home up then inserts a route among every other
        # interface's fe80::/64, a kernel cost that grows with the node
        many_veths(1, "x", up=True) as spare,
    ):
        spec = nics.sim_spec()
        for _ in range(p.starts - 1):  # extra starts, only for the start time
            t0 = time.perf_counter()
            async with rdmad(bus, spec):
                node.starts.append(ms_since(t0))
        t0 = time.perf_counter()
        async with rdmad(bus, spec) as d, client(bus) as c:
            node.starts.append(ms_since(t0))
            rss_ready = rss_mb(pid_of(d))
            for i in range(p.warmup + p.reps):
                t0 = time.perf_counter()
                rows = await c.manager("ListDevices")
                if i >= p.warmup:
                    node.lists.append(ms_since(t0))
            assert len(rows) == netdevs, f"ListDevices returned {len(rows)} of {netdevs}"
            host = spare.hosts[0]
            with temp_netns("rbs") as netns, temp_netns("rbw") as raw_netns:
                async with Raw.opened(host, raw_netns) as raw:
                    for name in PASSES:
                        settle = Settler(p) if name == "settled" else None
                        node.passes[name] = await _cycles(
                            c, pid_of(d), f"sim{netdevs // 2}", netns, raw,
                            p.scale_reps, p.warmup, settle,
                        )  # fmt: skip
            node.rss = max(rss_ready, rss_mb(pid_of(d)))
    return node


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    floor = python_floor_ms()
    nodes = []
    for netdevs, others in p.scale_nodes:
        node = await _measure(bus, p, netdevs, others)
        nodes.append(node)
        _node_rows(res, node, floor)
    _flat_rows(res, nodes[0], nodes[-1])


def _node_rows(res: Results, node: Node, floor: float) -> None:
    big = node.netdevs >= 1024  # where the start, RSS and ListDevices targets are set
    start = statistics.median(node.starts)
    res.dists[f"ListDevices N={node.netdevs}"] = node.lists
    res.dists[f"Claim N={node.netdevs}, M={node.others}"] = node.passes["settled"].rdmad.claim_ms
    res.rows += [
        Row(
            f"3. Start to READY=1, {node.label}",
            f"{start:.0f} ms (median of {len(node.starts)}; max {max(node.starts):.0f})",
            f"{floor:.0f} ms (python + imports)",
            target="< 1 s at N=1024" if big else "",
            met=(start < 1000) if big else None,
        ),
        Row(
            f"3. RSS, {node.label}",
            f"{node.rss:.1f} MB",
            target="< 60 MB at N=1024" if big else "",
            met=(node.rss < 60) if big else None,
        ),
        Row(
            f"3. ListDevices latency, {node.label}",
            spread(node.lists),
            ratio=p99_text(node.lists),
            target="< 5 ms at p50 and p90, at N=1024" if big else "",
            met=all(pct(node.lists, q) < 5 for q in JUDGED) if big else None,
        ),
    ]
    for name, ps in node.passes.items():
        rd, raw = ps.rdmad, ps.raw
        res.rows.append(
            Row(
                f"3. Claim / release, {node.label}, {name}",
                f"claim {spread(rd.claim_ms)}; release {spread(rd.release_ms)}",
                f"raw: claim {spread(raw.claim_ms)}; release {spread(raw.release_ms)}",
                ratio=f"CPU per claim {rd.cpu_per('claim'):.1f} ms (raw"
                f" {raw.cpu_per('claim'):.1f}), per release {rd.cpu_per('release'):.1f} ms"
                f" (raw {raw.cpu_per('release'):.1f})",
            )
        )


def _flat_rows(res: Results, small: Node, large: Node) -> None:
    sizes = f"{large.label} against {small.label}"
    for name in PASSES:
        lo, hi = small.passes[name], large.passes[name]
        for op in ("claim", "release"):
            latency = RatioCheck.of("latency", hi.rdmad.latency(op), lo.rdmad.latency(op), FLAT)
            kernel = RatioCheck.of("raw's", hi.raw.latency(op), lo.raw.latency(op), FLAT)
            cpu = hi.rdmad.cpu_per(op) / lo.rdmad.cpu_per(op)
            res.rows.append(
                Row(
                    f"3. {op.capitalize()} flat in the node's size, {name}: {sizes}",
                    f"CPU per {op} {lo.rdmad.cpu_per(op):.1f} -> {hi.rdmad.cpu_per(op):.1f}"
                    f" ms (raw {lo.raw.cpu_per(op):.1f} -> {hi.raw.cpu_per(op):.1f} ms)",
                    ratio=f"{latency.text()}; {kernel.text()}; CPU {cpu:.2f}",
                    target=f"latency <= {FLAT} at p50 and p90; CPU <= {FLAT}",
                    met=latency.met and cpu <= FLAT,
                )
            )
            over = RatioCheck.of_ratios(
                "rdmad/raw",
                (hi.rdmad.latency(op), hi.raw.latency(op)),
                (lo.rdmad.latency(op), lo.raw.latency(op)),
                FLAT,
            )
            own = hi.own_cpu(op) / lo.own_cpu(op)
            res.rows.append(
                Row(
                    f"3. {op.capitalize()} over the kernel's own, flat, {name}: {sizes}",
                    f"rdmad's CPU over raw's per {op} {lo.own_cpu(op):.1f} ->"
                    f" {hi.own_cpu(op):.1f} ms",
                    ratio=f"{over.text()} (large over small); own CPU {own:.2f}",
                    target=f"rdmad/raw and rdmad's own CPU <= {FLAT}x at p50 and p90",
                    met=over.met and own <= FLAT,
                )
            )
    cpu = large.passes["settled"].rdmad.cpu_per("claim") / small.passes["settled"].rdmad.cpu_per(
        "claim"
    )
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
