"""The server's circuit breaker for sidecar calls (closed -> open -> half-open probe)."""

from __future__ import annotations

from mnemo_server.ranking.breaker import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_consecutive_failures_and_probes_after_cooldown() -> None:
    clock = Clock()
    b = CircuitBreaker(failures=3, cooldown_s=5.0, clock=clock)
    for _ in range(2):
        assert b.allow()
        b.record_failure()
    b.record_success()  # a success resets the count
    for _ in range(3):
        assert b.allow()
        b.record_failure()
    assert b.state is BreakerState.OPEN and not b.allow() and b.opened_count == 1
    clock.now = 5.1
    assert b.state is BreakerState.HALF_OPEN
    assert b.allow() and not b.allow()  # one probe at a time
    b.record_failure()  # the probe failed: open again for another cooldown
    assert b.state is BreakerState.OPEN and b.opened_count == 2
    clock.now = 10.3
    assert b.allow()
    b.record_success()
    assert b.state is BreakerState.CLOSED and b.allow()
