"""8. rdmad-cni against Debian's containernetworking-plugins Go binaries, ADD and DEL on the
same netdev, taking turns (bench.columns), settled: host-device against a whole-device
claim, macvlan against a shared one. Each is one plugin process as a runtime runs it (no
IPAM): wall time from spawn to exit, CPU from wait4. The plugin is build/cni/rdmad-cni.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.columns import Column, Samples, take_turns
from bench.common import Params, Results, Row, Settler, many_veths, rdmad
from bench.stats import RatioCheck, pct, spread
from testbed.cni_plugin import PLUGIN as RDMAD_CNI
from testbed.net import temp_netns

GO_PLUGINS = Path("/usr/lib/cni")
TARGET = 1.5  # rdmad's whole-device ADD over host-device's (the CNI issue's goal)
VERBS = ("ADD", "DEL")


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


def columns(netdev: str, bus: str, netns: str, settle: Settler) -> list[Column]:
    """host-device, rdmad-cni whole, macvlan, rdmad-cni shared: each column an ADD and a DEL
    of its plugin, settled, as "NAME VERB" (wall) and "NAME VERB cpu"."""
    base = {"cniVersion": "1.0.0", "name": "bench"}
    for go in ("host-device", "macvlan"):
        if not (GO_PLUGINS / go).exists():
            raise FileNotFoundError(f"{GO_PLUGINS / go}: install containernetworking-plugins")
    if not RDMAD_CNI.exists():
        raise FileNotFoundError(f"{RDMAD_CNI}: run scripts/build-cni.sh (or make setup)")
    rdmad_conf = base | {"type": "rdmad", "device": "sim0", "busAddress": bus}

    def column(name: str, plugin: Path, conf: dict[str, Any]) -> Column:
        async def run(s: Samples) -> None:
            for verb in VERBS:
                await settle()
                wall, cpu = run_once(plugin, verb, conf, netns)
                s.add(f"{name} {verb}", wall)
                s.add(f"{name} {verb} cpu", cpu)

        return run

    host_device = base | {"type": "host-device", "device": netdev}
    macvlan = base | {"type": "macvlan", "master": netdev, "mode": "bridge"}
    return [
        column("host-device", GO_PLUGINS / "host-device", host_device),
        column("rdmad-cni, whole device", RDMAD_CNI, rdmad_conf),
        column("macvlan", GO_PLUGINS / "macvlan", macvlan),
        column("rdmad-cni, shared", RDMAD_CNI, rdmad_conf | {"shared": True}),
    ]


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    del out  # rows only
    with many_veths(1, "c", up=True) as nics, temp_netns("cb") as netns:
        async with rdmad(bus, nics.sim_spec()):
            cols = columns(nics.hosts[0], bus, netns, Settler(p))
            t = (await take_turns(cols, p.cni_reps, p.warmup)).t
    for ours, theirs, judged in (
        ("rdmad-cni, whole device", "host-device", True),
        ("rdmad-cni, shared", "macvlan", False),
    ):
        for verb in VERBS:
            mine, peer = t[f"{ours} {verb}"], t[f"{theirs} {verb}"]
            check = RatioCheck.of(f"{ours}/{theirs}", mine, peer, TARGET)
            goal = judged and verb == "ADD"
            cpu = (
                f"CPU per process p50: {pct(t[f'{ours} {verb} cpu'], 50):.1f} ms against"
                f" {pct(t[f'{theirs} {verb} cpu'], 50):.1f} ms"
            )
            scenario = f"8. CNI {verb}, {ours} against {theirs} (wall, settled)"
            res.rows.append(Row.of(scenario, spread(mine), spread(peer), check, goal, f"; {cpu}"))
            res.dists[f"CNI {verb}: {ours}"] = mine
            res.dists[f"CNI {verb}: {theirs}"] = peer
