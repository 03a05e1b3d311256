"""The side-by-side benchmarks' column orders share out what each operation follows."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from bench.columns import LETTERS, ORDERS, Column, Samples, drained, take_turns
from bench.common import Params

CYCLES = sorted(ORDERS.items())


def _follows(orders: tuple[str, ...], reps: int) -> Counter[tuple[str, str]]:
    """(column of the previous operation, column) over `reps` reps, the first one's
    predecessor being the last one's, as in a run of whole cycles."""
    sequence = "".join(orders[i % len(orders)] for i in range(reps))
    return Counter(pairwise(sequence[-1] + sequence))


@pytest.mark.parametrize(("columns", "orders"), CYCLES)
def test_every_column_follows_every_column_its_own_included_equally_often(
    columns: str, orders: tuple[str, ...]
) -> None:
    follows = _follows(orders, len(orders) * 50)
    assert set(follows) == {(a, b) for a in columns for b in columns}
    assert len(set(follows.values())) == 1


@pytest.mark.parametrize(("columns", "orders"), CYCLES)
def test_every_rep_runs_each_column_once(columns: str, orders: tuple[str, ...]) -> None:
    assert columns == LETTERS[: len(columns)]
    for order in orders:
        assert sorted(order) == sorted(columns)


def test_the_full_run_measures_whole_cycles() -> None:
    p = Params()
    assert p.latency_reps % len(ORDERS["rwcl"]) == 0
    assert p.shared_reps % len(ORDERS["rw"]) == 0


def recording(ran: list[str], name: str) -> Column:
    """A column that logs its name when it runs and keeps one sample."""

    async def col(s: Samples) -> None:
        ran.append(name)
        s.add(name, 1.0)

    return col


async def test_each_column_runs_once_per_rep_and_the_warmup_reps_are_not_kept() -> None:
    ran: list[str] = []
    got = await take_turns([recording(ran, n) for n in "abc"], 6, 2)
    assert Counter(ran) == {"a": 8, "b": 8, "c": 8}
    assert {n: len(v) for n, v in got.t.items()} == {"a": 6, "b": 6, "c": 6}


@pytest.mark.parametrize(("columns", "orders"), CYCLES)
async def test_over_a_cycle_each_column_goes_first_equally_often(
    columns: str, orders: tuple[str, ...]
) -> None:
    ran: list[str] = []
    await take_turns([recording(ran, c) for c in columns], len(orders), 0)
    n = len(columns)
    assert Counter(ran[0::n]) == {c: len(orders) // n for c in columns}


async def test_a_drained_column_keeps_the_time_its_operation_gives() -> None:
    async def op() -> float:
        return 7.0

    got = await take_turns([drained("a", op, 0.0), drained("b", op, 0.0)], 2, 1)
    assert got.t == {"a": [7.0, 7.0], "b": [7.0, 7.0]}
