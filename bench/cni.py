"""rdmad-cni against the containernetworking plugins' Go binaries (Debian's
containernetworking-plugins), ADD and DEL side by side in one run, on the same netdev:
host-device against a whole-device claim, macvlan against a shared claim.

Each operation is one plugin process run as a runtime runs it (CNI_* variables, the config
on stdin, no IPAM). Wall time is the process's, from spawn to exit; CPU time is its user +
system time from wait4 (children included). rdmad's own CPU for the same operations is
measured apart, from the daemon's /proc counters over the whole column, and shown per
operation. The four columns take turns, rotating which one goes first in each round.

    sudo .venv/bin/python -m bench.cni [--reps 40] [--smoke] [--out bench/out/cni-results.md]

Not part of bench.run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import BENCH_DIR, cpu_seconds, pid_of, rdmad, run_prefix
from bench.stats import pct
from tests.support.bus import start_private_bus
from tests.support.net import ip, temp_netns

GO_PLUGINS = Path("/usr/lib/cni")
RDMAD_CNI = Path(sys.executable).parent / "rdmad-cni"
TARGET = 1.5  # rdmad's ADD p50 over host-device's


@dataclass
class Column:
    name: str
    plugin: Path
    conf: dict[str, Any]
    uses_rdmad: bool
    wall: dict[str, list[float]] = field(default_factory=lambda: {"ADD": [], "DEL": []})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"ADD": [], "DEL": []})
    daemon_cpu_s: float = 0.0


def run_once(plugin: Path, command: str, conf: dict[str, Any], netns: str) -> tuple[float, float]:
    """(wall ms, CPU ms) of one plugin process; raises if it fails."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "bench",
        "CNI_NETNS": f"/run/netns/{netns}",
        "CNI_IFNAME": "net1",
        "CNI_PATH": str(GO_PLUGINS),
    }
    stdin = json.dumps(conf).encode()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [str(plugin)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(stdin)
    proc.stdin.close()
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - t0) * 1000.0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{plugin.name} {command} failed: {out.decode()} {err.decode()}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000.0


def columns(netdev: str, bus: str, plugin: Path) -> list[Column]:
    base = {"cniVersion": "1.0.0", "name": "bench"}
    return [
        Column(
            "host-device",
            GO_PLUGINS / "host-device",
            base | {"type": "host-device", "device": netdev},
            False,
        ),
        Column(
            "rdmad whole",
            RDMAD_CNI,
            base | {"type": "rdmad", "device": "sim0", "busAddress": bus},
            True,
        ),
        Column(
            "macvlan",
            GO_PLUGINS / "macvlan",
            base | {"type": "macvlan", "master": netdev, "mode": "bridge"},
            False,
        ),
        Column(
            "rdmad shared",
            RDMAD_CNI,
            base | {"type": "rdmad", "device": "sim0", "shared": True, "busAddress": bus},
            True,
        ),
    ]


async def measure(reps: int, plugin: Path) -> list[Column]:
    tag = run_prefix()
    host, peer = f"{tag}h", f"{tag}p"
    ip("link", "add", host, "type", "veth", "peer", "name", peer)
    try:
        ip("link", "set", host, "up")
        with start_private_bus() as bus, temp_netns("cb") as netns:
            async with rdmad(bus.address, f"sim0={host}") as daemon:
                cols = columns(host, bus.address, plugin)
                for col in cols:  # one warm-up each: page cache, first-time imports
                    run_once(col.plugin, "ADD", col.conf, netns)
                    run_once(col.plugin, "DEL", col.conf, netns)
                for rep in range(reps):
                    shift = rep % len(cols)
                    for col in cols[shift:] + cols[:shift]:
                        before = cpu_seconds(pid_of(daemon)) if col.uses_rdmad else 0.0
                        for command in ("ADD", "DEL"):
                            wall, cpu = run_once(col.plugin, command, col.conf, netns)
                            col.wall[command].append(wall)
                            col.cpu[command].append(cpu)
                        if col.uses_rdmad:
                            col.daemon_cpu_s += cpu_seconds(pid_of(daemon)) - before
                return cols
    finally:
        ip("link", "del", host, check=False)


def report(cols: Sequence[Column], reps: int, plugin: Path) -> str:
    lines = [
        "# rdmad-cni against the Go reference plugins",
        "",
        f"{reps} rounds of ADD then DEL per column, no IPAM, one veth (the sim device's netdev);",
        "wall and CPU per plugin process (p50 / p99, ms); rdmad's own CPU per ADD+DEL pair",
        "(mean, ms, from /proc clock ticks over the column).",
        f"rdmad-cni: {plugin}; load average at the end: {os.getloadavg()[0]:.1f}.",
        "",
        "| column | ADD wall | ADD CPU | DEL wall | DEL CPU | rdmad CPU per pair |",
        "|---|---|---|---|---|---|",
    ]
    for c in cols:
        daemon = f"{c.daemon_cpu_s * 1000.0 / reps:.1f}" if c.uses_rdmad else ""
        cells = [
            f"{pct(c.wall[k], 50):.1f} / {pct(c.wall[k], 99):.1f}"
            if w
            else f"{pct(c.cpu[k], 50):.1f} / {pct(c.cpu[k], 99):.1f}"
            for k in ("ADD", "DEL")
            for w in (True, False)
        ]
        lines.append(f"| {c.name} | {' | '.join(cells)} | {daemon} |")
    by = {c.name: c for c in cols}
    for ours, theirs in (("rdmad whole", "host-device"), ("rdmad shared", "macvlan")):
        r = pct(by[ours].wall["ADD"], 50) / pct(by[theirs].wall["ADD"], 50)
        lines.append("")
        lines.append(f"ADD p50, {ours} / {theirs}: {r:.2f}x (goal for whole: <= {TARGET}x)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--smoke", action="store_true", help="3 rounds, print only")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "out" / "cni-results.md")
    parser.add_argument(
        "--plugin", type=Path, default=RDMAD_CNI, help="rdmad-cni to run (e.g. a packaged one)"
    )
    args = parser.parse_args(argv)
    reps = 3 if args.smoke else args.reps
    text = report(asyncio.run(measure(reps, args.plugin)), reps, args.plugin)
    print(text)
    if not args.smoke:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
