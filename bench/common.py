"""What the scenarios share, on top of testbed/: parameters, results, netdevs in bulk, the
daemon and its claims, and per-process counters from /proc."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import random
import secrets
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dbus_fast import Variant

from bench.stats import RatioCheck
from testbed.daemon import Client, RdmadProcess
from testbed.net import ip
from testbed.threads import Thread, switches, woken

BENCH_DIR = Path(__file__).resolve().parent
# tmpfs, as /run (rdmad's default state dir) is on real hosts; / is ext4 on this machine.
SHM = Path("/dev/shm")
# RFC 2544's benchmarking range: addresses for the interfaces of a modelled node
BENCH_NET = ipaddress.IPv4Network("198.18.0.0/15")


@dataclass(frozen=True)
class Params:
    """The full run's parameters; quick() gives smoke mode's."""

    smoke: bool = False
    reps: int = 200  # repetitions per latency measurement (the issue asks >= 200)
    # Claim/release against raw and the CLI: more, since each move lands on a whole number
    # of scheduler ticks and a p50 of multimodal samples needs them. Whole cycles of
    # bench.columns.ORDERS["rwcl"] (a multiple of 8), so each column follows each alike.
    latency_reps: int = 504
    # Claims and releases are measured settled (Settler): this long before each, plus up to
    # jitter_ms at random.
    settle_ms: float = 50.0
    jitter_ms: float = 10.0
    warmup: int = 10
    # (RDMA-capable netdevs, unrelated interfaces) per modelled node, smallest first
    scale_nodes: tuple[tuple[int, int], ...] = ((16, 0), (128, 256), (1024, 2048))
    scale_reps: int = 300  # claim/release cycles per pass per node (at 100, p90 undecided)
    shared_reps: int = 104  # whole cycles of bench.columns.ORDERS["rw"] (a multiple of 2)
    cni_reps: int = 100  # rounds of ADD then DEL per CNI plugin column
    burst: int = 64  # claims at once, from as many clients on as many devices
    bursts: int = 6  # bursts of each kind, each against a serial raw sequence
    pod_reps: int = 60  # 8-rail pods per column and kind (bench.pod), a multiple of 6
    idle_seconds: float = 60.0

    @classmethod
    def quick(cls) -> Params:
        # the second scale node is the guard's: 1024 interfaces against none (bench.scale)
        return cls(smoke=True, reps=8, latency_reps=8, warmup=1, scale_nodes=((4, 0), (4, 1024)),
                   scale_reps=16, shared_reps=8, cni_reps=4, burst=8, bursts=1, pod_reps=1,
                   idle_seconds=2.0)  # fmt: skip


class Settler:
    """Idles before a netns-moving operation: p.settle_ms, plus up to p.jitter_ms at random
    (seeded), so that it starts with most earlier RCU work gone and at a random phase of the
    scheduler tick, as a claim on a node does (docs/performance.md)."""

    def __init__(self, p: Params) -> None:
        self._base, self._jitter = p.settle_ms / 1e3, p.jitter_ms / 1e3
        self._rng = random.Random(1)

    async def __call__(self) -> None:
        await asyncio.sleep(self._base + self._rng.uniform(0, self._jitter))


@dataclass
class Row:
    """One line of results.md. Values are preformatted; `met` None means no target.
    Distributions read p50 / p90 / p99; ratio targets are judged as bench.stats says."""

    scenario: str
    rdmad: str
    raw: str = "-"
    cli: str = "-"
    ratio: str = "-"
    target: str = ""
    met: bool | None = None

    @classmethod
    def of(
        cls, scenario: str, ours: str, theirs: str, check: RatioCheck, judged: bool = True,
        note: str = "",
    ) -> Row:  # fmt: skip
        """A row of a ratio `check` (and a `note` beside it); not `judged`, it decides nothing."""
        target, met = (check.target(), check.met) if judged else ("", None)
        return cls(scenario, ours, theirs, ratio=check.text() + note, target=target, met=met)


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    dists: dict[str, list[float]] = field(default_factory=dict)  # name -> samples, ms
    errors: list[str] = field(default_factory=list)
    scenario_seconds: dict[str, float] = field(default_factory=dict)


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


# ------------------------------------------------------------------ netdevs in bulk


def run_prefix() -> str:
    """A name prefix unique to this run (ifnames are at most 15 chars: prefix + 5 + 1)."""
    return "rb" + secrets.token_hex(2)


def ip_batch(lines: Sequence[str], netns: str | None = None, force: bool = False) -> None:
    """Feed `ip -batch -` many commands: one process for N links instead of N processes."""
    if not lines:
        return
    cmd = ["ip", *(["-n", netns] if netns else []), *(["-force"] if force else []), "-batch", "-"]
    res = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True, text=True)
    if res.returncode != 0 and not force:
        raise RuntimeError(f"ip -batch failed: {res.stderr.strip()[:500]}")


@dataclass(frozen=True)
class Nics:
    hosts: list[str]  # veth ends in init_net: the sim devices' netdevs
    peer_netns: str  # where the other ends live

    def sim_spec(self) -> str:
        return ",".join(f"sim{i}={h}" for i, h in enumerate(self.hosts))


@contextlib.contextmanager
def many_veths(n: int, tag: str = "", up: bool = False) -> Iterator[Nics]:
    """`n` veth pairs, host ends in init_net (MTU 1500), peers in a scratch netns (one
    `ip netns del` then unregisters them all in one batch). Down by default; with `up`,
    both ends up and host end i with BENCH_NET[i]/32, past IPv6 DAD."""
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
        if up:
            ip_batch([f"link set {prefix}{i}p up" for i in range(n)], netns=peers)
            ip_batch(
                [
                    line
                    for i, h in enumerate(hosts)
                    for line in (f"addr add {BENCH_NET[i]}/32 dev {h}", f"link set {h} up")
                ]
            )
            _past_dad(None, peers)
        yield Nics(hosts, peers)
    finally:
        ip("netns", "del", peers, check=False)
        # a host end moved into a netns that is still alive would survive; delete leftovers
        left = [h for h in hosts if os.path.exists(f"/sys/class/net/{h}")]
        if left:
            ip_batch([f"link del {h}" for h in left], force=True)


def _past_dad(*netns: str | None, within: float = 60.0) -> None:
    """Once no IPv6 address in these netns is tentative: DAD's end is a burst of address
    events that a measurement started earlier would charge to its first operations."""
    deadline = time.monotonic() + within
    while any(ip("-6", "addr", "show", "tentative", netns=ns).strip() for ns in netns):
        if time.monotonic() > deadline:
            raise TimeoutError(f"IPv6 addresses still tentative after {within:g} s")
        time.sleep(0.1)  # nothing announces the end of DAD for a whole netns


# ------------------------------------------------------------------ the daemon


@contextlib.asynccontextmanager
async def rdmad(
    bus_address: str, spec: str, extra: Sequence[str] = ()
) -> AsyncIterator[RdmadProcess]:
    """A running rdmad (READY=1 received) at production log level, state on tmpfs."""
    with tempfile.TemporaryDirectory(prefix="rdmad-bench-", dir=SHM) as workdir:
        # RdmadProcess passes --log-level debug; the last one wins, and users run at info.
        args = ["--log-level", "info", *extra]
        daemon = RdmadProcess(bus_address, Path(workdir), spec, "shared", args)
        await daemon.start()
        try:
            yield daemon
        except BaseException as exc:
            # the log dies with the workdir: keep its tail with the error
            exc.add_note("rdmad log (tail):\n" + daemon.log()[-3000:])
            raise
        finally:
            await daemon.stop()


def pid_of(daemon: RdmadProcess) -> int:
    assert daemon.proc is not None
    return daemon.proc.pid


@contextlib.asynccontextmanager
async def client(bus_address: str, signals: bool = True) -> AsyncIterator[Client]:
    c = await Client.connect(bus_address, signals=signals)
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


def claim_cycle(
    c: Client, device: str, netns: str, opts: dict[str, Variant]
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """rdmad's way to claim and release: a claim, and the release of the last one."""
    last = ""

    async def claim_op() -> None:
        nonlocal last
        last = await claim(c, device, netns, opts)

    async def release_op() -> None:
        await release(c, last)

    return claim_op, release_op


Claim = tuple[Client, str, str, dict[str, Variant]]  # claim()'s arguments


async def at_once(claims: Sequence[Claim]) -> float:
    """Until the last of `claims` has its reply (ms), all sent at once; then released."""
    t0 = time.perf_counter()
    ids = await asyncio.gather(*(claim(*c) for c in claims))
    took = ms_since(t0)
    await asyncio.gather(*(release(c[0], i) for c, i in zip(claims, ids, strict=True)))
    return took


# ------------------------------------------------------------------ /proc counters


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads, including exited ones)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): utime is field 14, stime field 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Idle:
    """What a process did over `seconds` with nothing to do: its CPU, and the threads that
    woke (context switches, testbed.threads) with how often."""

    seconds: float
    cpu_ms: float
    wakeups: dict[Thread, int]

    @property
    def met(self) -> bool:
        return self.cpu_ms == 0 and not self.wakeups

    def text(self) -> str:
        by_name: Counter[str] = Counter()
        for thread, n in self.wakeups.items():
            by_name[thread.name] += n
        names = ", ".join(f"{name} {n}" for name, n in sorted(by_name.items()))
        woke = f"{sum(by_name.values())} wake-ups" + (f" ({names})" if names else "")
        return f"CPU {self.cpu_ms:.0f} ms, {woke} in {self.seconds:g} s"


async def idle(pid: int, seconds: float) -> Idle:
    """Process `pid` watched for `seconds`."""
    cpu0, sw0 = cpu_seconds(pid), switches(pid)
    await asyncio.sleep(seconds)
    cpu1, sw1 = cpu_seconds(pid), switches(pid)
    return Idle(seconds, (cpu1 - cpu0) * 1000.0, woken(sw0, sw1))
