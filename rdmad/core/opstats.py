"""The daemon's own operation statistics: claims, releases, errors and their latencies.

Counted in memory since the daemon started (they are rates for a monitoring system, not
state, so they are not persisted). Histograms use fixed buckets, cumulative as Prometheus
wants them, so an exporter passes them through unchanged.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# Seconds. A claim is tens of ms on an idle host and seconds under load (netns moves wait
# on RCU), so the buckets span 1 ms to 10 s.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


@dataclass
class Histogram:
    bounds: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    sum: float = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= bound) per bucket, ending with +Inf."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


@dataclass
class OpStats:
    claims: int = 0  # successful claims
    releases: dict[str, int] = field(default_factory=dict)  # by ReleaseReason
    errors: dict[tuple[str, str], int] = field(default_factory=dict)  # (operation, error name)
    claim_seconds: Histogram = field(default_factory=Histogram)
    release_seconds: Histogram = field(default_factory=Histogram)  # requested releases

    def claimed(self, seconds: float) -> None:
        self.claims += 1
        self.claim_seconds.observe(seconds)

    def released(self, reason: str) -> None:
        self.releases[reason] = self.releases.get(reason, 0) + 1

    def failed(self, operation: str, error: str) -> None:
        key = (operation, error)
        self.errors[key] = self.errors.get(key, 0) + 1
