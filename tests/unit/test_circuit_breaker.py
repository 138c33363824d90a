"""The server's circuit breaker for sidecar calls (closed -> open -> half-open probe)."""

from __future__ import annotations

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo_server.config import RankingConfig
from mnemo_server.ranking.breaker import BreakerState, CircuitBreaker
from mnemo_server.ranking.client import RankingClient


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


def test_no_time_with_the_circuit_open_counts_as_circuit_open() -> None:
    """Out of time and circuit open: no call would go out either way; the open circuit is
    the reason reported, and a half-open breaker's probe is not taken by a call that has no
    time to make it."""
    client = RankingClient(
        RankingConfig(sidecar_address="127.0.0.1:1", breaker_failures=1, breaker_cooldown_s=60)
    )
    request = rpb.ScoreRequest(tenant_id="t")
    assert client.score(request, 0.0).fallback_reason == "no_time"  # closed: just no time
    client.breaker.record_failure()
    assert client.breaker.state is BreakerState.OPEN
    assert client.score(request, 0.0).fallback_reason == "circuit_open"
    assert client.fallbacks == {"no_time": 1, "circuit_open": 1}

    clock = Clock()
    half_open = CircuitBreaker(failures=1, cooldown_s=5.0, clock=clock)
    half_open.record_failure()
    clock.now = 6.0
    client.breaker = half_open
    assert client.score(request, 0.0).fallback_reason == "no_time"
    assert half_open.allow()  # the probe is still there for a call with time
