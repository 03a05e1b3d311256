"""Ways of doing the same claim and release, measured side by side, rep by rep.

Each rep runs every column's claim then release, in one of a cycle of column orders. An
operation pays for what the one before it left the kernel to do (docs/performance.md): a
claim 50-60 ms after the CLI's release, whose `ip` processes have just exited, still moves
slower. So each column's claim must follow each column's release, its own included, equally
often. In these cycles every rep starts with the column that ended the one before, and the
other adjacent pairs each come equally often (bench/tests/test_order.py).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bench.common import Row, Settler, ms_since
from bench.ktrace import MoveTrace
from bench.stats import pct, spread

Op = Callable[[], Awaitable[None]]
Ways = dict[str, tuple[Op, Op]]  # column key -> (claim, release)

# rdmad, raw pyroute2, iproute2 CLI (and the CNI plugin)
ORDERS: dict[str, tuple[str, ...]] = {
    "rwc": ("rwc", "crw", "wcr", "rcw", "wrc", "cwr"),
    "rwcn": ("rwcn", "nrwc", "crnw", "wrcn", "nwrc", "cwnr", "rncw", "wncr"),
}


@dataclass
class Pass:
    """One way of sequencing the operations, and what it measured."""

    name: str  # "settled" or "back to back"
    reps: int
    settle: Settler | None  # None: back to back
    t: dict[str, list[float]] = field(default_factory=dict)  # column+op -> ms
    labels: dict[str, list[str]] = field(default_factory=dict)  # column+op -> trace labels


async def measure(
    ps: Pass,
    ways: Ways,
    warmup: int,
    trace: MoveTrace | None,
    check_claimed: Callable[[], None],
    check_released: Callable[[], None],
) -> None:
    """Run `warmup` + `ps.reps` reps; the first rep's results are checked for each column."""
    orders = ORDERS["".join(ways)]
    for key in ways:
        for op in "cr":
            ps.t[key + op], ps.labels[key + op] = [], []
    for i in range(warmup + ps.reps):
        for key in orders[(i - warmup) % len(orders)]:  # measured reps: whole cycles
            for op, fn in zip("cr", ways[key], strict=True):
                if ps.settle is not None:
                    await ps.settle()
                label = f"{ps.name[0]}{key}{op}{i}"
                if trace is not None:
                    trace.begin(label)
                t0 = time.perf_counter()
                await fn()
                took = ms_since(t0)
                if trace is not None:
                    trace.end(label)
                if i == 0:
                    (check_claimed if op == "c" else check_released)()
                if i >= warmup:
                    ps.t[key + op].append(took)
                    ps.labels[key + op].append(label)


def own_time_row(
    label: str,
    op: str,
    t: dict[str, list[float]],
    labels: dict[str, list[str]],
    moves: dict[str, float],
) -> Row:
    """rdmad, raw and the CLI's time outside the kernel's move (see bench.ktrace)."""
    own: dict[str, list[float]] = {}
    for key in "rwc":
        pairs = zip(t[key + op], labels[key + op], strict=True)
        own[key] = [took - moves[lab] for took, lab in pairs if lab in moves]
    r, w, cl = own["r"], own["w"], own["c"]
    return Row(
        f"1. {label}: time outside the kernel's move (ftrace)",
        spread(r),
        spread(w),
        spread(cl),
        f"rdmad - raw {pct(r, 50) - pct(w, 50):.2f} ms; rdmad - CLI"
        f" {pct(r, 50) - pct(cl, 50):.2f} ms (p50)",
    )
