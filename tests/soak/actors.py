"""The soak's actors: what runtimes and operators do to a node, one action at a time as the
schedule releases it. Each records every outcome in the tally; a refusal from rdmad (busy
device, netns gone, rdmad restarting) is an outcome, not a failure: the invariants judge.

- BusClaimer: Claim and Release over the bus, as a runtime's D-Bus client: whole device,
  shared, netdev=false, into a netns named by name, by path or by pid:PID, or passed open
  (ClaimFd, the client negotiated fd passing).
- CniActor: rdmad-cni ADD, CHECK (with ADD's result as prevResult), DEL and GC, with the
  environment and stdin a runtime gives it.
- PodmanActor: the real podman: run, rm -f, kill -9 of the container's process.
- PodActor: multi-rail pods, 2-4 claims into one netns with one pod CDI name and policy
  routing, released together or ended by their netns's death.
- HoldActor: DRA-style pods: Hold, then rdmad-cni ADD in pod mode or Manager.Attach (or
  the pod never comes), then unprepare. (tests/soak/dra.py's DraActor does pods through
  the real rdmad-dra.)
- Scraper: the exporter scraped, rdmad's RSS and fds sampled.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dbus_fast import Variant

from testbed.daemon import BUS_NAME, MANAGER_IFACE, MANAGER_PATH, Client, DBusCallError
from tests.cni.conftest import Outcome, run_plugin
from tests.cni.podman import Podman
from tests.soak.clock import Clock
from tests.soak.node import BUS_LOST, Node, Slot
from tests.soak.schedule import FD_FORM, PODMAN_DEVICE, Action

CALL_TIMEOUT = 40.0  # longer than any fault's window: an unanswered call is an outcome
# One rdmad-cni run, times the clock's pace: the guest's TCG runs everything slower.
PLUGIN_S = 60.0


@dataclass
class Tally:
    outcomes: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # kind, op, result
    acks: dict[str, dict[str, float]] = field(default_factory=dict)  # node -> claim id -> when
    details: dict[tuple[str, str, str], str] = field(default_factory=dict)  # the first of each
    behind: dict[str, float] = field(default_factory=dict)  # actor kind -> most seconds late

    def started(self, actor: str, late: float) -> None:
        """An action started `late` seconds after its time (an actor whose actions take
        longer than their spacing falls behind, then plays its backlog back to back)."""
        kind = actor.rstrip("0123456789")
        self.behind[kind] = max(self.behind.get(kind, 0.0), late)

    def count(self, actor: str, op: str, result: str, detail: str = "") -> None:
        key = (actor.rstrip("0123456789"), op, result)
        self.outcomes[key] += 1
        if detail:
            self.details.setdefault(key, detail)

    def ack(self, node: str, claim_id: str) -> None:
        self.acks.setdefault(node, {})[claim_id] = time.monotonic()


@dataclass
class World:
    nodes: dict[str, Node]
    slots: list[Slot]
    tally: Tally
    clock: Clock
    workdir: Path


def outcome_of(exc: BaseException, node: Node) -> str:
    if isinstance(exc, DBusCallError):
        return exc.name.rsplit(".", 1)[-1]
    if isinstance(exc, TimeoutError):
        return "no-answer"
    if not node.bus.up.is_set():  # the bus-restart fault's window: its socket is gone
        return "bus-down"
    return f"bus-error:{type(exc).__name__}"


POD_PRIMARY = {  # the result of the pod network's plugin, which rdmad-cni chains after
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "sandbox": "SANDBOX"}],
    "ips": [],
    "routes": [],
}


@dataclass
class Pod:
    """A pod's claims on a node: one netns (a slot, once it came) for all of them."""

    node: str
    serial: int
    claims: list[str]
    slot: int | None = None
    via: str = ""  # how a held pod came: "cni" or "attach"; "" not yet
    container: str = ""


class BusUser:
    """What an actor needs to call a node's rdmad as a client: a connection per node, and
    each call's outcome (a refusal, no answer, the bus gone) as a string."""

    def __init__(self, name: str, world: World) -> None:
        self.name = name
        self.world = world
        self.clients: dict[str, Client] = {}
        self.serial = 0
        self.detail = ""

    async def client(self, node: Node) -> Client:
        if node.name not in self.clients or not self.clients[node.name].bus.connected:
            self.clients[node.name] = await Client.connect(node.bus.address, signals=False)
        return self.clients[node.name]

    async def call(self, node: Node, member: str, sig: str, *body: Any) -> tuple[str, Any]:
        """("ok", the reply) or (the outcome, None)."""
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                client = await self.client(node)
                return "ok", await client.manager(member, sig, *body)
        except (DBusCallError, TimeoutError, *BUS_LOST) as exc:
            self.detail = self.detail or f"{member}: {exc}"
            if not isinstance(exc, DBusCallError):
                self.clients.pop(node.name, None)
            return outcome_of(exc, node), None

    async def release_all(self, node: Node, claims: list[str]) -> str:
        """Each claim released; "ok" if all were, else the first other outcome."""
        results = [(await self.call(node, "Release", "s", c))[0] for c in claims]
        return next((r for r in results if r != "ok"), "ok")

    def count(self, op: str, result: str) -> None:
        self.world.tally.count(self.name, op, result, self.detail)

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


class BusClaimer(BusUser):
    def __init__(self, name: str, world: World) -> None:
        super().__init__(name, world)
        self.held: dict[str, list[str]] = {}  # node -> the ids of the claims it made there

    async def do(self, action: Action) -> None:
        if action.op == "release":
            held = [(n, c) for n, claims in sorted(self.held.items()) for c in claims]
            if not held:
                self.world.tally.count(self.name, "release", "nothing-held")
                return
            name, claim = held[action.args["pick"] % len(held)]
            self.held[name].remove(claim)
            args = {**action.args, "claim": claim}
        else:
            name, args = action.args["node"], action.args
        node = self.world.nodes[name]
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                client = await self.client(node)
                result = await getattr(self, action.op)(client, args)
        except (DBusCallError, TimeoutError, *BUS_LOST) as exc:
            result, detail = outcome_of(exc, node), str(exc)
            if not isinstance(exc, DBusCallError):
                self.clients.pop(node.name, None)
        else:
            detail = ""
        op = f"{action.op}-{args['kind']}" if action.op == "claim" else action.op
        outcome, _, claim_id = result.partition(" ")
        self.world.tally.count(self.name, op, outcome, detail)
        if claim_id:
            self.world.tally.ack(node.name, claim_id)
            self.held.setdefault(node.name, []).append(claim_id)

    async def claim(self, client: Client, args: dict[str, Any]) -> str:
        """ "ok-FORM ID" once rdmad acknowledged it."""
        slot = self.world.slots[args["slot"]]
        name = await slot.ensure()
        assert slot.holder is not None
        netns = {"name": name, "path": f"/run/netns/{name}", "pid": f"pid:{slot.holder.pid}"}
        self.serial += 1
        options: dict[str, Variant] = {"owner": Variant("s", f"soak/{self.name}")}
        if args["kind"] == "nodev":
            options["netdev"] = Variant("b", False)
        else:
            options["ifname"] = Variant("s", f"{self.name}x{self.serial}")
            if args["kind"] == "shared":
                options["shared"] = Variant("b", True)
            if args["mtu"]:
                options["mtu"] = Variant("u", args["mtu"])
        if args["form"] == FD_FORM:
            try:
                fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
            except FileNotFoundError:  # the reaper deleted it since
                return "netns-gone"
            try:
                (path,) = await client.call_raw(
                    BUS_NAME,
                    MANAGER_PATH,
                    MANAGER_IFACE,
                    "ClaimFd",
                    "sha{sv}",
                    [args["device"], 0, options],
                    unix_fds=[fd],
                )
            finally:
                os.close(fd)
        else:
            path = await client.manager(
                "Claim", "ssa{sv}", args["device"], netns[args["form"]], options
            )
        return f"ok-{args['form']} {str(path).rsplit('/', 1)[1]}"

    async def release(self, client: Client, args: dict[str, Any]) -> str:
        if args["via"] == "manager":
            await client.manager("Release", "s", args["claim"])
        else:
            path = f"/io/rdmad1/claim/{args['claim']}"
            await client.call_raw(BUS_NAME, path, "io.rdmad1.Claim", "Release")
        return "ok"


def present(netns: str) -> str:
    """The netns's name while it exists, else "" (a runtime passes no netns it lost)."""
    return netns if os.path.exists(f"/run/netns/{netns}") else ""


@dataclass
class Attachment:
    node: str
    container: str
    ifname: str
    netns: str
    conf: dict[str, Any]
    result: dict[str, Any]


class CniActor:
    def __init__(self, name: str, world: World, cni_path: str) -> None:
        self.name = name
        self.world = world
        self.cni_path = cni_path
        self.live: list[Attachment] = []
        self.serial = 0
        self.detail = ""  # the last failure's error object and stderr

    def conf(self, node: Node, **keys: Any) -> dict[str, Any]:
        """The network config; its route's destination is the attachment's own (two
        attachments with one route in one netns: the second route exists already)."""
        index = sorted(self.world.nodes).index(node.name)
        subnet = f"10.{77 + index}.{int(self.name[3:])}.0/24"
        return {
            "cniVersion": "1.0.0",
            "name": f"soak-{self.name}-{node.name}",
            "type": "rdmad",
            "busAddress": node.bus.address,
            "ipam": {
                "type": "host-local",
                "subnet": subnet,
                "routes": [{"dst": f"10.{90 + index}.{self.serial % 250}.0/24"}],
                "dataDir": str(self.world.workdir / "ipam"),
            },
            **keys,
        }

    async def run(
        self, verb: str, conf: dict[str, Any], netns: str, container: str, ifname: str
    ) -> Any:
        return await asyncio.to_thread(
            run_plugin,
            verb,
            conf,
            self.cni_path,
            netns,
            container,
            ifname,
            timeout=PLUGIN_S * self.world.clock.pace,
        )

    def result_of(self, done: Any) -> str:
        if done.code == 0:
            return "ok"
        self.detail = f"{done.out} {done.stderr.strip()}"
        return f"error-{(done.out or {}).get('code', done.code)}"

    async def do(self, action: Action) -> None:
        node = self.world.nodes[action.args["node"]]
        verbs = {"add": self.add, "check": self.check, "del": self.delete, "gc": self.gc}
        self.detail = ""
        result = await verbs[action.op](node, action.args)
        self.world.tally.count(self.name, action.op, result, self.detail)

    def mine(self, node: Node) -> list[Attachment]:
        return [a for a in self.live if a.node == node.name]

    async def add(self, node: Node, args: dict[str, Any]) -> str:
        netns = await self.world.slots[args["slot"]].ensure()
        self.serial += 1
        container, ifname = f"soak{self.name}x{self.serial}", f"{self.name}c{self.serial}"
        conf = self.conf(node, device=args["device"], shared=args["shared"])
        done = await self.run("ADD", conf, netns, container, ifname)
        if done.code == 0:
            self.live.append(Attachment(node.name, container, ifname, netns, conf, done.out))
        return self.result_of(done)

    async def check(self, node: Node, args: dict[str, Any]) -> str:
        mine = self.mine(node)
        if not mine:
            return "nothing-attached"
        a = mine[args["pick"] % len(mine)]
        netns = present(a.netns)
        if not netns:
            return "netns-gone"
        done = await self.run(
            "CHECK", a.conf | {"prevResult": a.result}, netns, a.container, a.ifname
        )
        return self.result_of(done)

    async def delete(self, node: Node, args: dict[str, Any]) -> str:
        mine = self.mine(node)
        if not mine:
            return "nothing-attached"
        a = mine[args["pick"] % len(mine)]
        netns = present(a.netns)
        done = await self.run("DEL", a.conf, netns, a.container, a.ifname)
        if done.code == 0:
            self.live.remove(a)
        return self.result_of(done)

    async def gc(self, node: Node, args: dict[str, Any]) -> str:
        """GC with one attachment left out of the valid ones: GC must end its claim."""
        mine = self.mine(node)
        dropped = mine[args["pick"] % len(mine)] if mine else None
        valid = [{"containerID": a.container, "ifname": a.ifname} for a in mine if a is not dropped]
        # GC is a 1.1.0 verb, and Debian's host-local speaks up to 1.0.0: the GC goes
        # without IPAM (the dropped attachment's lease stays in host-local's dataDir)
        conf = self.conf(node) | {"cniVersion": "1.1.0", "cni.dev/valid-attachments": valid}
        del conf["ipam"]
        done = await self.run("GC", conf, "", "gc", "gc")
        if done.code == 0 and dropped is not None:
            self.live.remove(dropped)
        return self.result_of(done)


class PodmanActor:
    """Containers on the shared node's rdmad network: shared claims of its last device,
    which no other actor claims (a whole claim of it would refuse every container)."""

    def __init__(self, world: World, podman: Podman) -> None:
        self.world = world
        self.podman = podman
        self.serial = 0
        self.running: list[str] = []
        self.killed: list[str] = []
        self.detail = ""  # the last failure's stderr
        node = world.nodes["shared"]
        podman.add_network(
            "soakrdma",
            {
                "type": "rdmad",
                "busAddress": node.bus.address,
                "shared": True,
                "device": PODMAN_DEVICE,
                "ipam": {
                    "type": "host-local",
                    "subnet": "10.88.99.0/24",
                    "dataDir": str(world.workdir / "ipam"),
                },
            },
        )

    async def call(self, *args: str) -> str:
        try:
            await asyncio.to_thread(self.podman, *args)
            return "ok"
        except AssertionError as exc:
            self.detail = str(exc)
            return "error"

    async def do(self, action: Action) -> None:
        self.detail = ""
        result = await getattr(self, action.op)(action.args["pick"])
        self.world.tally.count("podman", action.op, result, self.detail)

    async def run(self, _pick: int) -> str:
        self.serial += 1
        name = f"soakc{self.serial}"
        flags = ["run", "-d", *self.podman.run_flags, "--name", name, "--network", "soakrdma"]
        result = await self.call(*flags, "--rootfs", str(self.podman.rootfs), "sleep", "600")
        if result == "ok":
            self.running.append(name)
        else:
            await self.call("rm", "-f", "-t", "0", name)
        return result

    async def rm(self, pick: int) -> str:
        gone = self.running + self.killed
        if not gone:
            return "nothing-running"
        name = gone[pick % len(gone)]
        result = await self.call("rm", "-f", "-t", "0", name)
        for group in (self.running, self.killed):
            if name in group:
                group.remove(name)
        return result

    async def kill(self, pick: int) -> str:
        """kill -9 of the container's process; the next rm of it removes what is left."""
        if not self.running:
            return "nothing-running"
        name = self.running.pop(pick % len(self.running))
        self.killed.append(name)
        try:
            pid = int(
                (
                    await asyncio.to_thread(
                        self.podman, "inspect", "--format", "{{.State.Pid}}", name
                    )
                ).strip()
            )
            os.kill(pid, signal.SIGKILL)
        except (AssertionError, ValueError, ProcessLookupError) as exc:
            return f"error:{type(exc).__name__}"
        return "ok"


class Scraper:
    def __init__(self, world: World) -> None:
        self.world = world

    async def do(self, action: Action) -> None:
        node = self.world.nodes[action.args["node"]]
        exporter = node.exporter
        assert exporter is not None
        was_up = node.up.is_set()
        if was_up:  # an rdmad still starting has not its size yet
            node.sample(self.world.clock.now())
        detail = ""
        try:
            samples = await exporter.scrape()
            if samples.get(("rdmad_up", ()), 0.0) == 1.0:
                result = "up"
            else:  # whether rdmad was up (ready, not restarting) all the scrape long
                result = "rdmad_up-0 " + ("rdmad-up" if was_up and node.up.is_set() else "restart")
                detail = exporter.log[-1] if exporter.log else ""
        except (OSError, AssertionError) as exc:
            result = f"failed:{type(exc).__name__}"
            node.problems.append(f"exporter ({node.name}) scrape failed: {exc!r}")
        self.world.tally.count("scraper", "scrape", result, detail)


class PodActor(BusUser):
    """Multi-rail pods over the bus: 2-4 claims into one netns, one pod CDI name, and policy
    routing (a table rdmad picks, addresses, an on-link route and a default route via a
    gateway per rail); released together, or ended by the death of their netns."""

    def __init__(self, world: World) -> None:
        super().__init__("pods", world)
        self.pods: list[Pod] = []

    async def do(self, action: Action) -> None:
        self.detail = ""
        node = self.world.nodes[action.args["node"]]
        ops = {"start": self.start, "release": self.release_pod, "kill": self.kill}
        self.count(action.op, await ops[action.op](node, action.args))

    def options(self, node: Node, pod: Pod, rail: int, shared: bool, routing: bool) -> Any:
        index = sorted(self.world.nodes).index(node.name)
        net = f"10.{110 + index}.{rail}"
        options: dict[str, Variant] = {
            "owner": Variant("s", f"soak/pods/{pod.serial}"),
            "ifname": Variant("s", f"p{pod.serial}r{rail}"),
            "pod_cdi_name": Variant("s", f"soakpod{pod.serial}"),
            "addresses": Variant("as", [f"{net}.{pod.serial % 250 + 2}/24"]),
        }
        if shared:
            options["shared"] = Variant("b", True)
        if routing:
            options["table"] = Variant("u", 0)
            routes = [f"10.{120 + index}.{rail}.0/24", f"0.0.0.0/0,via={net}.1"]
            options["routes"] = Variant("as", routes)
        return options

    async def start(self, node: Node, args: dict[str, Any]) -> str:
        """Every rail claimed in turn; a rail refused leaves the others (a partial pod is
        the runtime's to end, and this one ends it like any other)."""
        netns = await self.world.slots[args["slot"]].ensure()
        self.serial += 1
        pod = Pod(node.name, self.serial, [], args["slot"])
        results = []
        for rail, (device, shared) in enumerate(zip(args["devices"], args["shared"], strict=True)):
            options = self.options(node, pod, rail, shared, args["routing"])
            result, path = await self.call(node, "Claim", "ssa{sv}", device, netns, options)
            results.append(result)
            if path is not None:
                claim_id = str(path).rsplit("/", 1)[1]
                pod.claims.append(claim_id)
                self.world.tally.ack(node.name, claim_id)
        if pod.claims:
            self.pods.append(pod)
        ok = results.count("ok")
        return "ok" if ok == len(results) else f"{ok}-of-{len(results)}"

    def pick(self, node: Node, pick: int) -> Pod | None:
        mine = [p for p in self.pods if p.node == node.name]
        return mine[pick % len(mine)] if mine else None

    async def release_pod(self, node: Node, args: dict[str, Any]) -> str:
        pod = self.pick(node, args["pick"])
        if pod is None:
            return "no-pod"
        self.pods.remove(pod)
        return await self.release_all(node, pod.claims)

    async def kill(self, node: Node, args: dict[str, Any]) -> str:
        """The pod's netns deleted and its last process killed (whatever else is in it)."""
        pod = self.pick(node, args["pick"])
        if pod is None:
            return "no-pod"
        self.pods.remove(pod)
        assert pod.slot is not None
        return "netns-deleted" if await self.world.slots[pod.slot].delete() else "netns-gone"


class HoldActor(BusUser):
    """DRA-style pods: Manager.Hold of 1-2 devices for a pod UID (as rdmad-dra's prepare),
    then the pod comes (rdmad-cni ADD in pod mode, chained, with K8S_POD_UID; or
    Manager.Attach, as the plugin calls it) or never does; unprepare ends it (CNI DEL if it
    came through rdmad-cni, then Release of each hold, as rdmad-dra's unprepare)."""

    def __init__(self, world: World, cni_path: str) -> None:
        super().__init__("holds", world)
        self.cni_path = cni_path
        self.pods: list[Pod] = []

    async def do(self, action: Action) -> None:
        self.detail = ""
        node = self.world.nodes[action.args["node"]]
        ops = {"hold": self.hold, "come": self.come, "unprepare": self.unprepare}
        result = await ops[action.op](node, action.args)
        op = f"come-{action.args['via']}" if action.op == "come" else action.op
        self.count(op, result)

    def uid(self, pod: Pod) -> str:
        return f"soak-{os.getpid()}-{pod.serial}"

    async def hold(self, node: Node, args: dict[str, Any]) -> str:
        self.serial += 1
        pod = Pod(node.name, self.serial, [])
        results = []
        for rail, (device, shared) in enumerate(zip(args["devices"], args["shared"], strict=True)):
            options: dict[str, Variant] = {
                "owner": Variant("s", f"dra/soak-{pod.serial}"),
                "ifname": Variant("s", f"h{pod.serial}r{rail}"),
                "shared": Variant("b", shared),
            }
            result, path = await self.call(node, "Hold", "ssa{sv}", device, self.uid(pod), options)
            results.append(result)
            if path is not None:
                claim_id = str(path).rsplit("/", 1)[1]
                pod.claims.append(claim_id)
                self.world.tally.ack(node.name, claim_id)
        if pod.claims:
            self.pods.append(pod)
        ok = results.count("ok")
        return "ok" if ok == len(results) else f"{ok}-of-{len(results)}"

    def pick(self, node: Node, pick: int, came: bool | None = None) -> Pod | None:
        mine = [
            p for p in self.pods if p.node == node.name and (came is None or bool(p.via) == came)
        ]
        return mine[pick % len(mine)] if mine else None

    def conf(self, node: Node) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": f"soak-holds-{node.name}",
            "type": "rdmad",
            "busAddress": node.bus.address,
            "pod": True,
            "prevResult": POD_PRIMARY,
        }

    def cni_args(self, pod: Pod) -> str:
        return f"IgnoreUnknown=1;K8S_POD_NAMESPACE=soak;K8S_POD_NAME=p{pod.serial};" + (
            f"K8S_POD_UID={self.uid(pod)}"
        )

    async def come(self, node: Node, args: dict[str, Any]) -> str:
        pod = self.pick(node, args["pick"], came=False)
        if pod is None:
            return "nothing-held"
        netns = await self.world.slots[args["slot"]].ensure()
        pod.slot, pod.via = args["slot"], args["via"]
        if pod.via == "attach":
            result, _paths = await self.call(node, "Attach", "ssa{sv}", self.uid(pod), netns, {})
            return result
        pod.container = f"soakhold{pod.serial}"
        done = await self.pod_cni("ADD", node, netns, pod)
        if done.code != 0:
            self.detail = f"{done.out} {done.stderr.strip()}"
            return f"error-{(done.out or {}).get('code', done.code)}"
        return "ok"

    async def pod_cni(self, command: str, node: Node, netns: str, pod: Pod) -> Outcome:
        """rdmad-cni in pod mode, as the runtime runs it for the pod's sandbox."""
        return await asyncio.to_thread(
            run_plugin,
            command,
            self.conf(node),
            self.cni_path,
            netns,
            pod.container,
            "eth0",
            self.cni_args(pod),
            timeout=PLUGIN_S * self.world.clock.pace,
        )

    async def unprepare(self, node: Node, args: dict[str, Any]) -> str:
        pod = self.pick(node, args["pick"])
        if pod is None:
            return "nothing-held"
        self.pods.remove(pod)
        prefix = "held-" if not pod.via else ""
        if pod.via == "cni" and pod.slot is not None:
            netns = present(self.world.slots[pod.slot].name)
            done = await self.pod_cni("DEL", node, netns, pod)
            if done.code != 0:
                self.detail = f"DEL: {done.out} {done.stderr.strip()}"
                return f"del-error-{(done.out or {}).get('code', done.code)}"
        # DEL and the netns's death bring the device home and keep the hold: Release ends it
        # (NoSuchClaim if the device's removal ended it first).
        return prefix + await self.release_all(node, pod.claims)
