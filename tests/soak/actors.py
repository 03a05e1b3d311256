"""The soak's actors: what runtimes and operators do to a node, one action at a time as the
schedule releases it. Each records every outcome in the tally; a refusal from rdmad (busy
device, netns gone, rdmad restarting) is an outcome, not a failure: the invariants judge.

- BusClaimer: Claim and Release over the bus, as a runtime's D-Bus client: whole device,
  shared, netdev=false, into a netns named by name, by path or by pid:PID.
- CniActor: rdmad-cni ADD, CHECK (with ADD's result as prevResult), DEL and GC, with the
  environment and stdin a runtime gives it.
- PodmanActor: the real podman: run, rm -f, kill -9 of the container's process.
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

from tests.cni.conftest import run_plugin
from tests.cni.podman import Podman
from tests.soak.clock import Clock
from tests.soak.node import Node, Slot
from tests.soak.schedule import DEVICES, Action
from tests.support.daemon import BUS_NAME, Client, DBusCallError

CALL_TIMEOUT = 40.0  # longer than any fault's window: an unanswered call is an outcome


@dataclass
class Tally:
    outcomes: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # kind, op, result
    acks: dict[str, dict[str, float]] = field(default_factory=dict)  # node -> claim id -> when
    details: dict[tuple[str, str, str], str] = field(default_factory=dict)  # the first of each

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


def outcome_of(exc: BaseException) -> str:
    if isinstance(exc, DBusCallError):
        return exc.name.rsplit(".", 1)[-1]
    if isinstance(exc, TimeoutError):
        return "no-answer"
    return f"bus-error:{type(exc).__name__}"


class BusClaimer:
    def __init__(self, name: str, world: World) -> None:
        self.name = name
        self.world = world
        self.clients: dict[str, Client] = {}
        self.held: dict[str, list[str]] = {}  # node -> the ids of the claims it made there
        self.serial = 0

    async def client(self, node: Node) -> Client:
        if node.name not in self.clients or not self.clients[node.name].bus.connected:
            self.clients[node.name] = await Client.connect(node.bus.address, signals=False)
        return self.clients[node.name]

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
        except (DBusCallError, TimeoutError, OSError, EOFError, ConnectionError) as exc:
            result, detail = outcome_of(exc), str(exc)
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

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


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
            run_plugin, verb, conf, self.cni_path, netns, container, ifname
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
        done = await self.run(
            "GC", self.conf(node) | {"cni.dev/valid-attachments": valid}, "", "gc", "gc"
        )
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
                "device": f"sim{DEVICES - 1}",
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
        assert node.exporter is not None
        node.sample(self.world.clock.now())
        try:
            samples = await node.exporter.scrape()
            up = samples.get(("rdmad_up", ()), 0.0)
            result = "up" if up == 1.0 else "rdmad_up-0"
        except (OSError, AssertionError) as exc:
            result = f"failed:{type(exc).__name__}"
            node.problems.append(f"exporter ({node.name}) scrape failed: {exc!r}")
        self.world.tally.count("scraper", "scrape", result)
