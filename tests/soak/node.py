"""The soak's world: two nodes (one rdmad each, in shared and in exclusive RDMA netns mode,
on the sim backend over real veths), each on its own restartable private bus with its state
dir on a small tmpfs, an exporter and an `rdmactl monitor`; and the netns slots the actors
claim into. In the RDMA guest, one node instead (the netns mode is one per kernel): rdmad on
its kernel backend, each device a real rxe on its veth, named as the sim's (sim0-8) so that
the schedule names it.

A supervisor restarts a node's rdmad whenever it exits, as systemd's Restart= does, and
records each exit: one no fault caused is a violation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from dbus_fast.errors import AuthError

from testbed.bus import START_TIMEOUT, write_config
from testbed.daemon import ROOT, Client, RdmadProcess
from testbed.faulty_rdmad import RCVBUF
from testbed.net import VethPair, eventually, fixed_mac, ip, link, unique_name
from tests.reliability.test_state_file import tiny_tmpfs
from tests.soak.schedule import DEVICES
from tests.support.exporter import Exporter, running_exporter
from tests.support.invariants import HostSettings, host_settings
from tests.support.rdma import sh

# rtnetlink's event socket is this small so that a flood overruns it (as in test_overrun).
SOAK_RCVBUF = "32768"
# A bus connection the node's dbus-daemon dropped (it was restarted), at any stage: dbus-fast
# raises AuthError when that happens during the connection's handshake.
BUS_LOST = (OSError, EOFError, AuthError)
MONITOR_MARGIN_S = 3.0  # a restarted monitor may miss signals until it has subscribed
RXE_START_S = 180.0  # rdmad's and the exporter's start in the guest: imports over 9p, TCG
# A scrape's budget in the guest: under TCG, with the actors at work, rdmad's answers to a
# scrape (a GetCounters per device) take longer than the exporter's default 5 s.
RXE_SCRAPE_S = 30.0


class SoakBus:
    """A private dbus-daemon that can be restarted on the same socket (so every client's
    address stays valid), as a node's system bus is."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path  # dbus-daemon's warnings (why it dropped a connection)
        self.directory = Path(tempfile.mkdtemp(prefix="rdmad-soakbus-"))
        self.directory.chmod(0o755)
        self.config = write_config(self.directory)
        self.address = f"unix:path={self.directory / 'system_bus_socket'}"
        self.process: subprocess.Popen[bytes] | None = None
        self.up = asyncio.Event()

    def start(self) -> None:
        daemon = shutil.which("dbus-daemon")
        if daemon is None:
            raise RuntimeError("dbus-daemon is not installed")
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(
                [
                    daemon,
                    f"--config-file={self.config}",
                    "--nofork",
                    "--print-address=1",
                    "--nopidfile",
                    "--nosyslog",
                ],
                stdout=subprocess.PIPE,
                stderr=log,
            )
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            ready = sel.select(timeout=START_TIMEOUT)
        if not ready or not proc.stdout.readline().startswith(self.address.encode()):
            proc.kill()
            raise RuntimeError("dbus-daemon did not start")
        self.process = proc

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    async def restart(self) -> None:
        """Stopped, then started on the same socket; the blocking parts on a worker thread,
        `up` in the loop's own (an asyncio.Event set from another thread wakes no waiter)."""
        self.up.clear()
        await asyncio.to_thread(self.stop)
        await asyncio.to_thread(self.start)
        self.up.set()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class Device:
    name: str
    pair: VethPair
    address: str  # its host address; with MTU 1500 and UP, its host settings
    rxe: bool = False  # a real rxe device of this name on the veth (the kernel backend)

    def create(self) -> HostSettings:
        """The veth, configured as the host has it (and its rxe); its settings as the
        kernel has them then, which the device invariant compares against."""
        ip("link", "add", self.pair.host, "address", fixed_mac(), "type", "veth",
           "peer", "name", self.pair.peer, "address", fixed_mac())  # fmt: skip
        ip("addr", "add", self.address, "dev", self.pair.host)
        ip("link", "set", self.pair.host, "up")
        if self.rxe:
            sh("rdma", "link", "add", self.name, "type", "rxe", "netdev", self.pair.host)
        return host_settings(self.pair.host)

    def destroyed(self) -> bool:
        """Both ends gone: the veth died with the netns a whole-device claim moved it to."""
        return link(self.pair.host) is None and link(self.pair.peer) is None

    def delete(self) -> None:
        if self.rxe:
            sh("rdma", "link", "del", self.name, check=False)
        for end in (self.pair.host, self.pair.peer):
            ip("link", "del", end, check=False)


@dataclass
class Monitor:
    """`rdmactl monitor --json`, restarted when it ends (the bus restarted), and its record:
    every Claimed and Released it printed, and when it was not listening."""

    claimed: dict[str, float] = field(default_factory=dict)  # claim id -> when seen
    released: dict[str, str] = field(default_factory=dict)  # claim id -> reason
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (from, to) monotonic
    lines: int = 0
    exits: list[int] = field(default_factory=list)
    down_since: float | None = None
    # A second subscriber on its own connection (the tests' Client), made with each monitor:
    # when the monitor lacks a Released, it tells whether rdmad sent one.
    witnesses: list[Client] = field(default_factory=list)

    def witnessed_release(self, claim_id: str) -> str | None:
        for client in self.witnesses:
            for msg in client.signals:
                if msg.member == "Released" and msg.body[0] == claim_id:
                    return str(msg.body[2])
        return None

    def listening_since(self, t: float) -> bool:
        """Whether the monitor listened all the time from `t` until now."""
        if self.down_since is not None:
            return False
        return all(end < t for _, end in self.gaps)

    def take(self, line: bytes) -> None:
        event = json.loads(line)
        self.lines += 1
        args = event.get("args", {})
        if event.get("signal") == "Claimed":
            self.claimed.setdefault(args["claim_id"], time.monotonic())
        elif event.get("signal") == "Released":
            self.released[args["claim_id"]] = args["reason"]


@dataclass
class Node:
    name: str  # its RDMA netns mode: shared or exclusive
    workdir: Path
    devices: dict[str, Device]
    bus: SoakBus
    daemon: RdmadProcess
    settings: dict[str, HostSettings] = field(default_factory=dict)
    up: asyncio.Event = field(default_factory=asyncio.Event)
    expected_exits: list[int] = field(default_factory=list)  # a fault says what it caused
    exits: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    disk_full: bool = False
    monitor: Monitor = field(default_factory=Monitor)
    exporter: Exporter | None = None
    closing: bool = False
    samples: list[tuple[float, int, int, int]] = field(default_factory=list)  # t, pid, rss, fds
    start_timeout: float = 60.0

    @property
    def restart_wait(self) -> float:
        """How long rdmad may take to be back after an exit: a start, and a second one if
        the first failed (the state disk full)."""
        return 2 * self.start_timeout

    @property
    def pid(self) -> int | None:
        proc = self.daemon.proc
        return proc.pid if proc is not None and proc.returncode is None else None

    def nics(self) -> dict[str, VethPair]:
        return {name: d.pair for name, d in self.devices.items()}

    def repair(self) -> None:
        """Re-create the veths that died with a netns, before rdmad (re)starts and binds to
        them by name; a destroyed device stays destroyed while rdmad runs."""
        for name, device in self.devices.items():
            if device.destroyed():
                self.settings[name] = device.create()

    async def supervise(self) -> None:
        while not self.closing:
            assert self.daemon.proc is not None
            code = await self.daemon.proc.wait()
            self.up.clear()
            if self.closing:
                return
            self.exits.append(code)
            if code in self.expected_exits:
                self.expected_exits.remove(code)
            else:
                self.problems.append(f"rdmad ({self.name}) exited with {code}, not by a fault")
            await self.bus.up.wait()
            await self.start()

    async def start(self) -> None:
        for _attempt in range(5):
            self.repair()
            try:
                await self.daemon.start(self.start_timeout)
                self.up.set()
                return
            except RuntimeError as exc:
                if not self.disk_full:
                    self.problems.append(f"rdmad ({self.name}) did not start: {exc}")
                while self.disk_full or not self.bus.up.is_set():  # noqa: ASYNC110
                    await asyncio.sleep(0.1)  # the fault ends the window; nothing announces it
        raise RuntimeError(f"rdmad ({self.name}) did not start after 5 attempts")

    async def run_monitor(self) -> None:
        record = self.monitor
        while not self.closing:
            await self.bus.up.wait()
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "rdmad.cli.main",
                "--bus-address",
                self.bus.address,
                "--json",
                "monitor",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                start_new_session=True,
                limit=1 << 24,  # a line per signal; an InterfacesAdded line can be long
            )
            with contextlib.suppress(*BUS_LOST):
                record.witnesses.append(await Client.connect(self.bus.address))
            if record.down_since is not None:
                record.gaps.append((record.down_since, time.monotonic() + MONITOR_MARGIN_S))
            record.down_since = None
            assert proc.stdout is not None
            try:
                while line := await proc.stdout.readline():
                    try:
                        record.take(line)
                    except (ValueError, KeyError, TypeError) as exc:
                        self.problems.append(
                            f"rdmactl monitor ({self.name}) printed {line!r}: {exc!r}"
                        )
            finally:
                if proc.returncode is None and self.closing:
                    proc.terminate()
                code = await proc.wait()
            record.down_since = time.monotonic()
            if not self.closing:
                record.exits.append(code)
                if code != 3:  # 3: the bus closed the connection
                    self.problems.append(f"rdmactl monitor ({self.name}) exited with {code}")

    def died(self, task: asyncio.Task[None]) -> None:
        """A supervisor or monitor task that ends before the node closes is a violation:
        the soak would go on without its restarts or its record."""
        if not self.closing and not task.cancelled():
            self.problems.append(f"{self.name}: a background task ended: {task.exception()!r}")

    def sample(self, t: float) -> None:
        """rdmad's RSS (KiB) and open fds now."""
        pid = self.pid
        if pid is None:
            return
        try:
            with open(f"/proc/{pid}/status") as f:
                rss = int(next(x for x in f if x.startswith("VmRSS:")).split()[1])
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, StopIteration):
            return
        self.samples.append((t, pid, rss, fds))


@contextlib.asynccontextmanager
async def running_node(
    name: str, index: int, workdir: Path, rxe: bool = False
) -> AsyncIterator[Node]:
    """A node: its bus, veths, tmpfs state dir, rdmad (supervised), exporter and monitor.
    With `rxe`, rdmad runs on its kernel backend over rxe devices, and the kernel's RDMA
    netns mode is set to the node's (before any netns exists, as the kernel requires)."""
    await asyncio.to_thread(workdir.mkdir, parents=True)
    devices = {
        f"sim{i}": Device(
            f"sim{i}",
            VethPair(unique_name("sk"), unique_name("sk")),
            f"198.51.100.{index * 16 + i + 1}/32",
            rxe,
        )
        for i in range(DEVICES)
    }
    bus = SoakBus(workdir / "dbus-daemon.log")
    tasks: list[asyncio.Task[None]] = []
    node: Node | None = None
    try:
        bus.start()
        bus.up.set()
        if rxe:
            sh("rdma", "system", "set", "netns", name)
        spec = "" if rxe else ",".join(f"{n}={d.pair.host}" for n, d in devices.items())
        daemon = RdmadProcess(bus.address, workdir, spec, name, env={RCVBUF: SOAK_RCVBUF})
        node = Node(name, workdir, devices, bus, daemon)
        if rxe:
            node.start_timeout = RXE_START_S
        with tiny_tmpfs(daemon.state_dir):
            await node.start()
            tasks = [
                asyncio.ensure_future(node.supervise()),
                asyncio.ensure_future(node.run_monitor()),
            ]
            for task in tasks:
                task.add_done_callback(node.died)
            guest = (RXE_SCRAPE_S, RXE_START_S) if rxe else (None, node.start_timeout)
            async with running_exporter(bus.address, *guest) as exporter:
                node.exporter = exporter
                yield node
                node.closing = True
    finally:
        if node is not None:
            node.closing = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await node.daemon.kill()
            for witness in node.monitor.witnesses:
                witness.close()
        for device in devices.values():
            device.delete()
        if rxe:  # the kernel's default again (refused while a netns is left)
            sh("rdma", "system", "set", "netns", "shared", check=False)
        bus.close()


@dataclass
class Slot:
    """A netns an actor may claim into, with a process inside it (for the pid: form)."""

    index: int
    generation: int = 0
    holder: asyncio.subprocess.Process | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def name(self) -> str:
        return f"soak{os.getpid() % 100000}s{self.index}g{self.generation}"

    def alive(self) -> bool:
        return self.holder is not None and os.path.exists(f"/run/netns/{self.name}")

    async def ensure(self) -> str:
        """Its netns, made anew if it was deleted; the name."""
        async with self.lock:
            if not self.alive():
                self.generation += 1
                await asyncio.to_thread(ip, "netns", "add", self.name)
                self.holder = await asyncio.create_subprocess_exec(
                    *("ip", "netns", "exec", self.name, "sleep", "infinity"),
                    stdin=asyncio.subprocess.DEVNULL,
                )
                # pid:PID names its netns only once `ip netns exec` has entered it
                await eventually(self._holder_inside, 10, f"the holder to enter {self.name}")
            return self.name

    def _holder_inside(self) -> bool:
        assert self.holder is not None
        try:
            inside = os.stat(f"/proc/{self.holder.pid}/ns/net").st_ino
        except FileNotFoundError:
            return False
        return inside == os.stat(f"/run/netns/{self.name}").st_ino

    async def delete(self) -> bool:
        """Delete it as a dying pod's netns goes: the name, then its last process. Whether
        there was one."""
        async with self.lock:
            if not self.alive():
                return False
            await asyncio.to_thread(ip, "netns", "del", self.name, check=False)
            assert self.holder is not None
            with contextlib.suppress(ProcessLookupError):  # a signal to the soak's group
                self.holder.send_signal(signal.SIGKILL)
            await self.holder.wait()
            self.holder = None
            return True

    async def close(self) -> None:
        await self.delete()
