"""A circuit breaker for calls to the sidecar: after `failures` consecutive failures it
opens and calls are refused at once (the caller uses its baseline). After `cooldown_s` the
client probes the sidecar in the background (`take_probe`, then `probe_succeeded` or
`probe_failed`); callers are still refused meanwhile.

Why the probe is not a caller's own call: a stopped sidecar (SIGSTOP, a long pause) makes a
probing call wait for its whole deadline, so every cooldown one StartSession paid the full
budget. In the bench's minute with the sidecar stopped, those probes were most of the
StartSessions that hit the deadline (17 of ~1,300: past the 1 % a p99 can hide). A probe of
its own costs the callers nothing.

A probe asks the sidecar's health, not for scores, so a sidecar that answers it but still
fails its calls (a model too slow for the deadline) closes the circuit on probation: its
next failure opens it again at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    # The cooldown is over: a probe is due or on its way; calls are still refused.
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(self, failures: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic):
        self.failures = failures
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._consecutive = 0
        self._opened_at: float | None = None
        self._probing = False
        self._checking = False
        self.opened_count = 0

    @property
    def state(self) -> BreakerState:
        with self._lock:
            return self._state()

    def _state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._clock() - self._opened_at >= self.cooldown_s:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def allow(self) -> bool:
        """May a call go out now? Only with the circuit closed."""
        with self._lock:
            return self._opened_at is None

    def take_probe(self) -> bool:
        """True once per cooldown, for the one who is to send the probe."""
        with self._lock:
            if self._state() is not BreakerState.HALF_OPEN or self._probing:
                return False
            self._probing = True
            return True

    def probe_succeeded(self) -> None:
        """Closed again, on probation: the next failure opens it at once."""
        with self._lock:
            self._opened_at = None
            self._probing = False
            self._consecutive = max(self.failures - 1, 0)

    def probe_failed(self) -> None:
        with self._lock:
            self._open()
            self._probing = False

    def take_check(self) -> bool:
        """True for the one to check the sidecar's health after a timeout that may be the
        caller's doing: one check at a time, and none while the circuit is open."""
        with self._lock:
            if self._opened_at is not None or self._checking:
                return False
            self._checking = True
            return True

    def check_done(self, healthy: bool) -> None:
        with self._lock:
            self._checking = False
            if not healthy and self._opened_at is None:
                self._open()

    def record_success(self) -> None:
        with self._lock:
            self._consecutive = 0

    def record_failure(self) -> None:
        with self._lock:
            self._consecutive += 1
            # A call sent before the circuit opened may fail after it: it does not start
            # another cooldown.
            if self._opened_at is None and self._consecutive >= self.failures:
                self._open()

    def _open(self) -> None:
        self._opened_at = self._clock()
        self.opened_count += 1
