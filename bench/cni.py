"""8. rdmad-cni against the containernetworking plugins' Go binaries (Debian's
containernetworking-plugins), ADD and DEL side by side on the same netdev: host-device against
a whole-device claim, macvlan against a shared claim.

Each operation is one plugin process run as a runtime runs it (CNI_* variables, the config
on stdin, no IPAM), settled like the other netns-moving scenarios. Wall time is the
process's, from spawn to exit; CPU time is its user + system time from wait4 (children
included). The four columns take turns, rotating which one goes first
in each round. The plugin is the Go binary the checkout builds (build/cni/rdmad-cni, made by
`make setup`: scripts/build-cni.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import Params, Results, Row, Settler, many_veths, rdmad
from bench.stats import RatioCheck, pct, spread
from testbed.cni_plugin import PLUGIN as RDMAD_CNI
from testbed.net import temp_netns

GO_PLUGINS = Path("/usr/lib/cni")
TARGET = 1.5  # rdmad's whole-device ADD over host-device's (the CNI issue's goal)
VERBS = ("ADD", "DEL")


@dataclass
class Column:
    name: str
    plugin: Path
    conf: dict[str, Any]
    wall: dict[str, list[float]] = field(default_factory=lambda: {v: [] for v in VERBS})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {v: [] for v in VERBS})


def run_once(
    plugin: Path,
    command: str,
    conf: dict[str, Any],
    netns: str,
    ifname: str = "net1",
    args: str = "",
) -> tuple[float, float]:
    """(wall ms, CPU ms) of one plugin process; raises if it fails. `args`: CNI_ARGS."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "bench",
        "CNI_NETNS": f"/run/netns/{netns}",
        "CNI_IFNAME": ifname,
        "CNI_ARGS": args,
        "CNI_PATH": str(GO_PLUGINS),
    }
    # Output to files and the config through a pipe it fits in, so that wait4 reaps the
    # process and gives its own rusage (children included: IPAM, when there is one).
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [str(plugin)], stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(conf).encode())
        proc.stdin.close()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = (time.perf_counter() - t0) * 1000.0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            out.seek(0)
            raise RuntimeError(f"{plugin.name} {command} failed: {out.read().decode()[:500]}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000.0


def columns(netdev: str, bus: str) -> list[Column]:
    base = {"cniVersion": "1.0.0", "name": "bench"}
    for go in ("host-device", "macvlan"):
        if not (GO_PLUGINS / go).exists():
            raise FileNotFoundError(f"{GO_PLUGINS / go}: install containernetworking-plugins")
    if not RDMAD_CNI.exists():
        raise FileNotFoundError(f"{RDMAD_CNI}: run scripts/build-cni.sh (or make setup)")
    rdmad_conf = base | {"type": "rdmad", "device": "sim0", "busAddress": bus}
    host_device = base | {"type": "host-device", "device": netdev}
    macvlan = base | {"type": "macvlan", "master": netdev, "mode": "bridge"}
    return [
        Column("host-device", GO_PLUGINS / "host-device", host_device),
        Column("rdmad-cni, whole device", RDMAD_CNI, rdmad_conf),
        Column("macvlan", GO_PLUGINS / "macvlan", macvlan),
        Column("rdmad-cni, shared", RDMAD_CNI, rdmad_conf | {"shared": True}),
    ]


async def measure(cols: list[Column], reps: int, warmup: int, netns: str, settle: Settler) -> None:
    for rep in range(warmup + reps):
        shift = rep % len(cols)
        for col in cols[shift:] + cols[:shift]:
            for command in VERBS:
                await settle()
                wall, cpu = run_once(col.plugin, command, col.conf, netns)
                if rep >= warmup:
                    col.wall[command].append(wall)
                    col.cpu[command].append(cpu)


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    del out  # rows only
    with many_veths(1, "c", up=True) as nics, temp_netns("cb") as netns:
        async with rdmad(bus, nics.sim_spec()):
            cols = columns(nics.hosts[0], bus)
            await measure(cols, p.cni_reps, p.warmup, netns, Settler(p))
    by = {c.name: c for c in cols}
    for ours, theirs, judged in (
        ("rdmad-cni, whole device", "host-device", True),
        ("rdmad-cni, shared", "macvlan", False),
    ):
        mine, peer = by[ours], by[theirs]
        for verb in VERBS:
            check = RatioCheck.of(f"{ours}/{theirs}", mine.wall[verb], peer.wall[verb], TARGET)
            goal = judged and verb == "ADD"
            cpu = (
                f"CPU per process p50: {pct(mine.cpu[verb], 50):.1f} ms against"
                f" {pct(peer.cpu[verb], 50):.1f} ms"
            )
            res.rows.append(
                Row(
                    f"8. CNI {verb}, {ours} against {theirs} (wall, settled)",
                    spread(mine.wall[verb]),
                    spread(peer.wall[verb]),
                    "-",
                    f"{check.text()}; {cpu}",
                    check.target() if goal else "",
                    check.met if goal else None,
                )
            )
            res.dists[f"CNI {verb}: {ours}"] = mine.wall[verb]
            res.dists[f"CNI {verb}: {theirs}"] = peer.wall[verb]
