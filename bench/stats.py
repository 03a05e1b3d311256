"""Percentiles, bootstrap intervals, and how a target on a ratio is judged.

Targets are judged at p50 and p90. A p99 of a few hundred samples is about the fifth
slowest, and the kernel's netns move has a tail in whole scheduler ticks that is the same
for every tool, so one run's p99 moves a lot between runs: it is reported with its 95%
bootstrap interval and never decides "met" (docs/performance.md).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

JUDGED = (50, 90)  # the percentiles a target is judged at
RESAMPLES = 1000


def pct(samples: Sequence[float], q: float) -> float:
    """Percentile with linear interpolation (numpy's default), q in [0, 100]."""
    if not samples:
        raise ValueError("no samples")
    s = sorted(samples)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def spread(samples: Sequence[float], unit: str = "ms") -> str:
    """p50 / p90 / p99, the way every table cell shows a distribution."""
    return " / ".join(f"{pct(samples, q):.2f}" for q in (50, 90, 99)) + f" {unit}"


def bootstrap(
    stat: Callable[..., float],
    *columns: Sequence[float],
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """A 95% bootstrap interval for stat(*columns), each column resampled with replacement.
    It says how far the same machine could move the figure between runs; at q=99 over a few
    hundred samples it is wide."""
    rng = random.Random(seed)
    values = [stat(*(rng.choices(c, k=len(c)) for c in columns)) for _ in range(resamples)]
    return pct(values, 2.5), pct(values, 97.5)


def pct_interval(samples: Sequence[float], q: float) -> tuple[float, float]:
    return bootstrap(lambda s: pct(s, q), samples)


def with_p99(samples: Sequence[float], unit: str = "ms") -> str:
    """spread(), then the 95% interval of the p99."""
    lo, hi = pct_interval(samples, 99)
    return f"{spread(samples, unit)} [p99 {lo:.2f}-{hi:.2f}]"


def ratio_interval(a: Sequence[float], b: Sequence[float], q: float) -> tuple[float, float]:
    """A 95% bootstrap interval for pct(a, q) / pct(b, q)."""
    return bootstrap(lambda x, y: pct(x, q) / pct(y, q), a, b)


@dataclass(frozen=True)
class RatioCheck:
    """pct(a, q) / pct(b, q) against `limit` (at most, or below with `strict`).

    Met only where the whole 95% interval holds at p50 and at p90: a point estimate that
    holds while its own interval crosses the line is not a claim one run can make. p99 is
    shown with its interval and decides nothing."""

    name: str  # e.g. "rdmad/raw"
    limit: float
    strict: bool
    points: dict[int, float]  # percentile -> ratio
    intervals: dict[int, tuple[float, float]]

    @classmethod
    def of(
        cls, name: str, a: Sequence[float], b: Sequence[float], limit: float, strict: bool = False
    ) -> RatioCheck:
        qs = (*JUDGED, 99)
        return cls(
            name,
            limit,
            strict,
            {q: pct(a, q) / pct(b, q) for q in qs},
            {q: ratio_interval(a, b, q) for q in qs},
        )

    @classmethod
    def of_ratios(
        cls,
        name: str,
        top: tuple[Sequence[float], Sequence[float]],
        bottom: tuple[Sequence[float], Sequence[float]],
        limit: float,
    ) -> RatioCheck:
        """(pct(a, q) / pct(b, q)) / (pct(c, q) / pct(d, q)) for top (a, b), bottom (c, d):
        how much a ratio grows from one setting to another."""
        qs = (*JUDGED, 99)

        def stat(q: int) -> Callable[..., float]:
            return lambda a, b, c, d: (pct(a, q) / pct(b, q)) / (pct(c, q) / pct(d, q))

        return cls(
            name,
            limit,
            False,
            {q: stat(q)(*top, *bottom) for q in qs},
            {q: bootstrap(stat(q), *top, *bottom) for q in qs},
        )

    @property
    def met(self) -> bool:
        hi = [self.intervals[q][1] for q in JUDGED]
        return all(h < self.limit if self.strict else h <= self.limit for h in hi)

    def text(self) -> str:
        parts = [
            f"p{q} {self.points[q]:.2f} ({lo:.2f}-{hi:.2f})"
            for q, (lo, hi) in self.intervals.items()
        ]
        return f"{self.name} " + ", ".join(parts)

    def target(self) -> str:
        return f"{self.name} {'<' if self.strict else '<='} {self.limit:g} at p50 and p90"
