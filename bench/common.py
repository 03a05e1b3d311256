"""Shared pieces of the benchmark: parameters, results, stats, fast veth creation, a rig.

Everything here is built on tests/support (the real daemon process, the raw D-Bus client,
the private bus, ip helpers); this module adds only what a benchmark needs on top: many
netdevs at once, timestamps, and per-process counters from /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dbus_fast import Variant
from pyroute2 import AsyncIPRoute

from rdmad.kernel.netns import run_in_netns
from rdmad.kernel.rtnl_msgs import setlink
from tests.support.daemon import Client, RdmadProcess
from tests.support.net import ip, temp_netns

BENCH_DIR = Path(__file__).resolve().parent
# tmpfs, as /run (rdmad's default state dir) is on real hosts; / is ext4 on this machine.
SHM = Path("/dev/shm")


@dataclass(frozen=True)
class Params:
    smoke: bool
    reps: int  # repetitions per latency measurement (the issue asks >= 200)
    # Claim/release against raw and the CLI: more, since each move lands on a whole number
    # of scheduler ticks and a p50 of multimodal samples needs them (bench.ktrace). Whole
    # cycles of bench.claim.ORDERS (a multiple of 6), so each column follows each alike.
    latency_reps: int
    # Claims and releases are measured settled (Settler): this long before each, plus up to
    # jitter_ms at random. The claim/release comparison also has a back-to-back pass.
    settle_ms: float
    jitter_ms: float
    back_to_back_reps: int
    warmup: int
    scale_ns: tuple[int, ...]
    starts: int  # daemon starts per N
    clients: int
    rounds: int  # claim/release rounds per client in the throughput test
    list_seconds: float
    idle_seconds: float
    profile_reps: int

    @classmethod
    def full(cls) -> Params:
        return cls(False, 200, 504, 50.0, 10.0, 204, 10, (16, 128, 1024), 3, 64, 4, 5.0, 60.0, 200)

    @classmethod
    def quick(cls) -> Params:
        return cls(True, 8, 8, 50.0, 10.0, 8, 1, (4, 16), 1, 8, 1, 0.5, 2.0, 10)


class Settler:
    """Idles before a netns-moving operation: p.settle_ms, plus up to p.jitter_ms at random.

    A move waits for the RCU callbacks that earlier operations left on other CPUs and ends
    on a scheduler tick, so back to back its cost is set by what ran before it and by the
    tick phase that left it at. Settled, most earlier callbacks are gone (an exited process's
    are not always: bench.claim.ORDERS shares those out) and the phase is random, as for a
    claim on a node (findings.md, fourth and eighth rounds). Seeded: the same pauses every run.
    """

    def __init__(self, p: Params) -> None:
        self._base, self._jitter = p.settle_ms / 1e3, p.jitter_ms / 1e3
        self._rng = random.Random(1)

    async def __call__(self) -> None:
        await asyncio.sleep(self._base + self._rng.uniform(0, self._jitter))


@dataclass
class Row:
    """One line of results.md. Values are preformatted; `met` None means no target."""

    scenario: str
    rdmad: str
    raw: str = "-"
    cli: str = "-"
    ratio: str = "-"
    target: str = ""
    met: bool | None = None


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    dists: dict[str, list[float]] = field(default_factory=dict)  # name -> samples, ms
    # curve name -> {"n": [...], series name -> [...]}
    curves: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    scenario_seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------ stats


def pct(samples: Sequence[float], q: float) -> float:
    """Percentile with linear interpolation (numpy's default), q in [0, 100]."""
    if not samples:
        raise ValueError("no samples")
    s = sorted(samples)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def p50_99(samples: Sequence[float]) -> str:
    return f"{pct(samples, 50):.2f} / {pct(samples, 99):.2f} ms"


def ratio(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """p50 and p99 ratios a/b."""
    return pct(a, 50) / pct(b, 50), pct(a, 99) / pct(b, 99)


def ratio_interval(
    a: Sequence[float], b: Sequence[float], q: float, resamples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """A 95% bootstrap interval for pct(a, q) / pct(b, q): each column resampled with
    replacement. It says how far the same machine could move the ratio between runs; at
    q=99 over a few hundred samples it is wide (the p99 of 504 is about the fifth slowest)."""
    rng = random.Random(seed)
    ratios = [
        pct(rng.choices(a, k=len(a)), q) / pct(rng.choices(b, k=len(b)), q)
        for _ in range(resamples)
    ]
    return pct(ratios, 2.5), pct(ratios, 97.5)


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


# ------------------------------------------------------------------ netdevs in bulk


def run_prefix() -> str:
    """A name prefix unique to this run (ifnames are at most 15 chars: prefix + 5 + 1)."""
    return "rb" + secrets.token_hex(2)


def ip_batch(lines: Sequence[str], netns: str | None = None, force: bool = False) -> None:
    """Feed `ip -batch -` many commands: one process for N links instead of N processes."""
    cmd = ["ip", *(["-n", netns] if netns else []), *(["-force"] if force else []), "-batch", "-"]
    res = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True, text=True)
    if res.returncode != 0 and not force:
        raise RuntimeError(f"ip -batch failed: {res.stderr.strip()[:500]}")


@dataclass(frozen=True)
class Nics:
    hosts: list[str]  # veth ends in init_net: the sim devices' netdevs
    peer_netns: str  # where the other ends live

    def sim_spec(self, prefix: str = "sim") -> str:
        return ",".join(f"{prefix}{i}={h}" for i, h in enumerate(self.hosts))


@contextlib.contextmanager
def many_veths(n: int, tag: str = "") -> Iterator[Nics]:
    """`n` veth pairs, host ends in init_net (down, MTU 1500), peers in a scratch netns.

    Peers live in their own netns so that cleanup is one `ip netns del`: the kernel then
    unregisters every pair in one batch (one RCU grace period) instead of one per pair,
    which matters at 1024. Names share a random per-call prefix; leftovers are swept too.
    """
    prefix = run_prefix() + tag
    peers = f"{prefix}peers"
    hosts = [f"{prefix}{i}h" for i in range(n)]
    ip("netns", "add", peers)
    try:
        ip_batch(
            [
                f"link add {h} type veth peer name {prefix}{i}p netns {peers}"
                for i, h in enumerate(hosts)
            ]
        )
        yield Nics(hosts, peers)
    finally:
        ip("netns", "del", peers, check=False)
        # a host end moved into a netns that is still alive would survive; delete leftovers
        left = [h for h in hosts if os.path.exists(f"/sys/class/net/{h}")]
        if left:
            ip_batch([f"link del {h}" for h in left], force=True)


Move = Callable[[], Awaitable[None]]


@contextlib.asynccontextmanager
async def netns_round_trip(tag: str) -> AsyncIterator[tuple[Move, Move]]:
    """A veth and a netns, and its two moves, there and back: one RTM_SETLINK each, the
    kernel's own cost with nothing else (bench.move_spacing, bench.rcu_callbacks)."""
    with many_veths(1, tag) as nics, temp_netns("rb" + tag) as netns:
        init = AsyncIPRoute()
        await init.setup_endpoint()
        target = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
        home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        sock = await run_in_netns(
            target, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 0)
        )
        inside = AsyncIPRoute(use_socket=sock)  # a netlink socket keeps its netns
        index = socket.if_nametoindex(nics.hosts[0])

        async def there() -> None:
            await setlink(init, index, ("IFLA_NET_NS_FD", target))

        async def back() -> None:
            await setlink(inside, index, ("IFLA_NET_NS_FD", home))

        try:
            yield there, back
        finally:
            inside.close()
            sock.close()
            init.close()
            os.close(target)
            os.close(home)


# ------------------------------------------------------------------ the daemon


@contextlib.asynccontextmanager
async def rdmad(
    bus_address: str,
    spec: str,
    mode: str = "shared",
    extra: Sequence[str] = (),
    process: type[RdmadProcess] = RdmadProcess,
) -> AsyncIterator[RdmadProcess]:
    """A running rdmad (READY=1 received) at production log level, state on tmpfs."""
    workdir = Path(_mkdtemp())
    # RdmadProcess passes --log-level debug; the last one wins, and users run at info.
    daemon = process(bus_address, workdir, spec, mode, ["--log-level", "info", *extra])
    await daemon.start()
    try:
        yield daemon
    except BaseException as exc:
        # the log dies with the workdir: keep its tail with the error
        exc.add_note("rdmad log (tail):\n" + daemon.log()[-3000:])
        raise
    finally:
        await daemon.stop()
        _rmtree(workdir)


def _mkdtemp() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="rdmad-bench-", dir=SHM)


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def pid_of(daemon: RdmadProcess) -> int:
    assert daemon.proc is not None
    return daemon.proc.pid


@contextlib.asynccontextmanager
async def client(bus_address: str) -> AsyncIterator[Client]:
    c = await Client.connect(bus_address)
    try:
        yield c
    finally:
        c.close()


def claim_options(
    ifname: str = "", mtu: int = 0, addresses: Sequence[str] = (), shared: bool = False
) -> dict[str, Variant]:
    opts: dict[str, Variant] = {}
    if ifname:
        opts["ifname"] = Variant("s", ifname)
    if mtu:
        opts["mtu"] = Variant("u", mtu)
    if addresses:
        opts["addresses"] = Variant("as", list(addresses))
    if shared:
        opts["shared"] = Variant("b", True)
    return opts


async def claim(c: Client, device: str, netns: str, opts: dict[str, Variant]) -> str:
    """Claim; returns the claim id (the last element of the returned object path)."""
    path = await c.manager("Claim", "ssa{sv}", device, netns, opts)
    return str(path).rsplit("/", 1)[1]


async def release(c: Client, claim_id: str) -> None:
    await c.manager("Release", "s", claim_id)


# ------------------------------------------------------------------ /proc counters


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads, including exited ones)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): utime is field 14, stime field 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid: int) -> int:
    """voluntary + nonvoluntary switches summed over the live threads: each one is a wake-up
    (or a preemption) of the daemon."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                    total += int(line.split()[1])
    return total
