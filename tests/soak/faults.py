"""The soak's faults, one at a time per node (the schedule spaces them), and the netns
reaper. A fault with a window (SIGSTOP, a full disk) holds it on the soak's clock; a fault
that ends rdmad (SIGKILL, the bus restarted) is over when the supervisor has it back.

- sigkill: SIGKILL of rdmad; the supervisor restarts it (as systemd would).
- sigstop: SIGSTOP for the window, then SIGCONT.
- bus-restart: the node's dbus-daemon stopped and started on the same socket; rdmad exits
  3 (EXIT_BUS) for its restart, rdmactl monitor ends with 3 and is started again.
- netlink-flood: rdmad stopped while 300 netdevs are added and deleted (as
  tests/reliability/test_overrun.py), its rtnetlink socket's buffer 4096 bytes, so that it
  overruns; the outcome says whether rdmad logged the overrun.
- disk-full: the state dir's tmpfs filled for the window, then freed.
- delete-netns: a slot's netns deleted and its last process killed, as a pod's netns dies,
  whatever claims are in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

from rdmad.daemon.main import EXIT_BUS
from testbed.net import eventually, ip_json
from tests.reliability.test_overrun import OVERRUN, burst
from tests.reliability.test_state_file import fill
from tests.soak.actors import World
from tests.soak.node import Node
from tests.soak.schedule import Action

FLOOD = 300


class FaultActor:
    def __init__(self, world: World) -> None:
        self.world = world
        self.log_read: dict[str, int] = {}  # node -> how far its log was read

    async def do(self, action: Action) -> None:
        node = self.world.nodes[action.args["node"]]
        if node.pid is None:
            result = "rdmad-down"  # still restarting from the previous fault
        else:
            kinds = {
                "sigkill": self.sigkill,
                "sigstop": self.sigstop,
                "bus-restart": self.bus_restart,
                "netlink-flood": self.flood,
                "disk-full": self.disk_full,
            }
            result = await kinds[action.op](node, action)
        self.world.tally.count("fault", action.op, result)

    async def restarted(self, node: Node, exits_before: int) -> str:
        async with asyncio.timeout(node.restart_wait):
            while len(node.exits) == exits_before or not node.up.is_set():  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # the supervisor's restart: nothing announces it
        return "restarted"

    async def sigkill(self, node: Node, _action: Action) -> str:
        before = len(node.exits)
        node.expected_exits.append(-signal.SIGKILL)
        assert node.pid is not None
        os.kill(node.pid, signal.SIGKILL)
        return await self.restarted(node, before)

    async def sigstop(self, node: Node, action: Action) -> str:
        pid = node.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            await self.world.clock.until(action.at + action.args["hold"])
        finally:
            with contextlib.suppress(ProcessLookupError):  # it died while stopped
                os.kill(pid, signal.SIGCONT)
        return "stopped-continued"

    async def bus_restart(self, node: Node, _action: Action) -> str:
        before = len(node.exits)
        node.expected_exits.append(EXIT_BUS)
        await node.bus.restart()
        return await self.restarted(node, before)

    def new_overruns(self, node: Node) -> int:
        assert node.daemon.log_path is not None
        with open(node.daemon.log_path, "rb") as f:
            f.seek(self.log_read.get(node.name, 0))
            text = f.read()
            self.log_read[node.name] = f.tell()
        return text.decode(errors="replace").count(OVERRUN)

    async def flood(self, node: Node, _action: Action) -> str:
        self.new_overruns(node)
        pid = node.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.to_thread(burst, FLOOD)
        finally:
            with contextlib.suppress(ProcessLookupError):  # it died while stopped
                os.kill(pid, signal.SIGCONT)
        seen = 0

        def logged() -> bool:
            nonlocal seen
            seen += self.new_overruns(node)
            return seen > 0

        try:
            await eventually(logged, 20, "rdmad to log the overrun")
        except TimeoutError:
            return "no-overrun-logged"
        return "overran-resynced"

    async def disk_full(self, node: Node, action: Action) -> str:
        filler = await asyncio.to_thread(fill, node.daemon.state_dir)
        node.disk_full = True
        try:
            await self.world.clock.until(action.at + action.args["hold"])
        finally:
            filler.unlink()
            node.disk_full = False
        return "filled-freed"


class NetnsReaper:
    def __init__(self, world: World) -> None:
        self.world = world

    async def do(self, action: Action) -> None:
        slot = self.world.slots[action.args["slot"]]
        links: list[dict[str, Any]] = []
        if slot.alive():
            try:
                links = await asyncio.to_thread(ip_json, "link", "show", netns=slot.name)
            except RuntimeError:
                links = []
        held = sum(1 for x in links if x.get("ifname") != "lo")
        deleted = await slot.delete()
        result = "absent" if not deleted else ("under-claims" if held else "empty")
        self.world.tally.count("fault", "delete-netns", result)
