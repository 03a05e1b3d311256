"""5. Idle: CPU time and wake-ups of a daemon that has nothing to do (no polling expected).

CPU is utime+stime from /proc/PID/stat; wake-ups are context switches summed over the
daemon's threads (/proc/PID/task/*/status). Nothing else runs meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from pyroute2 import AsyncIPRoute

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
from rdmad.kernel.rtnl_msgs import RTNLGRP_LINK, RTNLGRP_NSID

GROUPS = (1 << (RTNLGRP_LINK - 1)) | (1 << (RTNLGRP_NSID - 1))  # what rdmad subscribes to

N_DEVICES = 16


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    with many_veths(N_DEVICES, "i") as nics:
        async with rdmad(bus, nics.sim_spec()) as d:
            async with client(bus) as c:  # one call: everything lazily set up is set up
                await c.manager("ListDevices")
            await asyncio.sleep(1.0)  # let start-up work (refreshes, GC) finish
            pid = pid_of(d)
            # Count what the daemon legitimately wakes up for (rtnetlink link/nsid events from
            # other work on the host) to tell those apart from polling.
            events = 0
            ipr = AsyncIPRoute()
            await ipr.bind(groups=GROUPS)

            async def count() -> None:
                nonlocal events
                while True:
                    async for _msg in ipr.get():
                        events += 1

            counter = asyncio.create_task(count())
            cpu0, sw0 = cpu_seconds(pid), context_switches(pid)
            await asyncio.sleep(p.idle_seconds)
            cpu1, sw1 = cpu_seconds(pid), context_switches(pid)
            counter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await counter
            ipr.close()
    cpu_ms = (cpu1 - cpu0) * 1000
    wakeups = (sw1 - sw0) / p.idle_seconds
    res.rows.append(
        Row(
            f"5. Idle daemon over {p.idle_seconds:.0f} s (N={N_DEVICES})",
            f"CPU {cpu_ms:.0f} ms ({cpu_ms / p.idle_seconds / 10:.3f} %), "
            f"{wakeups:.2f} wake-ups/s; meanwhile {events} rtnetlink events from other work "
            "on the host",
            target="~0: CPU < 0.1 %, < 1 wake-up/s",
            met=cpu_ms / p.idle_seconds / 10 < 0.1 and wakeups < 1.0,
        )
    )
