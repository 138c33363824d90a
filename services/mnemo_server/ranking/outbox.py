"""Delivers session feedback from the DuckDB outbox to the sidecar, in the background.

EndSession commits the training session into the outbox in its own transaction, so the
caller never waits for the sidecar and a crash of either process loses nothing: rows stay
until the sidecar acknowledges them (the sidecar's store is idempotent by session id, so a
redelivery after a lost acknowledgement is harmless). Failures back off exponentially. A row
that can never be delivered (its payload does not decode, or the sidecar refuses it as
invalid) is parked with its error instead of being retried forever, so one damaged row
cannot hold back the others: kept for an operator, counted in GetStatus, and queued again
by AdminService.RetryUndeliverableFeedback once the cause is fixed."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo_server.config import RankingConfig
from mnemo_server.ranking.client import RankingClient
from mnemo_server.store import session_repo
from mnemo_server.store.database import Database, WriteDomain

log = logging.getLogger(__name__)


def to_request(tenant_id: str, payload: dict[str, Any]) -> rpb.SubmitTrainingPairsRequest:
    end = timestamp_pb2.Timestamp()
    end.FromNanoseconds(int(payload["end_time_ns"]))
    return rpb.SubmitTrainingPairsRequest(
        tenant_id=tenant_id,
        session=rpb.TrainingSession(
            session_id=payload["session_id"],
            query=payload["query"],
            feature_names=payload["feature_names"],
            end_time=end,
            candidates=[
                rpb.TrainingCandidate(
                    candidate=rpb.Candidate(
                        id=c["id"], text=c["text"], baseline_score=c["baseline_score"], features=c["features"]
                    ),
                    relevance=c["relevance"],
                    baseline_rank=c["baseline_rank"],
                    predictor_rank=c["predictor_rank"],
                )
                for c in payload["candidates"]
            ],
        ),
    )


class FeedbackDelivery:
    def __init__(self, db: Database, client: RankingClient, cfg: RankingConfig):
        self.db = db
        self.client = client
        self.cfg = cfg
        self.delivered = 0
        self.failed = 0
        self.parked = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def notify(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self._thread is None and self.client.enabled:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="mnemo-feedback-delivery", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._thread is not None:
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout_s)
            self._thread = None

    def pending(self) -> int:
        return session_repo.pending_count(self.db.reader())

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._wake.wait(self.cfg.delivery_interval_s):
                # Let the sessions ending meanwhile join this pass: their rows are marked
                # delivered in one transaction, under the write lock every session write takes.
                self._stop.wait(self.cfg.delivery_gather_s)
            self._wake.clear()
            try:
                self.deliver_due()
            except Exception:  # never let the loop die; rows stay in the outbox
                log.exception("feedback delivery pass failed")

    def deliver_due(self) -> int:
        """One pass: send what is due, then record the outcome in one transaction; returns
        how many were delivered. A crash before that transaction sends them again, which
        the sidecar takes as the same sessions (SubmitTrainingPairs is idempotent)."""
        delivered: dict[str, list[str]] = {}
        failed: tuple[session_repo.OutboxItem, int, str] | None = None
        for item in session_repo.due(self.db.reader(), time.time_ns(), 50):
            if self._stop.is_set():
                break
            try:
                request = to_request(item.tenant_id, session_repo.decode_payload(item.stored))
            except (ValueError, KeyError, TypeError, RecursionError) as exc:
                self._park(item, f"the payload does not decode: {type(exc).__name__}: {exc}")
                continue
            answer = self.client.submit(request, self.cfg.delivery_timeout_s)
            if answer.code == grpc.StatusCode.INVALID_ARGUMENT:
                # Sending the same pairs again gets the same answer.
                self._park(item, f"the sidecar refuses the pairs: {answer.detail}")
                continue
            if not answer.ok:
                backoff = min(self.cfg.delivery_max_backoff_s, 0.5 * 2 ** min(item.attempts, 10))
                failed = (item, time.time_ns() + int(backoff * 1e9), answer.fallback_reason)
                break  # the sidecar is unhappy: wait for the next pass instead of hammering it
            delivered.setdefault(item.tenant_id, []).append(item.session_id)
        if delivered or failed:
            now = time.time_ns()
            with self.db.transaction(WriteDomain.SESSIONS) as cur:
                for tenant_id, session_ids in delivered.items():
                    session_repo.mark_delivered(cur, tenant_id, session_ids, now)
                if failed is not None:
                    item, next_attempt_ns, reason = failed
                    session_repo.mark_failed(cur, item.tenant_id, item.session_id, next_attempt_ns, reason)
        sent = sum(len(ids) for ids in delivered.values())
        self.delivered += sent
        if failed is not None:
            self.failed += 1
        return sent

    def retry_parked(self) -> int:
        """Make the parked rows due again (an operator's call once their cause is fixed)."""
        with self.db.transaction(WriteDomain.SESSIONS) as cur:
            requeued = session_repo.unpark(cur, time.time_ns())
        if requeued:
            log.info("%d parked feedback session(s) queued again", requeued)
            self.notify()
        return requeued

    def _park(self, item: session_repo.OutboxItem, error: str) -> None:
        log.error("feedback of session %r (tenant %r) parked: %s", item.session_id, item.tenant_id, error)
        with self.db.transaction(WriteDomain.SESSIONS) as cur:
            session_repo.park(cur, item.tenant_id, item.session_id, error)
        self.parked += 1
