"""Small score helpers shared by the server's and the sidecar's ranking code."""

from __future__ import annotations

from collections.abc import Sequence


def minmax(values: Sequence[float]) -> list[float]:
    """Scale to [0, 1] within the list (all 0.5 when the values are equal), so scores of
    different origins can be blended per request."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    return [0.5] * len(values) if hi - lo < 1e-12 else [(v - lo) / (hi - lo) for v in values]


def reciprocal_ranks(values: Sequence[float], k: float) -> list[float]:
    """1 / (k + rank) of each value, the best ranked 1 (ties by position), so two orders
    can be blended by rank whatever their scores' scales and outliers."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    out = [0.0] * len(values)
    for rank, i in enumerate(order, start=1):
        out[i] = 1.0 / (k + rank)
    return out
