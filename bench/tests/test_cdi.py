"""bench.cdi: each rep makes and ends one claim of the pod beside the other pods' claims."""

from __future__ import annotations

from pathlib import Path

from bench.cdi import EVENTS, measure


def test_each_rep_times_both_events_and_leaves_the_other_specs(tmp_path: Path) -> None:
    took = measure(tmp_path, pod=8, others=16, reps=3)
    assert list(took) == list(EVENTS)
    assert all(len(samples) == 3 and min(samples) > 0 for samples in took.values())
    # 16 other claims in 2 pods, 7 of this pod; a spec each, and one per pod CDI name
    assert len(list(tmp_path.glob("*.json"))) == 16 + 2 + 7 + 1
