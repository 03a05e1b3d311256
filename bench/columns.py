"""Ways of doing the same thing, measured side by side, rep by rep: each rep runs every
column once, in one of a cycle of orders. An operation pays for what the one before it left
the kernel to do (docs/performance.md), so each column follows each column, its own
included, equally often (bench/tests/test_order.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from bench.common import Settler, ms_since

# The columns are lettered in order (r rdmad, w raw pyroute2, c the CLI, l a fourth); the
# cycle for n columns is ORDERS[LETTERS[:n]].
LETTERS = "rwcl"
ORDERS: dict[str, tuple[str, ...]] = {
    "rw": ("rw", "wr"),
    "rwc": ("rwc", "crw", "wcr", "rcw", "wrc", "cwr"),
    "rwcl": ("rwcl", "lrwc", "crlw", "wrcl", "lwrc", "cwlr", "rlcw", "wlcr"),
}


@dataclass
class Samples:
    """ms per operation, by name."""

    t: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, ms: float) -> None:
        self.t.setdefault(name, []).append(ms)


Column = Callable[[Samples], Awaitable[None]]
Op = Callable[[], Awaitable[None]]


async def take_turns(cols: Sequence[Column], reps: int, warmup: int) -> Samples:
    """`warmup` reps into a throw-away Samples, then `reps`, each rep running every column
    once in the cycle of orders for as many columns."""
    orders = ORDERS[LETTERS[: len(cols)]]
    kept = Samples()
    for i in range(warmup + reps):
        into = kept if i >= warmup else Samples()
        for letter in orders[(i - warmup) % len(orders)]:
            await cols[LETTERS.index(letter)](into)
    return kept


Ways = dict[str, tuple[Op, Op]]  # column key -> (claim, release)


async def side_by_side(
    ways: Ways,
    reps: int,
    warmup: int,
    settle: Settler,
    claimed: Callable[[], None],
    home: Callable[[], None],
) -> dict[str, list[float]]:
    """Each way's claim and release once, untimed and checked; then the ways take turns,
    each claim and release settled and timed: ms by key + "c" (claim) or "r" (release)."""
    for claim, release in ways.values():
        await claim()
        claimed()
        await release()
        home()

    def column(key: str, claim: Op, release: Op) -> Column:
        async def run(s: Samples) -> None:
            for op, fn in (("c", claim), ("r", release)):
                await settle()
                t0 = time.perf_counter()
                await fn()
                s.add(key + op, ms_since(t0))

        return run

    cols = [column(key, *ops) for key, ops in ways.items()]
    return (await take_turns(cols, reps, warmup)).t


def blocking(fn: Callable[..., None], *args: str) -> Op:
    """A column's operation that calls `fn(*args)` and waits for it (a script's `ip` runs)."""

    async def op() -> None:
        fn(*args)

    return op


def drained(name: str, op: Callable[[], Awaitable[float]], pause_s: float) -> Column:
    """A column whose operation times itself (ms, kept as `name`) and undoes itself; then a
    pause lets the kernel's RCU work drain."""

    async def run(s: Samples) -> None:
        s.add(name, await op())
        await asyncio.sleep(pause_s)

    return run
