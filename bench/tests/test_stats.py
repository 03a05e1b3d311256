"""The benchmark's statistics: percentiles, and how sure a ratio of two percentiles is."""

from __future__ import annotations

import random

import pytest

from bench.stats import RatioCheck, pct, ratio_interval


def test_pct_interpolates_between_samples_like_numpy() -> None:
    assert pct([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert pct([5.0], 99) == 5.0


def test_ratio_interval_contains_the_measured_ratio() -> None:
    rng = random.Random(1)
    a = [rng.lognormvariate(3.0, 0.3) for _ in range(400)]
    b = [rng.lognormvariate(2.9, 0.3) for _ in range(400)]
    lo, hi = ratio_interval(a, b, 99)
    assert lo <= pct(a, 99) / pct(b, 99) <= hi


def test_ratio_interval_of_one_distribution_against_itself_contains_one() -> None:
    rng = random.Random(2)
    a = [rng.expovariate(1.0) for _ in range(400)]
    b = [rng.expovariate(1.0) for _ in range(400)]
    lo, hi = ratio_interval(a, b, 99)
    assert lo < 1.0 < hi


def test_ratio_interval_narrows_with_more_samples() -> None:
    rng = random.Random(3)

    def width(n: int) -> float:
        a = [rng.expovariate(1.0) for _ in range(n)]
        b = [rng.expovariate(1.0) for _ in range(n)]
        lo, hi = ratio_interval(a, b, 50)
        return hi - lo

    assert width(1000) < width(100)


def test_ratio_interval_is_the_same_on_every_call() -> None:
    a, b = [float(i) for i in range(1, 201)], [float(i) * 1.1 for i in range(1, 201)]
    assert ratio_interval(a, b, 99) == ratio_interval(a, b, 99)


def test_a_ratio_target_ignores_the_tail_beyond_p90() -> None:
    b = [10.0 + i / 100 for i in range(500)]
    a = [*b[:490], *(1000.0 for _ in range(10))]  # the slowest 2% a hundred times slower
    check = RatioCheck.of("a/b", a, b, 1.3)
    assert check.points[99] > 1.3
    assert check.met


def test_a_ratio_target_is_not_met_where_its_interval_crosses_the_limit() -> None:
    rng = random.Random(4)
    b = [rng.lognormvariate(3.0, 0.5) for _ in range(60)]
    a = [x * 1.25 for x in b]  # 1.25 at every percentile, but 60 samples are few
    check = RatioCheck.of("a/b", a, b, 1.3)
    assert check.points[50] <= 1.3 and check.points[90] <= 1.3
    assert check.intervals[90][1] > 1.3
    assert not check.met


def test_a_strict_target_is_not_met_by_a_tie() -> None:
    a = [float(i) for i in range(1, 201)]
    assert not RatioCheck.of("a/a", a, a, 1.0, strict=True).met


def test_a_ratio_that_grows_by_its_floors_growth_alone_is_flat() -> None:
    # the floor doubles from one node to the next, and the tool stays 1.2x the floor
    small_floor = [100.0 + x % 10 for x in range(400)]
    large_floor = [2 * x for x in small_floor]
    check = RatioCheck.of_ratios(
        "rdmad/raw",
        ([1.2 * x for x in large_floor], large_floor),
        ([1.2 * x for x in small_floor], small_floor),
        1.15,
    )
    assert check.points[50] == pytest.approx(1.0)
    assert check.met


def test_a_ratio_that_grows_faster_than_its_floor_is_not_flat() -> None:
    floor = [100.0 + x % 10 for x in range(400)]
    check = RatioCheck.of_ratios(
        "rdmad/raw", ([1.5 * x for x in floor], floor), ([1.1 * x for x in floor], floor), 1.15
    )
    assert check.points[50] == pytest.approx(1.5 / 1.1)
    assert not check.met
