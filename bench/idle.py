"""5. Idle: CPU time and wake-ups of a daemon that has nothing to do (no polling expected).

CPU is utime+stime from /proc/PID/stat; wake-ups are context switches summed over the
daemon's threads (/proc/PID/task/*/status). Nothing else runs meanwhile.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.common import (
    Params,
    Results,
    Row,
    client,
    context_switches,
    cpu_seconds,
    many_veths,
    pid_of,
    rdmad,
)

N_DEVICES = 16


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    with many_veths(N_DEVICES, "i") as nics:
        async with rdmad(bus, nics.sim_spec()) as d:
            async with client(bus) as c:  # one call: everything lazily set up is set up
                await c.manager("ListDevices")
            await asyncio.sleep(1.0)  # let start-up work (refreshes, GC) finish
            pid = pid_of(d)
            cpu0, sw0 = cpu_seconds(pid), context_switches(pid)
            await asyncio.sleep(p.idle_seconds)
            cpu1, sw1 = cpu_seconds(pid), context_switches(pid)
    cpu_ms = (cpu1 - cpu0) * 1000
    wakeups = (sw1 - sw0) / p.idle_seconds
    res.rows.append(Row(
        f"5. Idle daemon over {p.idle_seconds:.0f} s (N={N_DEVICES})",
        f"CPU {cpu_ms:.0f} ms ({cpu_ms / p.idle_seconds / 10:.3f} %), "
        f"{wakeups:.2f} wake-ups/s",
        target="~0: CPU < 0.1 %, < 1 wake-up/s",
        met=cpu_ms / p.idle_seconds / 10 < 0.1 and wakeups < 1.0))
    res.curves["idle"] = {"cpu_ms": [cpu_ms], "wakeups_per_s": [wakeups]}
