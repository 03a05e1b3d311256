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

from bench.common import Settler, ms_since

Op = Callable[[], Awaitable[None]]
Ways = dict[str, tuple[Op, Op]]  # column key -> (claim, release)

# rdmad, raw pyroute2, iproute2 CLI (and the CNI plugin, or rdmad with an RDMA limit)
ORDERS: dict[str, tuple[str, ...]] = {
    "rwc": ("rwc", "crw", "wcr", "rcw", "wrc", "cwr"),
    "rwcn": ("rwcn", "nrwc", "crnw", "wrcn", "nwrc", "cwnr", "rncw", "wncr"),
    "rwcl": ("rwcl", "lrwc", "crlw", "wrcl", "lwrc", "cwlr", "rlcw", "wlcr"),
    "ru": ("ru", "ur"),  # root, a user (bench.shared's 6b)
}


def blocking(fn: Callable[..., None], *args: str) -> Op:
    """A column's operation that calls `fn(*args)` and waits for it (a script's `ip` runs)."""

    async def op() -> None:
        fn(*args)

    return op


@dataclass
class Pass:
    """One way of sequencing the operations, and what it measured."""

    name: str  # "settled" or "back to back"
    reps: int
    settle: Settler | None  # None: back to back
    t: dict[str, list[float]] = field(default_factory=dict)  # column+op -> ms


async def measure(
    ps: Pass,
    ways: Ways,
    warmup: int,
    check_claimed: Callable[[], None],
    check_released: Callable[[], None],
) -> None:
    """Run `warmup` + `ps.reps` reps; the first rep's results are checked for each column."""
    orders = ORDERS["".join(ways)]
    for key in ways:
        for op in "cr":
            ps.t[key + op] = []
    for i in range(warmup + ps.reps):
        for key in orders[(i - warmup) % len(orders)]:  # measured reps: whole cycles
            for op, fn in zip("cr", ways[key], strict=True):
                if ps.settle is not None:
                    await ps.settle()
                t0 = time.perf_counter()
                await fn()
                took = ms_since(t0)
                if i == 0:
                    (check_claimed if op == "c" else check_released)()
                if i >= warmup:
                    ps.t[key + op].append(took)
