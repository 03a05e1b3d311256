"""The claim/release benchmark's column order shares out what each operation follows."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from bench.claim import COLUMNS, ORDERS


def test_every_column_follows_every_other_equally_often_back_to_back() -> None:
    sequence = "".join(ORDERS[i % len(ORDERS)] for i in range(len(ORDERS) * 50))
    follows = Counter(pairwise(sequence))
    others = {(a, b) for a in COLUMNS for b in COLUMNS if a != b}
    assert set(follows) == others
    assert max(follows.values()) - min(follows.values()) <= 1


def test_every_rep_runs_each_column_once() -> None:
    for order in ORDERS:
        assert sorted(order) == sorted(COLUMNS)
