"""The side-by-side benchmarks' column orders share out what each operation follows."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from bench.columns import ORDERS
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
    for order in orders:
        assert sorted(order) == sorted(columns)


def test_the_full_run_measures_whole_cycles() -> None:
    p = Params.full()
    assert p.latency_reps % len(ORDERS["rwc"]) == 0
    assert p.back_to_back_reps % len(ORDERS["rwc"]) == 0
    assert p.shared_reps % len(ORDERS["rwcn"]) == 0
