"""rdmad-dra in the soak: per node, the real plugin process against the node's bus and a
loopback API server of its own (testbed/dra/apiserver.py), supervised as systemd's
Restart= would; the kubelet's side of it (DraActor); SIGKILL of the plugin (PluginKiller);
and what must hold of its slices at each check (slices_settled).

The plugin exits when its bus connection ends (a dbus-daemon restart): that exit (status
1, "stopped: ..." logged), and the SIGKILLs the killer sent, are expected; any other is a
violation. Its stderr of every run is kept in <node>/rdmad-dra.log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rdmad.dra.device_watch import DeviceWatch
from rdmad.dra.offer import offered
from testbed.children import spawn
from testbed.daemon import ROOT, Client
from testbed.dra.apiserver import ApiServer
from testbed.dra.claims import DRIVER, claim
from testbed.dra.plugin_process import argv
from tests.soak.actors import HoldActor, Pod, World, present
from tests.soak.invariants import SETTLE_S, Verdict
from tests.soak.node import BUS_LOST, Node
from tests.soak.schedule import DRA_DEVICES, Action

EXIT_FAILED = 1  # rdmad.dra.plugin's (not imported: it loads gRPC, see kubelet_calls.py)
START_S = 120.0  # the plugin's imports (grpc, the kubernetes client) on a loaded host
SERVING = "serving DRA driver"  # its log line once both sockets serve
CALL_S = 60.0  # a kubelet call, times the clock's pace: each of its gRPC calls has 10 s
STOPPED = "rdmad.dra: stopped: "  # its last word when a task of its ended (the bus lost)
NAMESPACE = "soak"


@dataclass
class DraPlugin:
    """A node's rdmad-dra and its API server, restarted whenever it exits."""

    node: Node
    api: ApiServer
    workdir: Path  # its kubelet directories: short, as a socket's path is (107 bytes)
    up: asyncio.Event = field(default_factory=asyncio.Event)
    pid: int | None = None
    kills: int = 0  # SIGKILLs sent that the supervisor has not seen end it yet
    exits: list[int] = field(default_factory=list)
    closing: bool = False

    @property
    def endpoint(self) -> str:
        return str(self.workdir / "plugins" / DRIVER / "dra.sock")

    async def supervise(self) -> None:
        while not self.closing:
            await self.node.bus.up.wait()
            bus = self.node.bus.process  # a restart of the bus makes another
            code, log = await self.run_once()
            with (self.node.workdir / "rdmad-dra.log").open("a") as f:  # kept for a replay
                f.write("\n".join([*log, f"== exited with {code}", ""]))
            if self.closing:
                return
            self.exits.append(code)
            self.judge(code, log, bus_restarted=self.node.bus.process is not bus)

    async def run_once(self) -> tuple[int, list[str]]:
        """One run of the plugin, up from its "serving" line until it exits: its exit
        status and its stderr."""
        proc = await spawn(  # signalled by the killer: default dispositions
            *argv(self.api, self.node.bus.address, self.workdir),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        log: list[str] = []
        try:
            assert proc.stderr is not None
            while line := await proc.stderr.readline():
                log.append(line.decode(errors="replace").rstrip())
                if SERVING in log[-1]:
                    self.pid = proc.pid
                    self.up.set()
            return await proc.wait(), log
        finally:
            self.up.clear()
            self.pid = None
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    def judge(self, code: int, log: list[str], bus_restarted: bool) -> None:
        if code == -signal.SIGKILL and self.kills:
            self.kills -= 1
        elif not (code == EXIT_FAILED and bus_restarted and any(STOPPED in x for x in log)):
            self.node.problems.append(
                f"rdmad-dra ({self.node.name}) exited with {code}, not by a fault: {log[-5:]}"
            )


@contextlib.asynccontextmanager
async def running_dra(node: Node, start_s: float = START_S) -> AsyncIterator[DraPlugin]:
    """`start_s`: how long its first start may take (the guest's TCG needs more)."""
    api = ApiServer(f"soak-{node.name}", DRIVER)
    workdir = Path(tempfile.mkdtemp(prefix="rdmad-sdra-"))
    with api.running():
        dra = DraPlugin(node, api, workdir)
        task = asyncio.ensure_future(dra.supervise())
        task.add_done_callback(node.died)
        try:
            try:
                async with asyncio.timeout(start_s):
                    await dra.up.wait()
            except TimeoutError:
                raise RuntimeError(
                    f"rdmad-dra ({node.name}) did not serve in {start_s:g} s: {node.problems}"
                ) from None
            yield dra
        finally:
            dra.closing = True
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            shutil.rmtree(workdir, ignore_errors=True)


class Kubelet:
    """The kubelet's side of the plugins' DRA service, through one
    `python -m tests.soak.kubelet_calls` process (the soak's own never loads gRPC)."""

    def __init__(self, proc: asyncio.subprocess.Process, pace: float) -> None:
        self.proc = proc
        self.lock = asyncio.Lock()
        self.call_s = CALL_S * pace

    async def call(self, op: str, endpoint: str, ref: ClaimRef) -> dict[str, str]:
        """{"error": the claim's, "" for none} or {"failed": why no answer came}."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request = {"op": op, "endpoint": endpoint, "claim": list(ref)}
        async with self.lock, asyncio.timeout(self.call_s):
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            await self.proc.stdin.drain()
            line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the kubelet's calls ended (exit {await self.proc.wait()})")
        reply: dict[str, str] = json.loads(line)
        return reply


@contextlib.asynccontextmanager
async def running_kubelet(pace: float) -> AsyncIterator[Kubelet]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.soak.kubelet_calls",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        yield Kubelet(proc, pace)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # its end of input: it exits
        try:
            async with asyncio.timeout(10):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


class ClaimRef(NamedTuple):
    """A ResourceClaim as the kubelet names it (testbed/dra/kubelet.py's Claim)."""

    namespace: str
    uid: str
    name: str


@dataclass
class DraPod(Pod):
    devices: list[str] = field(default_factory=list)  # their names in the slice
    prepared: bool = False  # False: its prepare got no answer; unprepare may still end it

    @property
    def ref(self) -> ClaimRef:
        """Its ResourceClaim, as the kubelet names it."""
        return ClaimRef(NAMESPACE, f"soakdra-{os.getpid()}-claim-{self.serial}", self.name)

    @property
    def name(self) -> str:
        return f"dra-{self.serial}"


class DraActor(HoldActor):
    """The kubelet and the scheduler of each node's rdmad-dra: a ResourceClaim allocated
    from the slice the plugin published (as the scheduler: 1-2 of the DRA devices, whole or
    share slots, none another live claim has), NodePrepareResources; the sandbox's
    rdmad-cni ADD and DEL in pod mode (HoldActor's); NodeUnprepareResources. A prepare that
    got no answer (the plugin killed or restarting) leaves the pod for an unprepare, as the
    kubelet retries."""

    def __init__(
        self, world: World, cni_path: str, plugins: dict[str, DraPlugin], kubelet: Kubelet
    ) -> None:
        super().__init__(world, cni_path)
        self.name = "dra"
        self.plugins = plugins
        self.kubelet = kubelet

    async def do(self, action: Action) -> None:
        self.detail = ""
        node = self.world.nodes[action.args["node"]]
        ops = {"prepare": self.prepare, "come": self.come, "unprepare": self.unprepare}
        self.count(action.op, await ops[action.op](node, action.args))

    def uid(self, pod: Pod) -> str:
        return f"soakdra-{os.getpid()}-{pod.serial}"

    def conf(self, node: Node) -> dict[str, Any]:
        return super().conf(node) | {"name": f"soak-dra-{node.name}"}

    def allocate(self, plugin: DraPlugin, count: int, pick: int) -> list[str]:
        taken = {
            d
            for p in self.pods
            if isinstance(p, DraPod) and p.node == plugin.node.name
            for d in p.devices
        }
        wanted = {f"sim{i}" for i in DRA_DEVICES}
        offer = sorted(
            (name, d["attributes"]["rdmaDevice"]["string"])
            for name, d in plugin.api.devices().items()
            if name not in taken and d["attributes"]["rdmaDevice"]["string"] in wanted
        )
        chosen: dict[str, str] = {}  # rdma device -> its name in the slice: one each
        for i in range(len(offer)):
            name, rdma = offer[(pick + i) % len(offer)]
            chosen.setdefault(rdma, name)
        return list(chosen.values())[:count]

    async def prepare(self, node: Node, args: dict[str, Any]) -> str:
        plugin = self.plugins[node.name]
        devices = self.allocate(plugin, args["count"], args["pick"])
        if not devices:
            return "nothing-offered"
        self.serial += 1
        pod = DraPod(node.name, self.serial, [], devices=devices)
        plugin.api.put_claim(
            claim(
                pod.ref.uid,
                devices,
                name=pod.ref.name,
                namespace=NAMESPACE,
                pool=plugin.api.node,
                pods=(self.uid(pod),),
                # the slots hold many pods: a name of its own (two devices take rdmad's)
                parameters={"interfaceName": f"d{pod.serial}"} if len(devices) == 1 else None,
            )
        )
        self.pods.append(pod)
        got = await self.kubelet.call("prepare", plugin.endpoint, pod.ref)
        if "failed" in got:
            self.detail = f"prepare: {got['failed']}"
            return "no-answer"
        if got["error"]:
            self.detail = got["error"]
            self.pods.remove(pod)  # a prepare that fails releases what it held
            return "refused"
        pod.prepared = True
        return "ok" if len(devices) == args["count"] else "ok-fewer"

    def pick(self, node: Node, pick: int, came: bool | None = None) -> Pod | None:
        mine = [
            p
            for p in self.pods
            if isinstance(p, DraPod)
            and p.node == node.name
            and (came is None or (p.prepared and bool(p.via) == came))
        ]
        return mine[pick % len(mine)] if mine else None

    async def unprepare(self, node: Node, args: dict[str, Any]) -> str:
        pod = self.pick(node, args["pick"])
        if pod is None:
            return "nothing-prepared"
        assert isinstance(pod, DraPod)
        if pod.via == "cni" and pod.slot is not None:
            done = await self.pod_cni("DEL", node, present(self.world.slots[pod.slot].name), pod)
            if done.code != 0:
                self.detail = f"DEL: {done.out} {done.stderr.strip()}"
                return f"del-error-{(done.out or {}).get('code', done.code)}"
            pod.slot = None  # the sandbox is gone: a retried unprepare does not DEL again
        got = await self.kubelet.call("unprepare", self.plugins[node.name].endpoint, pod.ref)
        if "failed" in got:
            self.detail = f"unprepare: {got['failed']}"
            return "no-answer"  # the pod stays: a later unprepare retries, as the kubelet
        if got["error"]:
            self.detail = got["error"]
            return "refused"
        self.pods.remove(pod)
        return "ok" if pod.prepared else "ok-unanswered-prepare"


class PluginKiller:
    def __init__(self, world: World, plugins: dict[str, DraPlugin]) -> None:
        self.world = world
        self.plugins = plugins

    async def do(self, action: Action) -> None:
        plugin = self.plugins[action.args["node"]]
        result = "plugin-down"  # still restarting (a bus restart ended it)
        if plugin.pid is not None:
            before = len(plugin.exits)
            plugin.kills += 1
            os.kill(plugin.pid, signal.SIGKILL)
            async with asyncio.timeout(START_S):
                while len(plugin.exits) == before or not plugin.up.is_set():  # noqa: ASYNC110
                    await asyncio.sleep(0.05)  # the supervisor's restart: nothing announces it
            result = "restarted"
        self.world.tally.count("fault", "plugin-sigkill", result)


async def slice_problems(plugin: DraPlugin) -> list[str]:
    """The devices the API server's slices list against those rdmad offers now, by the
    plugin's own rule (rdmad/dra/offer.py): the slices must be current with rdmad."""
    async with asyncio.timeout(START_S):
        await plugin.up.wait()
    client = await Client.connect(plugin.node.bus.address, signals=False)
    try:
        state = await DeviceWatch(client.bus).read()
    finally:
        client.close()
    if state is None:
        return ["rdmad unreadable"]
    if plugin.api.invalid:
        return [f"the API server refused rdmad-dra's slices: {plugin.api.invalid}"]
    want = {d["name"] for d in offered(state)}
    have = set(plugin.api.devices())
    if want == have:
        return []
    return [
        f"rdmad-dra's slices: {sorted(have - want)} listed and not offered, "
        f"{sorted(want - have)} offered and not listed"
    ]


async def slices_settled(plugins: dict[str, DraPlugin]) -> dict[str, Verdict]:
    """Each node's slice verdict once it holds, or the last after SETTLE_S seconds."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        verdicts = {}
        for name, plugin in plugins.items():
            verdict = Verdict()
            try:
                verdict.problems += await slice_problems(plugin)
            except BUS_LOST as exc:
                verdict.problems.append(f"bus unreadable: {exc!r}")
            verdict.figures["offered"] = len(plugin.api.devices())
            verdict.figures["restarts"] = len(plugin.exits)
            verdicts[f"dra-{name}"] = verdict
        if not any(v.problems for v in verdicts.values()) or time.monotonic() > deadline:
            return verdicts
        await asyncio.sleep(0.5)
