"""The soak's schedule: every action of every actor, with its time, generated up front from
one seed, so that a seed names a run and replays it.

An action is (time in soak seconds, actor, op, args). The runner releases each actor's
actions in order, at their time; an actor never waits on its own. What an action does with
the world (which claim a `release` picks, whether a netns still exists) is decided when it
runs, from the args the schedule gave it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# The two nodes: the kernel's RDMA netns mode is one per host and changes only while no other
# netns exists, so shared claims and netdev=false claims need one rdmad in each mode.
NODES = {"shared": ("whole", "shared"), "exclusive": ("whole", "nodev")}
DEVICES = 6  # sim devices per node; the last is the podman actor's, on the shared node
CLAIMABLE = DEVICES - 1  # the bus and CNI actors' devices
SLOTS = 6  # netns slots, shared by every actor and both nodes
BUS_CLIENTS = 6
CNI_ACTORS = 2
FORMS = ("name", "path", "pid")
CHECK_EVERY = 15.0
# A macvlan cannot be larger than its parent (1500): 9000 is for whole devices.
MTUS: dict[str, list[int | None]] = {
    "whole": [None, 1400, 9000],
    "shared": [None, 1400],
    "nodev": [None],
}
FAULT_KINDS = ("sigkill", "sigstop", "bus-restart", "netlink-flood", "disk-full")


@dataclass(frozen=True)
class Action:
    at: float
    actor: str
    op: str
    args: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.at:9.3f} {self.actor:<16} {self.op:<14} {json.dumps(self.args)}"


@dataclass(frozen=True)
class Schedule:
    seed: int
    seconds: float
    actions: tuple[Action, ...]

    def of(self, actor: str) -> list[Action]:
        return [a for a in self.actions if a.actor == actor]

    def actors(self) -> list[str]:
        return sorted({a.actor for a in self.actions})

    def dump(self) -> str:
        head = f"# soak schedule: seed {self.seed}, {self.seconds:g} s, {len(self.actions)} actions"
        return "\n".join([head, *(a.line() for a in self.actions)])


def _times(rng: random.Random, seconds: float, low: float, high: float) -> Iterator[float]:
    t = rng.uniform(0, high)
    while t < seconds:
        yield round(t, 3)
        t += rng.uniform(low, high)


def _bus_client(rng: random.Random, name: str, seconds: float) -> list[Action]:
    out = []
    for t in _times(rng, seconds, 0.3, 1.5):
        node = rng.choice(sorted(NODES))
        if rng.random() < 0.55:
            kind = rng.choice(NODES[node])
            args = {
                "node": node,
                "device": f"sim{rng.randrange(CLAIMABLE)}",
                "kind": kind,
                "form": rng.choice(FORMS),
                "slot": rng.randrange(SLOTS),
                "mtu": rng.choice(MTUS[kind]),
            }
            out.append(Action(t, name, "claim", args))
        else:
            args = {"pick": rng.randrange(1000), "via": rng.choice(["manager", "claim"])}
            out.append(Action(t, name, "release", args))  # one of the claims it holds
    return out


def _cni(rng: random.Random, name: str, seconds: float) -> list[Action]:
    out = []
    for t in _times(rng, seconds, 0.8, 3.0):
        node = rng.choice(sorted(NODES))
        op = rng.choices(["add", "check", "del", "gc"], [4, 2, 3, 1])[0]
        args: dict[str, Any] = {"node": node, "pick": rng.randrange(1000)}
        if op == "add":
            args |= {
                "device": f"sim{rng.randrange(CLAIMABLE)}",
                "shared": node == "shared" and rng.random() < 0.6,
                "slot": rng.randrange(SLOTS),
            }
        out.append(Action(t, name, op, args))
    return out


def _podman(rng: random.Random, seconds: float) -> list[Action]:
    ops = ["run", "run", "rm", "kill"]
    return [
        Action(t, "podman", rng.choice(ops), {"pick": rng.randrange(1000)})
        for t in _times(rng, seconds, 3.0, 7.0)
    ]


def _faults(rng: random.Random, node: str, seconds: float) -> list[Action]:
    """One fault at a time on a node; a fault with a window (stop, full disk) holds it."""
    out = []
    t = rng.uniform(2.0, 6.0)
    while t < seconds - 5:
        kind = rng.choice(FAULT_KINDS)
        hold = round(rng.uniform(1.0, 4.0), 3) if kind in ("sigstop", "disk-full") else 0.0
        out.append(Action(round(t, 3), f"faults-{node}", kind, {"node": node, "hold": hold}))
        t += hold + rng.uniform(6.0, 14.0)
    return out


def generate(seed: int, seconds: float, podman: bool = True) -> Schedule:
    rng = random.Random(seed)
    actions: list[Action] = []
    for i in range(BUS_CLIENTS):
        actions += _bus_client(random.Random(rng.random()), f"bus{i}", seconds)
    for i in range(CNI_ACTORS):
        actions += _cni(random.Random(rng.random()), f"cni{i}", seconds)
    if podman:
        actions += _podman(random.Random(rng.random()), seconds)
    for node in sorted(NODES):
        actions += _faults(random.Random(rng.random()), node, seconds)
    reaper = random.Random(rng.random())
    actions += [
        Action(t, "netns-reaper", "delete-netns", {"slot": reaper.randrange(SLOTS)})
        for t in _times(reaper, seconds, 3.0, 8.0)
    ]
    scraper = random.Random(rng.random())
    actions += [
        Action(t, "scraper", "scrape", {"node": scraper.choice(sorted(NODES))})
        for t in _times(scraper, seconds, 0.5, 1.5)
    ]
    checks = [CHECK_EVERY * k for k in range(1, int(seconds // CHECK_EVERY) + 1)]
    actions += [Action(round(t, 3), "checker", "check") for t in checks if t < seconds]
    actions.sort(key=lambda a: (a.at, a.actor))
    return Schedule(seed, seconds, tuple(actions))
