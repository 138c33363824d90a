"""Protobuf <-> domain for the ranking contract, with input validation that names fields."""

from __future__ import annotations

import re

from google.protobuf import timestamp_pb2

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo_server.errors import FieldViolation, InvalidArgument
from mnemo_sidecar.learning.health import Health
from mnemo_sidecar.learning.model import (
    Candidate,
    FeedbackCandidate,
    FeedbackSession,
    ModelKind,
    TrainingOutcome,
)

_TENANT = re.compile(r"[a-z0-9_][a-z0-9_-]{0,63}")
KINDS = {rpb.MODEL_KIND_CROSS_ENCODER: ModelKind.CROSS_ENCODER, rpb.MODEL_KIND_RANKER: ModelKind.RANKER}
KINDS_PB = {v: k for k, v in KINDS.items()}


def tenant_of(tenant_id: str) -> str:
    if not _TENANT.fullmatch(tenant_id):
        raise InvalidArgument("tenant_id", "must be 1-64 characters of [a-z0-9_-]")
    return tenant_id


def candidates(items: list[rpb.Candidate], field: str, n_features: int | None, cap: int) -> list[Candidate]:
    if len(items) > cap:
        raise InvalidArgument(
            field, f"holds {len(items)} candidates; the limit is {cap}", reason="TOO_MANY_CANDIDATES"
        )
    out: list[FieldViolation] = []
    for i, c in enumerate(items):
        if not c.id:
            out.append(FieldViolation(f"{field}[{i}].id", "is required"))
        if n_features is not None and len(c.features) != n_features:
            out.append(
                FieldViolation(
                    f"{field}[{i}].features", f"has {len(c.features)} values for {n_features} feature names"
                )
            )
    if out:
        raise InvalidArgument.many(out)
    return [Candidate(c.id, c.text, c.baseline_score, tuple(c.features)) for c in items]


def feedback_session(s: rpb.TrainingSession, cap: int) -> FeedbackSession:
    if not s.session_id:
        raise InvalidArgument("session.session_id", "is required")
    items = candidates([c.candidate for c in s.candidates], "session.candidates", len(s.feature_names), cap)
    out = [
        FieldViolation(f"session.candidates[{i}].relevance", "must be between -1 and 1")
        for i, c in enumerate(s.candidates)
        if not -1.0 <= c.relevance <= 1.0
    ]
    if out:
        raise InvalidArgument.many(out)
    return FeedbackSession(
        s.session_id,
        s.query,
        tuple(s.feature_names),
        tuple(
            FeedbackCandidate(item, c.relevance, c.baseline_rank, c.predictor_rank)
            for item, c in zip(items, s.candidates, strict=True)
        ),
        s.end_time.ToNanoseconds(),
    )


def health_pb(h: Health) -> rpb.HealthSnapshot:
    return rpb.HealthSnapshot(
        sessions=h.sessions,
        win_ema=h.win_ema,
        predictor_weight=h.predictor_weight,
        drift=h.drift,
        window_win_rate=h.window_win_rate,
        window_predictor_ndcg=h.window_predictor_ndcg,
        window_baseline_ndcg=h.window_baseline_ndcg,
    )


def outcome_pb(o: TrainingOutcome) -> rpb.TrainingOutcome:
    finish = timestamp_pb2.Timestamp()
    finish.FromNanoseconds(o.finish_time_ns)
    return rpb.TrainingOutcome(
        model=KINDS_PB[o.model],
        candidate_version=o.candidate_version,
        promoted=o.promoted,
        heldout_sessions=o.heldout_sessions,
        candidate_ndcg=o.candidate_ndcg,
        current_ndcg=o.current_ndcg,
        baseline_ndcg=o.baseline_ndcg,
        reason=o.reason,
        train_seconds=o.train_seconds,
        train_pairs=o.train_pairs,
        finish_time=finish,
    )
