"""The server's client for the ranking sidecar. Every call carries a deadline no longer
than the budget it is given; failures open a circuit breaker; the caller always gets either
the sidecar's answer or a fallback reason (and counts of each reason) — never an error.
While the circuit is open, the sidecar's health is probed in the background (breaker.py)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo.ranking.v1 import ranking_service_pb2_grpc as rpb_grpc
from mnemo_server.config import RankingConfig
from mnemo_server.ranking.breaker import CircuitBreaker

T = TypeVar("T")
# Below this there is no point sending a call at all.
MIN_BUDGET_S = 0.002
# The service a probe asks the sidecar's grpc.health.v1 about.
RANKING_SERVICE = rpb.DESCRIPTOR.services_by_name["RankingService"].full_name


# Of a caller's deadline, the share kept back for the reply's way back, at least
# ranking.deadline_margin_ms. Missing the caller's own deadline fails the call, where the
# server's budgets are latency goals, and the way back grows with the load: 20-25 ms on a
# machine loaded 3-4 times over, where 4-6 of 30 StartSessions with a 0.3 s deadline failed
# with a 10 ms margin (cold-start probe, /work/exp60/cold/coldstart.py).
CALLER_DEADLINE_MARGIN_SHARE = 0.1


def reply_margin_s(cfg: RankingConfig, caller_remaining_s: float | None) -> float:
    """What a sidecar budget keeps back of the caller's remaining deadline for the reply."""
    margin_s = cfg.deadline_margin_ms / 1000.0
    if caller_remaining_s is None:
        return margin_s
    return max(margin_s, CALLER_DEADLINE_MARGIN_SHARE * caller_remaining_s)


def reconnect_backoff_ms(cfg: RankingConfig) -> int:
    """The longest the channel waits between attempts to reach a sidecar that is down.

    gRPC's default grows to 120 s, and while it waits every call and probe on the channel
    fails at once: after a 4-minute outage a restarted sidecar was found 54.6 s late, against
    3.5 s with a 5 s cap (a channel to a port with nothing listening, asked for health every
    0.5 s, then a server started there; one run each). Capped at the breaker's cooldown
    (1 s at least), the channel tries about as often as the breaker probes."""
    return max(1000, int(cfg.breaker_cooldown_s * 1000))


_REASONS = {
    grpc.StatusCode.DEADLINE_EXCEEDED: "deadline",
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "overloaded",
    grpc.StatusCode.CANCELLED: "cancelled",
}
# Answers about the request, not the sidecar's health: it is up and answering. Counted as
# failures, a run of outbox payloads it refuses would open the circuit for every StartSession.
_REQUEST_ERRORS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.ABORTED,
    }
)


@dataclass(frozen=True)
class SidecarAnswer(Generic[T]):
    value: T | None
    fallback_reason: str
    elapsed_ms: float
    code: grpc.StatusCode | None = None  # the sidecar's error status, if it answered with one
    detail: str = ""  # and its own words with it
    called: bool = True  # False: not sent at all (no sidecar, circuit open, no time left)

    @property
    def ok(self) -> bool:
        return self.value is not None


def _cut_texts(has_query: Any, candidates: Iterable[rpb.Candidate], limit: int) -> None:
    """Within the sidecar's text limit (ranking.max_text_chars), in place."""
    if len(has_query.query) > limit:
        has_query.query = has_query.query[:limit]
    for c in candidates:
        if len(c.text) > limit:
            c.text = c.text[:limit]


class RankingClient:
    def __init__(self, cfg: RankingConfig, clock: Callable[[], float] = time.perf_counter):
        self.cfg = cfg
        self.breaker = CircuitBreaker(cfg.breaker_failures, cfg.breaker_cooldown_s)
        # Calls that failed or were not made, by "Method:reason" (GetStatus.sidecar_call_failures).
        self.call_failures: Counter[str] = Counter()
        self._clock = clock
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: rpb_grpc.RankingServiceStub | None = None
        self._metadata = (("authorization", f"Bearer {cfg.auth_token}"),) if cfg.auth_token else ()

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.sidecar_address)

    def _connect(self) -> tuple[grpc.Channel, rpb_grpc.RankingServiceStub]:
        with self._lock:
            if self._channel is None or self._stub is None:
                self._channel = grpc.insecure_channel(
                    self.cfg.sidecar_address,
                    options=[("grpc.max_reconnect_backoff_ms", reconnect_backoff_ms(self.cfg))],
                )
                self._stub = rpb_grpc.RankingServiceStub(self._channel)
            return self._channel, self._stub

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._stub = None

    def failures(self) -> dict[str, int]:
        """Calls that failed or were not made, by "Method:reason"."""
        with self._lock:
            return dict(self.call_failures)

    def _fallback(
        self,
        name: str,
        reason: str,
        started: float,
        code: grpc.StatusCode | None = None,
        detail: str = "",
        called: bool = True,
    ) -> SidecarAnswer[T]:
        with self._lock:
            self.call_failures[f"{name}:{reason}"] += 1
        return SidecarAnswer(None, reason, (self._clock() - started) * 1000.0, code, detail, called)

    def _call(
        self, name: str, request: object, budget_s: float, caller_limited: bool = False
    ) -> SidecarAnswer[T]:
        """`caller_limited`: the caller's deadline or choice cut the budget below the
        server's own for such a call, so a timeout may be the caller's doing: it is checked
        against the sidecar's health instead of counted (breaker.py)."""
        started = self._clock()
        if not self.enabled:
            return self._fallback(name, "no_sidecar", started, called=False)
        if not self.breaker.allow():
            if self.breaker.take_probe():
                self._in_background(self._probe, "mnemo-sidecar-probe")
            return self._fallback(name, "circuit_open", started, called=False)
        if budget_s < MIN_BUDGET_S:
            return self._fallback(name, "no_time", started, called=False)
        try:
            method = getattr(self._connect()[1], name)
            value: T = method(request, timeout=budget_s, metadata=self._metadata)
        except grpc.RpcError as err:
            code = err.code()
            if code in _REQUEST_ERRORS:
                self.breaker.record_success()
            elif caller_limited and code is grpc.StatusCode.DEADLINE_EXCEEDED:
                if self.breaker.take_check():
                    self._in_background(self._check, "mnemo-sidecar-check")
            else:
                self.breaker.record_failure()
            return self._fallback(
                name, _REASONS.get(code, f"error:{code.name}"), started, code, err.details() or ""
            )
        self.breaker.record_success()
        return SidecarAnswer(value, "", (self._clock() - started) * 1000.0)

    @staticmethod
    def _in_background(work: Callable[[], None], name: str) -> None:
        threading.Thread(target=work, name=name, daemon=True).start()

    def _serving(self) -> bool:
        """Does the sidecar say it is serving, within breaker_probe_timeout_s?"""
        try:
            # The typing stubs for grpc_health declare HealthStub without its methods.
            stub: Any = health_pb2_grpc.HealthStub(self._connect()[0])
            request = health_pb2.HealthCheckRequest(service=RANKING_SERVICE)
            reply = stub.Check(request, timeout=self.cfg.breaker_probe_timeout_s, metadata=self._metadata)
        except (grpc.RpcError, ValueError):  # ValueError: the channel was closed under it
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def _probe(self) -> None:
        """Is the sidecar back? Asked off every caller's path; the answer closes the
        circuit or starts another cooldown. Whatever happens, the probe is over: one left
        taken would keep the circuit open for good."""
        serving = False
        try:
            serving = self._serving()
        finally:
            if serving:
                self.breaker.probe_succeeded()
            else:
                self.breaker.probe_failed()

    def _check(self) -> None:
        """Is a caller-limited timeout the sidecar's fault? Asked off the caller's path; the
        check is over whatever happens (one left taken would stop every later check)."""
        healthy = False
        try:
            healthy = self._serving()
        finally:
            self.breaker.check_done(healthy)

    def score(
        self, request: rpb.ScoreRequest, budget_s: float, caller_limited: bool = False
    ) -> SidecarAnswer[rpb.ScoreResponse]:
        _cut_texts(request, request.candidates, self.cfg.max_text_chars)
        return self._call("Score", request, budget_s, caller_limited)

    def rerank(
        self, request: rpb.RerankRequest, budget_s: float, caller_limited: bool = False
    ) -> SidecarAnswer[rpb.RerankResponse]:
        _cut_texts(request, request.candidates, self.cfg.max_text_chars)
        return self._call("Rerank", request, budget_s, caller_limited)

    def submit(
        self, request: rpb.SubmitTrainingPairsRequest, timeout_s: float
    ) -> SidecarAnswer[rpb.SubmitTrainingPairsResponse]:
        session = request.session
        _cut_texts(session, [c.candidate for c in session.candidates], self.cfg.max_text_chars)
        return self._call("SubmitTrainingPairs", request, timeout_s)

    def model_status(
        self, tenant_id: str, timeout_s: float = 2.0
    ) -> SidecarAnswer[rpb.GetModelStatusResponse]:
        return self._call("GetModelStatus", rpb.GetModelStatusRequest(tenant_id=tenant_id), timeout_s)
