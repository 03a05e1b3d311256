"""5. Idle: CPU time and wake-ups of a daemon that has nothing to do (no polling expected).

CPU is utime+stime from /proc/PID/stat; wake-ups are context switches summed over the
daemon's threads (bench.common.idle). Nothing else runs meanwhile; an rtnetlink link or
nsid event from other work on the host wakes it legitimately.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.common import Params, Results, Row, client, idle, many_veths, pid_of, rdmad

N_DEVICES = 16


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    with many_veths(N_DEVICES, "i") as nics:
        async with rdmad(bus, nics.sim_spec()) as d:
            async with client(bus) as c:  # one call: everything lazily set up is set up
                await c.manager("ListDevices")
            await asyncio.sleep(1.0)  # let start-up work (refreshes, GC) finish
            quiet = await idle(pid_of(d), p.idle_seconds)
    cpu_share = quiet.cpu_ms / quiet.seconds / 10  # % of one CPU
    per_second = sum(quiet.wakeups.values()) / quiet.seconds
    res.rows.append(
        Row(
            f"5. Idle daemon (N={N_DEVICES})",
            quiet.text(),
            target="~0: CPU < 0.1 %, < 1 wake-up/s",
            met=cpu_share < 0.1 and per_second < 1.0,
        )
    )
