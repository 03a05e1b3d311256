"""Which everyday operations leave RCU callbacks behind, and what that does to a netns move.

    python -m bench.rcu_callbacks [--reps 40]

Behind the state file's swap (rdmad.swapfile) and the settled claim/release pass (see
findings.md, fourth round). Two measurements, both with root:

1. A worker thread pinned to CPU 1 does one operation, then CPU 1 idles for 40 ms. A CPU
   with RCU callbacks pending keeps its scheduler tick running until they are invoked, so
   the ticks counted on CPU 1 (ftrace hrtimer events) tell whether the operation queued
   any: ~0 for none, 3-5 (a grace period at HZ=250) when it did.
2. After 50 ms of idle, the same operation right before a netns move (one RTM_SETLINK on
   a veth, there and back, sent from CPU 0), done on CPU 0 or on CPU 1. The move waits in
   rcu_barrier() until every CPU's pending callbacks have been invoked: callbacks left on
   the other CPU cost it more than callbacks on its own. rdmad's loop thread saves the
   state and a worker thread sends the move, so they are often on different CPUs.
Not part of `bench.run`: it is an explanation, not a target.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import re
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import netns_round_trip
from bench.ktrace import TRACEFS
from rdmad.swapfile import write_swapped

_TICK = re.compile(r"\[(\d+)\].* ([\d.]+): hrtimer_expire_entry: .*tick_")
_MARK = re.compile(r" ([\d.]+): tracing_mark_write: (\S+)")


class Operations:
    """Each operation as rdmad or a tool might do it, on files in a private directory."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.n = 0
        (directory / "live").write_bytes(b"0")

    def table(self) -> dict[str, Callable[[], None]]:
        return {
            "nothing": lambda: None,
            "file replaced (write tmp, rename over)": self.replace,
            "file swapped in (rdmad.swapfile)": lambda: write_swapped(self.dir / "swap", b"x"),
            "new file renamed into place": self.new_file,
            "file unlinked": self.unlink,
            "netlink socket opened and closed": self.socket,
        }

    def replace(self) -> None:
        (self.dir / "tmp").write_bytes(b"x")
        os.rename(self.dir / "tmp", self.dir / "live")

    def new_file(self) -> None:
        self.n += 1
        (self.dir / "tmp").write_bytes(b"x")
        os.rename(self.dir / "tmp", self.dir / f"new{self.n}")

    def unlink(self) -> None:
        self.n += 1
        (self.dir / f"gone{self.n}").write_bytes(b"x")
        (self.dir / f"gone{self.n}").unlink()

    def socket(self) -> None:
        socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 0).close()


class Pinned:
    """A long-lived thread on one CPU that runs what it is given (a thread's exit would
    queue RCU callbacks of its own)."""

    def __init__(self, cpu: int) -> None:
        self._todo: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._done: queue.Queue[None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, args=(cpu,))
        self._thread.start()

    def _serve(self, cpu: int) -> None:
        os.sched_setaffinity(0, {cpu})
        while (fn := self._todo.get()) is not None:
            fn()
            self._done.put(None)

    def run(self, fn: Callable[[], None]) -> None:
        self._todo.put(fn)
        self._done.get()

    def stop(self) -> None:
        self._todo.put(None)
        self._thread.join()


def ticks_after(ops: dict[str, Callable[[], None]], reps: int) -> dict[str, list[int]]:
    """Per operation: CPU 1's ticks in the 40 ms after it ran there."""
    marker = os.open(TRACEFS / "trace_marker", os.O_WRONLY | os.O_CLOEXEC)
    enable = TRACEFS / "events/timer/hrtimer_expire_entry/enable"
    (TRACEFS / "trace").write_text("")
    enable.write_text("1")
    (TRACEFS / "tracing_on").write_text("1")  # the marker refuses writes (EBADF) while off
    cpu1 = Pinned(1)
    try:
        for _ in range(reps):
            for i, op in enumerate(ops.values()):

                def marked(i: int = i, op: Callable[[], None] = op) -> None:
                    os.write(marker, str(i).encode())
                    op()

                cpu1.run(marked)
                time.sleep(0.040)
                os.write(marker, b"end")
    finally:
        cpu1.stop()
        (TRACEFS / "tracing_on").write_text("0")
        enable.write_text("0")
        os.close(marker)
    out: dict[str, list[int]] = {name: [] for name in ops}
    names, current, since = list(ops), None, 0.0
    for line in (TRACEFS / "trace").read_text().splitlines():
        if m := _MARK.search(line):
            current = None if m.group(2) == "end" else names[int(m.group(2))]
            since = float(m.group(1))
            if current is not None:
                out[current].append(0)
        elif (
            (t := _TICK.search(line))
            and current
            and t.group(1) == "001"
            and float(t.group(2)) - since > 0.001  # not a tick already under way
        ):
            out[current][-1] += 1
    return out


async def moves_after(
    ops: dict[str, Callable[[], None]], reps: int
) -> dict[tuple[str, int], list[float]]:
    """Per operation and CPU it ran on: the time (ms) of a settled netns move, sent from
    CPU 0 right after the operation."""
    out: dict[tuple[str, int], list[float]] = {(name, cpu): [] for name in ops for cpu in (0, 1)}
    os.sched_setaffinity(0, {0})
    workers = {cpu: Pinned(cpu) for cpu in (0, 1)}
    try:
        async with netns_round_trip("u") as moves:
            for _ in range(reps):
                for name, op in ops.items():
                    for cpu, worker in workers.items():
                        for move in moves:
                            await asyncio.sleep(0.050)
                            worker.run(op)
                            t0 = time.perf_counter()
                            await move()
                            out[name, cpu].append((time.perf_counter() - t0) * 1e3)
    finally:
        for worker in workers.values():
            worker.stop()
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.rcu_callbacks", description=__doc__)
    ap.add_argument("--reps", type=int, default=40, help="repetitions per operation")
    args = ap.parse_args(argv)
    if os.cpu_count() in (None, 1) or not os.access(TRACEFS / "trace_marker", os.W_OK):
        print("needs root, tracefs at /sys/kernel/tracing and at least two CPUs")
        return 1
    with tempfile.TemporaryDirectory(prefix="rdmad-rcu-", dir="/dev/shm") as d:
        ops = Operations(Path(d)).table()
        ticks = ticks_after(ops, max(4, args.reps // 4))
        moves = asyncio.run(moves_after(ops, args.reps))
    print(
        "| operation | its CPU's ticks in the 40 ms after (mean) | settled move right after,"
        " p50: operation on the mover's CPU | on the other CPU |"
    )
    print("|---|---|---|---|")
    for name in ops:
        print(
            f"| {name} | {statistics.mean(ticks[name]):.1f} "
            f"| {statistics.median(moves[name, 0]):.2f} ms "
            f"| {statistics.median(moves[name, 1]):.2f} ms |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
