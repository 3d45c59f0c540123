"""Small statistics, pure Python (the checks run where numpy may be absent): the one home of percentiles, means and
regression lines."""
from __future__ import annotations

import math

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearFit:
    slope: float  # units of y per unit of x
    intercept: float
    r2: float  # share of the variance the line explains: 1.0 is a perfectly steady trend, ~0 is noise

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


def linear_fit(points: list[tuple[float, float]]) -> LinearFit:
    """Least-squares line through (x, y) points. Needs two distinct x; a flat y gives r2 = 0 (no trend to explain)."""
    n = len(points)
    if n < 2:
        raise ValueError("a line needs at least two points")
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        raise ValueError("a line needs points at two different times")
    sxy = sum((x - mx) * (y - my) for x, y in points)
    syy = sum((y - my) ** 2 for _, y in points)
    slope = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0
    return LinearFit(slope, my - slope * mx, r2)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 1]; None for no values."""
    if not values:
        return None
    v = sorted(values)
    rank = (len(v) - 1) * q
    lo, hi = math.floor(rank), math.ceil(rank)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def nearest_rank_percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p90 and p99 by nearest rank on the sorted samples: with a handful of requests, no interpolation pretends
    to more precision than the samples hold."""
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    v = sorted(values)
    pick = (lambda q: v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))])
    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99)}


BOOTSTRAP_MIN = 5  # under this many samples a resampled interval says nothing


def bootstrap_intervals(values: list[float], resamples: int = 1000, seed: int = 0,
                        level: float = 0.95) -> dict[str, tuple[float, float] | None]:
    """A percentile-bootstrap interval for each of nearest_rank_percentiles' p50/p90/p99 (None under BOOTSTRAP_MIN
    samples). Seeded, so a saved run reproduces; with few samples the p99's interval reaches the maximum."""
    import random

    if len(values) < BOOTSTRAP_MIN:
        return {"p50": None, "p90": None, "p99": None}
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {"p50": [], "p90": [], "p99": []}
    for _ in range(resamples):
        q = nearest_rank_percentiles([rng.choice(values) for _ in values])
        for k in draws:
            draws[k].append(q[k])
    lo, hi = (1 - level) / 2, 1 - (1 - level) / 2
    return {k: (percentile(d, lo), percentile(d, hi)) for k, d in draws.items()}


def median(values: list[float]) -> float | None:
    return percentile(values, 0.5)


def mad(values: list[float]) -> float | None:
    """Median absolute deviation from the median: a spread that one wild value cannot drag (unlike the std dev)."""
    m = median(values)
    return None if m is None else median([abs(v - m) for v in values])


def robust_z(value: float, med: float, spread: float | None) -> float | None:
    """How many MADs (scaled by 1.4826, so a normal sample's MAD-z matches its z-score) `value` lies from the median.
    None where the spread is 0: half the values are equal and any other one would be 'infinitely' far."""
    if not spread or spread <= 1e-9 * abs(med):  # float noise around identical values is no spread
        return None
    return (value - med) / (1.4826 * spread)


def wilson_interval(share: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a share measured on n positions (stays inside 0-1, sensible at 0 and 1)."""
    if n <= 0:
        return 0.0, 1.0
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def time_left_s(done: float, total: float, ran_s: float, did: float) -> float | None:
    """The time a run has left, as the pages estimate it: the work left at the speed this kind of work went so far in
    the run (`did` units in `ran_s` seconds); None before it has run a second and moved, and once it is done."""
    if ran_s >= 1.0 and did > 0 and done < total:
        return (total - done) * ran_s / did
    return None
