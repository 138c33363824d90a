"""How long StartSession's own work takes once the sidecar has answered: fusing, packing and
recording the session (a group commit that waits behind others under load). The sidecar's
budget is what is left of the deadline after that work and the reply's margin, so that the
call as a whole ends within its deadline.

A fixed margin of 10 ms was too little: with the caller's deadline binding and the sidecar
stopped, the work after the sidecar's full budget took 12-16 ms and 2-3 of 6 StartSessions
with an 80 ms deadline failed DEADLINE_EXCEEDED at 82-86 ms (probe), where a baseline
bundle was due. The recent 95th percentile of the measured time is kept instead, as the
machine's load makes it. It is measured from the sidecar's answer, or from the end of its
budget when the answer (a timeout) came later: on a loaded machine the timeout fired 5-13 ms
late, time the deadline pays for as surely."""

from __future__ import annotations

import threading
from collections import deque


class TimeAfterRanking:
    def __init__(
        self, samples: int = 256, quantile: float = 0.95, prior_s: float = 0.020, min_samples: int = 16
    ):
        """`prior_s`: what is assumed until `min_samples` calls have been measured."""
        self._samples: deque[float] = deque(maxlen=samples)
        self._quantile = quantile
        self._prior_s = prior_s
        self._min_samples = min_samples
        self._lock = threading.Lock()
        self._high_s = prior_s
        self._added = 0

    def add(self, seconds: float) -> None:
        with self._lock:
            self._samples.append(seconds)
            self._added += 1
            # Sorted again every 8 calls, not on every one: the figure moves slowly anyway.
            if len(self._samples) >= self._min_samples and self._added % 8 == 0:
                ordered = sorted(self._samples)
                self._high_s = ordered[int(self._quantile * (len(ordered) - 1))]

    def high_s(self) -> float:
        """The time to keep for the work after the sidecar's answer (the recent quantile)."""
        return self._high_s
