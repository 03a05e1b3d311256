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
import statistics
import time
from collections import Counter

from bench.common import netns_round_trip

PAUSES_MS = (0.0, 1.0, 2.0, 5.0, 10.0, 0.0)  # the repeat of 0 shows the drift between blocks


async def measure(reps: int, every: list[float]) -> list[tuple[float, float, float]]:
    """(pause ms, p50 ms, mean ms) of single moves, one row per pause; every move's time
    is appended to `every`."""
    rows = []
    async with netns_round_trip("m") as moves:
        for pause_ms in PAUSES_MS:
            took = []
            for _ in range(reps):
                for move in moves:
                    t0 = time.perf_counter()
                    await move()
                    took.append((time.perf_counter() - t0) * 1e3)
                    if pause_ms:
                        await asyncio.sleep(pause_ms / 1e3)
            rows.append((pause_ms, statistics.median(took), statistics.mean(took)))
            every.extend(took)
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
