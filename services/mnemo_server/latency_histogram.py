"""Latency histograms with fixed buckets, shared by the server (which counts its calls'
times) and by clients that read them (the bench subtracts two GetStatus answers to get a
time window's distribution, which a percentile since start-up cannot give).

Buckets grow by a factor of 2^(1/4) (19 %) from 0.05 ms to ~2 minutes: a percentile read
from them is within a bucket's width of the true one, and 86 counters per method are cheap
to keep and to send. Recording is a binary search and an increment under a lock."""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

_FIRST_MS = 0.05
_GROWTH = 2.0**0.25
_BUCKETS = 86  # the last bound is ~2 minutes (0.05 * 2^(85/4) ms)

# Upper bounds (ms) of the bounded buckets; one more bucket counts what lies above the last.
BUCKET_UPPER_MS: tuple[float, ...] = tuple(round(_FIRST_MS * _GROWTH**i, 6) for i in range(_BUCKETS))


def bucket_of(ms: float) -> int:
    """Index of the bucket a time falls in (bounds are inclusive)."""
    return bisect.bisect_left(BUCKET_UPPER_MS, ms)


def quantile(counts: Sequence[int], q: float, bounds: Sequence[float] = BUCKET_UPPER_MS) -> float:
    """The q-quantile (0..1) of the times counted in `counts` (one per bucket of `bounds`,
    plus the overflow bucket), interpolated linearly inside its bucket; 0.0 when nothing
    was counted. A quantile in the overflow bucket is reported as the last bound."""
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"{len(counts)} bucket counts for {len(bounds)} bounds (expected one more)")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is not within 0..1")
    total = sum(counts)
    if total <= 0:
        return 0.0
    rank = max(1.0, math.ceil(q * total))  # the rank-th smallest time, 1-based
    seen = 0
    for i, n in enumerate(counts):
        if n <= 0:
            continue
        if seen + n >= rank:
            if i == len(bounds):
                return float(bounds[-1])
            lower = bounds[i - 1] if i > 0 else 0.0
            return lower + (bounds[i] - lower) * (rank - seen) / n
        seen += n
    return float(bounds[-1])  # unreachable: rank <= total


@dataclass(frozen=True)
class Histogram:
    """Times counted so far: how many, the longest, and the count in each bucket (one per
    bound of BUCKET_UPPER_MS, plus the overflow bucket)."""

    count: int
    max_ms: float
    bucket_counts: tuple[int, ...]

    def quantile(self, q: float) -> float:
        """0.0 while nothing is counted; never above the largest time counted. Interpolated
        in its bucket, a p99 was reported above the max (CreateMemory p99 289.6 ms, max
        257.0: CLI probe)."""
        return min(quantile(self.bucket_counts, q), self.max_ms)


class LatencyHistogram:
    """One series of times, thread-safe (the probe's wake-ups, one method's calls)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._max_ms = 0.0
        self._buckets = [0] * (len(BUCKET_UPPER_MS) + 1)

    def record(self, ms: float) -> None:
        at = bucket_of(ms)
        with self._lock:
            self._count += 1
            self._max_ms = max(self._max_ms, ms)
            self._buckets[at] += 1

    def snapshot(self) -> Histogram:
        with self._lock:
            return Histogram(self._count, self._max_ms, tuple(self._buckets))


@dataclass(frozen=True)
class MethodTimes:
    """One method's calls so far."""

    method: str
    failed: int
    times: Histogram

    @property
    def calls(self) -> int:
        return self.times.count

    @property
    def max_ms(self) -> float:
        return self.times.max_ms

    @property
    def bucket_counts(self) -> tuple[int, ...]:
        return self.times.bucket_counts

    def quantile(self, q: float) -> float:
        return self.times.quantile(q)


class _Method:
    __slots__ = ("failed", "times")

    def __init__(self) -> None:
        self.failed = 0
        self.times = LatencyHistogram()


class CallTimes:
    """Server-side time of each method's calls since start-up, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._methods: dict[str, _Method] = {}

    def record(self, method: str, ms: float, ok: bool) -> None:
        with self._lock:
            m = self._methods.get(method)
            if m is None:
                m = self._methods[method] = _Method()
            m.failed += 0 if ok else 1
            m.times.record(ms)  # under the same lock: a snapshot never sees failed > calls

    def snapshot(self) -> list[MethodTimes]:
        """Every method called so far, by name."""
        with self._lock:
            return [
                MethodTimes(name, m.failed, m.times.snapshot()) for name, m in sorted(self._methods.items())
            ]
