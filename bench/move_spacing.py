"""How long the kernel takes to move a netdev between netns, back to back or spaced out,
and how those times fall into whole scheduler ticks.

    python -m bench.move_spacing [--reps 40]

Behind the claim/release comparison in results.md (see findings.md): a move waits for RCU
grace periods inside send(), and their end is found on scheduler ticks (FQS scans every
jiffy), so move times cluster 4 ms apart at HZ=250. The p50 of a few hundred such samples
jumps by a tick when a few percent of them change cluster. This script measures only the
kernel step (one RTM_SETLINK with IFLA_NET_NS_FD, there and back, on a fresh veth) and
prints the clusters, so the effect can be checked on any host. Not part of `bench.run`: it
is an explanation, not a target.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import time
from collections import Counter

from pyroute2 import AsyncIPRoute

from bench.common import many_veths
from rdmad.kernel.netns import run_in_netns
from rdmad.kernel.rtnl_msgs import setlink
from tests.support.net import temp_netns

PAUSES_MS = (0.0, 1.0, 2.0, 5.0, 10.0, 0.0)  # the repeat of 0 shows the drift between blocks


async def measure(reps: int, every: list[float]) -> list[tuple[float, float, float]]:
    """(pause ms, p50 ms, mean ms) of single moves, one row per pause; every move's time
    is appended to `every`."""
    rows = []
    with many_veths(1, "m") as nics, temp_netns("rbm") as netns:
        init = AsyncIPRoute()
        await init.setup_endpoint()
        target = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
        home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        sock = await run_in_netns(
            target, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 0)
        )
        inside = AsyncIPRoute(use_socket=sock)
        try:
            index = (await init.link("get", ifname=nics.hosts[0]))[0]["index"]
            for pause_ms in PAUSES_MS:
                took = []
                for _ in range(reps):
                    for via, where in ((init, target), (inside, home)):
                        t0 = time.perf_counter()
                        await setlink(via, index, ("IFLA_NET_NS_FD", where))
                        took.append((time.perf_counter() - t0) * 1e3)
                        if pause_ms:
                            await asyncio.sleep(pause_ms / 1e3)
                rows.append((pause_ms, statistics.median(took), statistics.mean(took)))
                every.extend(took)
        finally:
            inside.close()
            sock.close()
            init.close()
            os.close(target)
            os.close(home)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.move_spacing", description=__doc__)
    ap.add_argument("--reps", type=int, default=40, help="round trips per pause")
    args = ap.parse_args(argv)
    print("| pause before each move | move p50 | move mean |")
    print("|---|---|---|")
    every: list[float] = []
    for pause, p50, mean in asyncio.run(measure(args.reps, every)):
        print(f"| {pause:.0f} ms | {p50:.2f} ms | {mean:.2f} ms |")
    print("\n| move time (1 ms bins) | moves |\n|---|---|")
    bins = Counter(int(t) for t in every)
    for ms in sorted(bins):
        print(f"| {ms}-{ms + 1} ms | {bins[ms]} {'#' * (60 * bins[ms] // len(every))} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
