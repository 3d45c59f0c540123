"""Small statistics over time series, pure Python (the checks run where numpy may be absent)."""
from __future__ import annotations

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


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 1]."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
