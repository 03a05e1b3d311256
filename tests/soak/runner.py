"""The chaos soak: `python -m tests.soak.runner --seconds 600 [--seed N]` (as root; `make
soak SOAK_SECONDS=600 SOAK_SEED=N`).

It generates the schedule from the seed (printed first, so any run can be replayed), starts
the two nodes (tests/soak/node.py), plays every actor's actions concurrently on the soak's
clock, and at each of the checker's times stops the world (no action in flight, every fault
window closed, every rdmad back up) and checks the invariants (tests/soak/invariants.py),
once more at the end. A violation stops the soak and prints the seed, the schedule and the
state; the exit status is then 1 (with --keep-going it records the violation, plays the
schedule out for the figures, and exits 1 at the end). At the end it prints the figures:
operations and faults of each kind and their outcomes, checks passed, rdmad's RSS and fds.

With --rxe MODE (in the RDMA guest: `make soak-guest`) the world is one node in that RDMA
netns mode, rdmad on its kernel backend over real rxe devices; the same seed's schedule is
played but for the other node's actions (and podman's, unless the node is shared), and
rdmad-dra runs without its SIGKILL fault, which the host soak plays.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.daemon import Client
from testbed.net import ip
from testbed.threads import kernel_report
from tests.cni.conftest import cni_path
from tests.cni.podman import BUSYBOX, Podman
from tests.soak.actors import (
    BusClaimer,
    CniActor,
    HoldActor,
    PodActor,
    PodmanActor,
    Scraper,
    Tally,
    World,
)
from tests.soak.clock import Clock
from tests.soak.dra import (
    START_S,
    DraActor,
    DraPlugin,
    PluginKiller,
    running_dra,
    running_kubelet,
    slices_settled,
)
from tests.soak.faults import FaultActor, NetnsReaper
from tests.soak.invariants import Verdict, growth, rules, settled
from tests.soak.node import Node, Slot, running_node
from tests.soak.schedule import NODES, SLOTS, Action, Schedule, generate
from tests.soak.stalls import STALL_S, stalls, watched_loop


class Violation(Exception):
    pass


@dataclass
class Result:
    schedule: Schedule
    tally: Tally
    checks: int = 0
    failed: dict[str, float] = field(default_factory=dict)  # --keep-going: problem -> when
    last: dict[str, Verdict] = field(default_factory=dict)
    growth: list[str] = field(default_factory=list)
    wall: float = 0.0
    podman: bool = False
    played: int = 0  # the schedule's actions of the actors and nodes that exist
    nodes: str = "both nodes"
    stalls: str = ""  # the stacks of the soak's own loop when it stalled (tests/soak/stalls.py)

    def summary(self) -> str:
        lines = [
            f"soak: seed {self.schedule.seed}, {self.schedule.seconds:g} s of schedule in "
            f"{self.wall:.0f} s of wall time, {self.played} actions played "
            f"(of {len(self.schedule.actions)}), podman {'on' if self.podman else 'not run'}",
            f"invariant checks passed: {self.checks} (each over {self.nodes})",
        ]
        if self.failed:
            lines.append(f"VIOLATIONS ({len(self.failed)}, each at its first failed check):")
            lines += [f"  [{t:7.1f} s] {p}" for p, t in self.failed.items()]
        by_op: dict[tuple[str, str], Counter[str]] = {}
        for (kind, op, result), n in self.tally.outcomes.items():
            by_op.setdefault((kind, op), Counter())[result] += n
        for (kind, op), results in sorted(by_op.items()):
            detail = ", ".join(f"{r} {n}" for r, n in results.most_common())
            lines.append(f"  {kind:<8} {op:<16} {sum(results.values()):5d}: {detail}")
        lines.append(
            "  most seconds an action started after its time, by actor: "
            + ", ".join(f"{k} {v:.1f}" for k, v in sorted(self.tally.behind.items()))
        )
        lines.append("  the first message of each refusal or failure:")
        for (kind, op, result), detail in sorted(self.tally.details.items()):
            lines.append(f"    {kind} {op} {result}: {' '.join(detail.split())[:240]}")
        for name, verdict in sorted(self.last.items()):
            figures = ", ".join(f"{k} {v}" for k, v in sorted(verdict.figures.items()))
            lines.append(f"  final state {name}: {figures}")
        lines += [f"  {g}" for g in self.growth]
        if self.stalls:
            lines.append(f"the soak's own event loop stalled {STALL_S:g} s or more:")
            lines += [f"  {x}" for x in self.stalls.splitlines()]
        return "\n".join(lines)


def has_podman() -> bool:
    return all(shutil.which(t) for t in ("podman", "runc")) and BUSYBOX.exists()


@contextlib.asynccontextmanager
async def podman_home(guest: bool) -> AsyncIterator[Podman]:
    # podman refuses a runroot path longer than 50 characters: a short temp dir.
    home = Path(tempfile.mkdtemp(prefix="rdmad-spm-"))
    # The 7.3 guest runs crun without cgroups (tests/guest/test_podman_cni.py: runc died there).
    pm = Podman(home, "crun", ("--cgroups=disabled",)) if guest else Podman(home)
    pm.setup()
    try:
        yield pm
    finally:
        await asyncio.to_thread(pm.cleanup)
        shutil.rmtree(home, ignore_errors=True)


def on_nodes(actions: list[Action], nodes: Collection[str]) -> list[Action]:
    """The actions for nodes that exist (an action without a node picks among its own)."""
    return [a for a in actions if "node" not in a.args or a.args["node"] in nodes]


def replay(seconds: float, seed: int, rxe: str | None, pace: float) -> str:
    target = "soak" if rxe is None else f"soak-guest SOAK_MODE={rxe}"
    return f"make {target} SOAK_SECONDS={seconds:g} SOAK_SEED={seed} SOAK_PACE={pace:g}"


async def play(
    actions: list[Action], do: Callable[[Action], Awaitable[None]], world: World
) -> None:
    """An actor: each action at its time, once the gate is open; an exception an actor did
    not expect stops the soak."""
    clock = world.clock
    for action in actions:
        await clock.until(action.at)
        async with clock.acting():
            world.tally.started(action.actor, clock.now() - action.at)
            try:
                await do(action)
            except Exception as exc:
                raise Violation(f"{action.line()}: the actor failed: {exc!r}") from exc


async def check(
    world: World,
    plugins: dict[str, DraPlugin],
    init_rules: object,
    result: Result,
    keep_going: bool,
) -> None:
    for node in world.nodes.values():
        async with asyncio.timeout(node.restart_wait):
            await node.up.wait()
    result.last = await settled(world.nodes, world.slots, init_rules, world.tally.acks)
    result.last |= await slices_settled(plugins)
    problems = [f"{n}: {p}" for n, v in result.last.items() for p in v.problems]
    if problems and not keep_going:
        raise Violation("\n".join(problems))
    if problems:
        for problem in problems:
            result.failed.setdefault(problem, world.clock.now())
        print(f"[{world.clock.now():7.1f} s] check FAILED:\n  " + "\n  ".join(problems))
        return
    result.checks += 1
    print(
        f"[{world.clock.now():7.1f} s] check {result.checks} passed: "
        + "; ".join(
            f"{n} listed {v.figures['listed']} destroyed {v.figures['destroyed']}"
            for n, v in sorted(result.last.items())
            if n in world.nodes
        ),
        flush=True,
    )


async def checker(
    actions: list[Action],
    world: World,
    plugins: dict[str, DraPlugin],
    init_rules: object,
    result: Result,
    keep_going: bool,
) -> None:
    for action in actions:
        await world.clock.until(action.at)
        async with world.clock.quiescent():
            await check(world, plugins, init_rules, result, keep_going)


async def state_of(world: World) -> str:
    """What a replay needs to compare against: each node's claims and devices, the slots'
    links, the tail of each rdmad's log and what each of its threads waits on."""
    out = []
    for name, node in world.nodes.items():
        out.append(
            f"== node {name}: rdmad pid {node.pid}, exits {node.exits}, log {node.daemon.log_path}"
        )
        try:
            client = await Client.connect(node.bus.address, signals=False)
            try:
                out += [f"  device {d}" for d in await client.manager("ListDevices")]
                out += [f"  claim {c}" for c in await client.manager("ListClaims")]
            finally:
                client.close()
        except Exception as exc:  # the state is printed whatever broke
            out.append(f"  (bus unreadable: {exc!r})")
        out.append(f"  veths: { {d: dev.pair for d, dev in node.devices.items()} }")
        out += ["  | " + line for line in node.daemon.log().splitlines()[-30:]]
        # what each rdmad thread waits on: a worker stuck in setns() or a mount differs
        # there from one idle on its queue (a guest run's stall, docs/reliability.md)
        if node.pid is not None:
            out += [f"  rdmad {line}" for line in kernel_report(node.pid)]
        bus_log = node.bus.log_path.read_text(errors="replace").splitlines()
        out += [f"  dbus-daemon: {line}" for line in bus_log[-10:]]
        if node.exporter is not None:
            out += [f"  exporter: {line}" for line in node.exporter.log[-10:]]
    for slot in world.slots:
        if slot.alive():
            out.append(
                f"== netns {slot.name}: "
                + ip("-br", "link", netns=slot.name, check=False).replace("\n", "; ")
            )
    return "\n".join(out)


async def soak(
    seconds: float,
    seed: int,
    workdir: Path,
    podman: bool,
    keep_going: bool = False,
    rxe: str | None = None,
    pace: float = 1.0,
) -> Result:
    """`rxe`: one node in that mode on real rxe devices (the guest), or None: the two sim nodes;
    `pace`: wall seconds per soak second (tests/soak/clock.py)."""
    schedule = generate(seed, seconds, podman)
    names = [rxe] if rxe else sorted(NODES)
    podman = podman and "shared" in names  # its network is the shared node's
    tally = Tally()
    result = Result(schedule, tally, podman=podman)
    if rxe:
        result.nodes = f"the {rxe} node"
    started = time.monotonic()
    init_rules = (rules(4), rules(6))
    slots = [Slot(i) for i in range(SLOTS)]
    stall_log = workdir / "stalls.txt"
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(watched_loop(stall_log))
        stack.callback(lambda: setattr(result, "stalls", stalls(stall_log)))
        nodes: dict[str, Node] = {}
        for index, name in enumerate(names):
            nodes[name] = await stack.enter_async_context(
                running_node(name, index, workdir / name, rxe is not None)
            )
        world = World(nodes, slots, tally, Clock(pace), workdir)
        # In the guest, rdmad-dra's start (grpc, the kubernetes client, under TCG) takes
        # minutes: it gets `pace` times the host's allowance.
        plugins = {
            n: await stack.enter_async_context(running_dra(nodes[n], START_S * pace)) for n in nodes
        }
        for slot in slots:
            stack.push_async_callback(slot.close)
        bus = {a: BusClaimer(a, world) for a in schedule.actors() if a.startswith("bus")}
        for claimer in bus.values():
            stack.callback(claimer.close)
        path = cni_path()
        cni = {a: CniActor(a, world, path) for a in schedule.actors() if a.startswith("cni")}
        kubelet = await stack.enter_async_context(running_kubelet(pace))
        pods, holds = PodActor(world), HoldActor(world, path)
        dra = DraActor(world, path, plugins, kubelet)
        for user in (pods, holds, dra):
            stack.callback(user.close)
        faults, reaper, scraper = FaultActor(world), NetnsReaper(world), Scraper(world)
        players: dict[str, Callable[[Action], Awaitable[None]]] = {
            **{a: b.do for a, b in bus.items()},
            **{a: c.do for a, c in cni.items()},
            **{f"faults-{n}": faults.do for n in nodes},
            "netns-reaper": reaper.do,
            "scraper": scraper.do,
            "pods": pods.do,
            "holds": holds.do,
        }
        players["dra"] = dra.do
        if not rxe:  # in the guest a SIGKILL every 40-100 s would keep the plugin down
            players["faults-dra"] = PluginKiller(world, plugins).do
        if podman:
            pm = await stack.enter_async_context(podman_home(rxe is not None))
            players["podman"] = PodmanActor(world, pm).do
        print(f"soak: {len(schedule.actions)} actions for {len(players) + 1} actors", flush=True)
        mine = {actor: on_nodes(schedule.of(actor), nodes) for actor in [*players, "checker"]}
        result.played = sum(len(actions) for actions in mine.values())
        print(f"soak: the actors start after {world.clock.now():.1f} s of setup", flush=True)
        world.clock.start()
        tasks = [
            asyncio.ensure_future(play(mine[actor], do, world)) for actor, do in players.items()
        ]
        tasks.append(
            asyncio.ensure_future(
                checker(mine["checker"], world, plugins, init_rules, result, keep_going)
            )
        )
        try:
            await asyncio.gather(*tasks)
            async with world.clock.quiescent():
                await check(world, plugins, init_rules, result, keep_going)
        except Exception as exc:  # a Violation, or the soak's own failure: stop all, report
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            state = await state_of(world)
            what = "INVARIANT VIOLATED" if isinstance(exc, Violation) else "SOAK FAILED"
            raise Violation(
                f"{what} at soak time {world.clock.now():.1f} s:\n{str(exc) or repr(exc)}\n\n"
                f"seed {seed}; replay: {replay(seconds, seed, rxe, pace)}\n\n"
                f"== state\n{state}\n\n== the soak's loop stalled\n{stalls(stall_log)}\n\n"
                f"== schedule\n{schedule.dump()}"
            ) from None
        problems = []
        for node in nodes.values():
            line, grown = growth(node, seconds)
            result.growth.append(line)
            problems += grown
        result.wall = time.monotonic() - started
        if problems:
            raise Violation("\n".join(problems) + f"\n\nseed {seed}\n{schedule.dump()}")
    return result


async def stoppable(run: Coroutine[Any, Any, Result]) -> Result:
    """The soak, cancelled (so that everything it made is taken down) on SIGTERM or SIGINT;
    SIGINT too, as a background shell may have left it ignored."""
    task = asyncio.ensure_future(run)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    return await task


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.runner", description=__doc__)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--no-podman", action="store_true", help="leave the podman actor out")
    parser.add_argument(
        "--pace",
        type=float,
        default=1.0,
        help="wall seconds per second of schedule (the guest's: an emulated CPU's pace)",
    )
    parser.add_argument(
        "--rxe",
        choices=[*sorted(NODES), "seed"],
        help="in the RDMA guest: one node in this RDMA netns mode (seed: chosen by the seed) "
        "on rdmad's kernel backend over real rxe devices",
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="record a violation and play the schedule out (for the figures); exit 1 at the end",
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("the soak needs root (netns, veths, tmpfs)", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    podman = not args.no_podman and has_podman()
    rxe = sorted(NODES)[seed % len(NODES)] if args.rxe == "seed" else args.rxe
    where = f"one {rxe} node on real rxe devices" if rxe else "two sim nodes"
    print(
        f"soak: seed {seed}, {args.seconds:g} s, {where} "
        f"(replay: {replay(args.seconds, seed, rxe, args.pace)})",
        flush=True,
    )
    workdir = Path(tempfile.mkdtemp(prefix="rdmad-soak-"))
    run = soak(args.seconds, seed, workdir, podman, args.keep_going, rxe, args.pace)
    try:
        result = asyncio.run(stoppable(run))
    except Violation as exc:
        print(exc, flush=True)
        print(f"logs kept in {workdir}")
        return 1
    print(result.summary())
    if result.failed:
        (workdir / "schedule.txt").write_text(result.schedule.dump() + "\n")
        print(f"seed {seed}; logs and the schedule (schedule.txt) kept in {workdir}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
