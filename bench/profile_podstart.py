"""Where a pod's start with its RDMA device spends what the same pod without one does not:
bench.podstart's node and pods (prepare, RunPodSandbox with ptp then rdmad-cni in pod
mode, CreateContainer and StartContainer), with and without the claim taking turns, split
into phases by the processes containerd runs (perf's sched_process_exec and
sched_process_exit tracepoints, on CLOCK_MONOTONIC like the marks taken here), and the CPU
each side's processes used per pod: the plugin, rdmad, and this process (the kubelet's CRI
calls and the API server double, which runs in a thread of it). Not in bench.run.

    python -m bench.profile_podstart [--pods N]    # as root, perf installed
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from bench.common import Params, Settler, cpu_seconds
from bench.dra import DEVICE, REF, offers, published
from bench.podstart import PLAIN_UID, Node, node
from bench.stats import pct
from testbed.bus import start_private_bus
from testbed.dra import kubelet as dra
from testbed.dra.claims import POD_UID

WARMUP = 2
_EVENT = re.compile(r"\s*\S+\s+(\d+)/\d+\s+([\d.]+):\s+sched:(sched_process_\w+):\s*(.*)")
CNI = ("ptp", "rdmad")  # the chain's plugins, as perf names their executables
SHIM = "containerd-shim-runc-v2"


@dataclass
class Pod:
    rdma: bool
    marks: dict[str, float]  # prepared, sandbox, started: CLOCK_MONOTONIC seconds
    cpu_ms: dict[str, float]


def cpu_of(n: Node) -> dict[str, float]:
    own = os.times()
    return {
        "rdmad-dra": cpu_seconds(n.plugin_pid) * 1000.0,
        "rdmad": cpu_seconds(n.rdmad_pid) * 1000.0,
        "this process (kubelet double, API server double)": (own.user + own.system) * 1000.0,
    }


async def start(n: Node, rdma: bool) -> Pod:
    """One pod started, its marks taken; then stopped, removed and unprepared, untimed."""
    before = cpu_of(n)
    marks = {"begin": time.monotonic()}
    cdi: tuple[str, ...] = ()
    if rdma:
        got = (await dra.prepare_devices_on(n.channel, n.service, [REF]))[REF.uid]
        cdi = tuple(got.devices[0].cdi_device_ids)
    marks["prepared"] = time.monotonic()
    pod = await n.kubelet.run_pod(
        "rdma" if rdma else "plain", "default", POD_UID if rdma else PLAIN_UID
    )
    marks["sandbox"] = time.monotonic()
    await n.kubelet.run_container(pod, "app", cdi_devices=cdi)
    marks["started"] = time.monotonic()
    after = cpu_of(n)
    await n.kubelet.stop_pod(pod)
    await n.kubelet.remove_pod(pod)
    if rdma:
        await dra.unprepare(n.endpoint, n.service, [REF])
        await published(n.api, offers(DEVICE, whole=True))
    return Pod(rdma, marks, {k: after[k] - before[k] for k in after})


Runs = list[tuple[str, float, float]]  # (executable's name, exec, exit), by exec time


def runs(perf_script: str) -> Runs:
    """The processes that ran, from `perf script`: each exec to its process's exit."""
    execs: dict[int, tuple[str, float]] = {}
    out = []
    for line in perf_script.splitlines():
        m = _EVENT.match(line)
        if m is None:
            continue
        pid, t, event, rest = int(m[1]), float(m[2]), m[3], m[4]
        if event == "sched_process_exec":
            execs[pid] = (rest.split()[0].removeprefix("filename=").rsplit("/", 1)[-1], t)
        elif event == "sched_process_exit" and "group_dead=true" in rest and pid in execs:
            name, began = execs.pop(pid)
            out.append((name, began, t))
    return sorted(out, key=lambda r: r[1])


def ms(a: float, b: float) -> float:
    return (b - a) * 1000.0


def phases(pod: Pod, ran: Runs) -> dict[str, float]:
    """ms per phase of one pod."""
    m = pod.marks
    during = [r for r in ran if m["prepared"] <= r[1] <= m["sandbox"]]

    def first(name: str) -> tuple[str, float, float]:
        return next(r for r in during if r[0] == name)

    ptp, cni, shim = first(CNI[0]), first(CNI[1]), first(SHIM)
    return {
        "NodePrepareResources (gRPC, the plugin, rdmad's Hold)": ms(m["begin"], m["prepared"]),
        "RunPodSandbox: to ptp's exec (netns, CNI setup)": ms(m["prepared"], ptp[1]),
        "ptp (with host-local)": ms(ptp[1], ptp[2]),
        "ptp's exit to rdmad-cni's exec": ms(ptp[2], cni[1]),
        "rdmad-cni (pod mode: Attach, or nothing held)": ms(cni[1], cni[2]),
        "rdmad-cni's exit to the shim's exec": ms(cni[2], shim[1]),
        "the shim's exec to the sandbox started": ms(shim[1], m["sandbox"]),
        "CreateContainer + StartContainer (CDI devices)": ms(m["sandbox"], m["started"]),
        "whole start": ms(m["begin"], m["started"]),
        **{f"CPU ms: {who}": used for who, used in pod.cpu_ms.items()},
    }


def table(pods: list[Pod], ran: Runs) -> str:
    split: dict[bool, dict[str, list[float]]] = {True: defaultdict(list), False: defaultdict(list)}
    for pod in pods:
        for name, took in phases(pod, ran).items():
            split[pod.rdma][name].append(took)
    lines = [
        f"| phase (p50, ms; {len(split[True]['whole start'])} pods each) | with RDMA | without"
        " | difference |",
        "|---|---|---|---|",
    ]
    for name, with_rdma in split[True].items():
        a, b = pct(with_rdma, 50), pct(split[False][name], 50)
        lines.append(f"| {name} | {a:.1f} | {b:.1f} | {a - b:+.1f} |")
    return "\n".join(lines)


async def profile(bus: str, pods: int) -> list[Pod]:
    settle = Settler(Params.full())
    out = []
    async with node(bus) as n:
        for i in range(WARMUP + pods):
            for rdma in (i % 2 == 0, i % 2 == 1):  # each goes first every other time
                await settle()
                pod = await start(n, rdma)
                if i >= WARMUP:
                    out.append(pod)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_podstart", description=__doc__)
    ap.add_argument("--pods", type=int, default=30, help="pods of each kind (default 30)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rdmad-prof-") as tmp:
        data = Path(tmp) / "perf.data"
        events = "sched:sched_process_exec,sched:sched_process_exit"
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-k", "mono", "-a", "-e", events, "-o", str(data)],
            stdout=subprocess.DEVNULL,
        )
        try:
            with start_private_bus() as bus:
                pods = asyncio.run(profile(bus.address, args.pods))
        finally:
            perf.send_signal(2)  # SIGINT: perf writes its data and exits
            perf.wait()
        script = subprocess.run(
            ["perf", "script", "-i", str(data), "-F", "comm,pid,tid,time,event,trace"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    print(table(pods, runs(script)))


if __name__ == "__main__":
    main()
