"""The claim/release benchmark's column order shares out what each operation follows."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from bench.claim import COLUMNS, ORDERS
from bench.common import Params


def _follows(reps: int) -> Counter[tuple[str, str]]:
    """(column of the previous operation, column) over `reps` reps, the first one's
    predecessor being the last one's, as in a run of whole cycles."""
    sequence = "".join(ORDERS[i % len(ORDERS)] for i in range(reps))
    return Counter(pairwise(sequence[-1] + sequence))


def test_every_column_follows_every_column_its_own_included_equally_often() -> None:
    follows = _follows(len(ORDERS) * 50)
    assert set(follows) == {(a, b) for a in COLUMNS for b in COLUMNS}
    assert len(set(follows.values())) == 1


def test_every_rep_runs_each_column_once() -> None:
    for order in ORDERS:
        assert sorted(order) == sorted(COLUMNS)


def test_the_full_run_measures_whole_cycles() -> None:
    p = Params.full()
    assert p.latency_reps % len(ORDERS) == 0
    assert p.back_to_back_reps % len(ORDERS) == 0
