"""Latency histograms: fixed buckets, reported cumulatively as Prometheus wants them."""

from __future__ import annotations

from rdmad.core.opstats import Histogram


def test_an_observation_counts_in_its_bucket_and_every_wider_one() -> None:
    h = Histogram(bounds=(0.1, 1.0), counts=[0, 0, 0])
    h.observe(0.05)
    h.observe(0.5)
    h.observe(7.0)
    assert h.cumulative() == [(0.1, 1), (1.0, 2), (float("inf"), 3)]
    assert h.count == 3 and h.sum == 7.55


def test_a_value_on_a_bound_belongs_to_that_bucket() -> None:
    h = Histogram(bounds=(0.1, 1.0), counts=[0, 0, 0])
    h.observe(1.0)
    assert h.cumulative()[1] == (1.0, 1)
