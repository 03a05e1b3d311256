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
DEVICES = 9  # sim devices per node
CLAIMABLE = 5  # sim0-4: the bus and CNI actors' devices (and a pod's fourth rail)
PODMAN_DEVICE = "sim5"  # the podman actor's, on the shared node
# sim6-8: the pods' and holds' own, so that a pod of several rails gets them often
POD_DEVICES = tuple(range(CLAIMABLE + 1, DEVICES))
SLOTS = 6  # netns slots, shared by every actor and both nodes
BUS_CLIENTS = 6
CNI_ACTORS = 2
FORMS = ("name", "path", "pid")
FD_FORM = "fd"  # ClaimFd with the slot's netns open; drawn apart from FORMS (see generate)
FD_SHARE = 0.25  # of the bus clients' claims
CHECK_EVERY = 15.0
# A macvlan cannot be larger than its parent (1500): 9000 is for whole devices.
MTUS: dict[str, list[int | None]] = {
    "whole": [None, 1400, 9000],
    "shared": [None, 1400],
    "nodev": [None],
}
FAULT_KINDS = ("sigkill", "sigstop", "bus-restart", "netlink-flood", "disk-full")
RAILS = (2, 4)  # a multi-rail pod's claims, all in one netns
DRA_DEVICES = POD_DEVICES  # what the DRA actor's claims are allocated from (whole or slots)


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


def _pods(rng: random.Random, seconds: float) -> list[Action]:
    """Multi-rail pods: 2-4 claims into one netns with one pod CDI name, each with policy
    routing (most) or without; ended together by Release, or by their netns's death."""
    out = []
    for t in _times(rng, seconds, 1.0, 3.5):
        node = rng.choice(sorted(NODES))
        op = rng.choices(["start", "release", "kill"], [5, 2, 1])[0]
        args: dict[str, Any] = {"node": node, "pick": rng.randrange(1000)}
        if op == "start":
            rails = rng.randint(*RAILS)
            args |= {
                "slot": rng.randrange(SLOTS),
                "devices": [
                    f"sim{d}"
                    for d in rng.sample(POD_DEVICES, min(rails, len(POD_DEVICES)))
                    + rng.sample(range(CLAIMABLE), max(0, rails - len(POD_DEVICES)))
                ],
                "shared": [node == "shared" and rng.random() < 0.8 for _ in range(rails)],
                "routing": rng.random() < 0.8,
            }
        out.append(Action(t, "pods", op, args))
    return out


def _holds(rng: random.Random, seconds: float) -> list[Action]:
    """DRA-style pods: Hold (as rdmad-dra's prepare), then the pod comes (rdmad-cni ADD in pod
    mode, or Manager.Attach) or never does, then unprepare (CNI DEL if it came, Release)."""
    out = []
    for t in _times(rng, seconds, 1.0, 3.5):
        node = rng.choice(sorted(NODES))
        op = rng.choices(["hold", "come", "unprepare"], [4, 3, 2])[0]
        args: dict[str, Any] = {"node": node, "pick": rng.randrange(1000)}
        if op == "hold":
            n = rng.randint(1, 2)
            args |= {
                "devices": [f"sim{d}" for d in rng.sample(POD_DEVICES, n)],
                "shared": [node == "shared" and rng.random() < 0.5 for _ in range(n)],
            }
        elif op == "come":
            args |= {"slot": rng.randrange(SLOTS), "via": rng.choice(["cni", "attach"])}
        out.append(Action(t, "holds", op, args))
    return out


def _dra(rng: random.Random, seconds: float) -> list[Action]:
    """Pods through the real rdmad-dra: a ResourceClaim of 1-2 devices the node's slice
    offers, prepared by the kubelet's NodePrepareResources; then the pod's sandbox comes
    (rdmad-cni ADD in pod mode) or never does; NodeUnprepareResources ends it (after the
    sandbox's CNI DEL if it came)."""
    out = []
    for t in _times(rng, seconds, 1.0, 3.5):
        node = rng.choice(sorted(NODES))
        op = rng.choices(["prepare", "come", "unprepare"], [4, 3, 2])[0]
        args: dict[str, Any] = {"node": node, "pick": rng.randrange(1000)}
        if op == "prepare":
            args["count"] = rng.randint(1, 2)
        elif op == "come":
            args |= {"slot": rng.randrange(SLOTS), "via": "cni"}
        out.append(Action(t, "dra", op, args))
    return out


def _plugin_kills(rng: random.Random, seconds: float) -> list[Action]:
    """SIGKILL of a node's rdmad-dra, one at a time; the supervisor restarts it."""
    return [
        Action(t, "faults-dra", "plugin-sigkill", {"node": rng.choice(sorted(NODES))})
        for t in _times(rng, seconds - 5, 10.0, 25.0)
    ]


def _with_fd_forms(actions: list[Action], rng: random.Random) -> list[Action]:
    """A share of each bus client's claims made by ClaimFd instead of the form drawn: from
    a stream of each client's own, so that no other draw moves (a shorter run keeps the
    beginning of a longer one's)."""
    streams = {f"bus{i}": random.Random(rng.random()) for i in range(BUS_CLIENTS)}
    out = []
    for a in actions:
        if a.op == "claim" and streams[a.actor].random() < FD_SHARE:
            a = Action(a.at, a.actor, a.op, {**a.args, "form": FD_FORM})
        out.append(a)
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
    pods, holds = random.Random(rng.random()), random.Random(rng.random())
    actions += [
        Action(t, "scraper", "scrape", {"node": scraper.choice(sorted(NODES))})
        for t in _times(scraper, seconds, 0.5, 1.5)
    ]
    # Drawn after every other actor's, so that those stay as they were for a seed.
    actions += _pods(pods, seconds) + _holds(holds, seconds)
    # And after those, the ClaimFd form and rdmad-dra's pods and faults.
    actions = _with_fd_forms(actions, random.Random(rng.random()))
    dra, kills = random.Random(rng.random()), random.Random(rng.random())
    actions += _dra(dra, seconds) + _plugin_kills(kills, seconds)
    checks = [CHECK_EVERY * k for k in range(1, int(seconds // CHECK_EVERY) + 1)]
    actions += [Action(round(t, 3), "checker", "check") for t in checks if t < seconds]
    actions.sort(key=lambda a: (a.at, a.actor))
    return Schedule(seed, seconds, tuple(actions))
