"""The server's circuit breaker for sidecar calls (closed -> open -> half-open probe)."""

from __future__ import annotations

import time

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
    assert not b.take_probe()  # closed: nothing to probe
    for _ in range(3):
        assert b.allow()
        b.record_failure()
    assert b.state is BreakerState.OPEN and not b.allow() and b.opened_count == 1
    assert not b.take_probe()  # not before the cooldown
    b.record_failure()  # a call sent before it opened fails late: no new cooldown
    assert b.opened_count == 1
    clock.now = 5.1
    assert b.state is BreakerState.HALF_OPEN
    assert not b.allow()  # callers are still refused: the probe is the breaker's own
    assert b.take_probe() and not b.take_probe()  # one probe at a time
    b.probe_failed()  # open again for another cooldown
    assert b.state is BreakerState.OPEN and b.opened_count == 2 and not b.take_probe()
    clock.now = 10.3
    assert b.take_probe()
    b.probe_succeeded()
    assert b.state is BreakerState.CLOSED and b.allow()
    b.record_failure()  # on probation: the first failure after a probe opens it at once
    assert b.state is BreakerState.OPEN and b.opened_count == 3
    clock.now = 15.5
    assert b.take_probe()
    b.probe_succeeded()
    b.record_success()  # a call got through: probation is over
    b.record_failure()
    b.record_failure()
    assert b.state is BreakerState.CLOSED


def test_no_time_with_the_circuit_open_counts_as_circuit_open_and_still_probes() -> None:
    """Out of time and circuit open: no call would go out either way; the open circuit is
    the reason reported. A call finding the cooldown over starts the background probe, with
    or without time of its own, and returns at once."""
    client = RankingClient(
        RankingConfig(sidecar_address="127.0.0.1:1", breaker_failures=1, breaker_cooldown_s=60)
    )
    request = rpb.ScoreRequest(tenant_id="t")
    assert client.score(request, 0.0).fallback_reason == "no_time"  # closed: just no time
    client.breaker.record_failure()
    assert client.breaker.state is BreakerState.OPEN
    assert client.score(request, 0.0).fallback_reason == "circuit_open"
    assert client.call_failures == {"Score:no_time": 1, "Score:circuit_open": 1}

    clock = Clock()
    half_open = CircuitBreaker(failures=1, cooldown_s=5.0, clock=clock)
    half_open.record_failure()
    clock.now = 6.0
    client.breaker = half_open
    answer = client.score(request, 0.0)
    assert answer.fallback_reason == "circuit_open" and answer.elapsed_ms < 50
    # Nothing listens on port 1: the probe fails and a new cooldown starts.
    deadline = time.monotonic() + 10
    while half_open.opened_count < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert half_open.opened_count == 2 and half_open.state is BreakerState.OPEN
    client.close()


def test_a_health_check_runs_one_at_a_time_while_closed_and_opens_the_circuit_if_it_fails() -> None:
    b = CircuitBreaker(failures=3, cooldown_s=5.0, clock=Clock())
    assert b.take_check() and not b.take_check()  # one at a time
    b.check_done(healthy=True)
    assert b.state is BreakerState.CLOSED and b.opened_count == 0
    b.record_failure()
    b.record_failure()
    assert b.take_check()
    b.check_done(healthy=True)  # a healthy answer does not forgive the calls' own failures
    b.record_failure()
    assert b.state is BreakerState.OPEN and b.opened_count == 1
    assert not b.take_check()  # open: the cooldown's probe is what asks next
    b.probe_succeeded()
    assert b.take_check()
    b.check_done(healthy=False)  # no answer: open at once
    assert b.state is BreakerState.OPEN and b.opened_count == 2
