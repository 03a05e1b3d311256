"""bench.store: each rep saves one claim's and one release's way beside the other claims."""

from __future__ import annotations

from pathlib import Path

from bench.store import SAVES, measure
from rdmad.core.store import Store


def test_each_rep_times_every_save_and_leaves_only_the_other_claims(tmp_path: Path) -> None:
    took = measure(tmp_path, others=2, reps=3)
    assert list(took) == list(SAVES)
    assert all(len(samples) == 3 and min(samples) > 0 for samples in took.values())
    assert len(Store(tmp_path).load().claims) == 2
