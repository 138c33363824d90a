"""Protobuf <-> domain for the ranking contract, with input validation that names fields."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence

from google.protobuf import timestamp_pb2

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo_server.api.convert import ts_to_ns
from mnemo_server.errors import FieldViolation, InvalidArgument
from mnemo_sidecar.learning.health import Health
from mnemo_sidecar.learning.model import (
    Candidate,
    FeedbackCandidate,
    FeedbackSession,
    ModelKind,
    TrainingOutcome,
)
from mnemo_sidecar.learning.registry import Residency

_TENANT = re.compile(r"[a-z0-9_][a-z0-9_-]{0,63}")
KINDS = {rpb.MODEL_KIND_CROSS_ENCODER: ModelKind.CROSS_ENCODER, rpb.MODEL_KIND_RANKER: ModelKind.RANKER}
KINDS_PB = {v: k for k, v in KINDS.items()}
MAX_SESSION_ID_CHARS = 1_024  # the server sends ids of up to limits.max_request_id_chars (128)


def model_kinds(values: Sequence[rpb.ModelKind]) -> set[ModelKind]:
    """The models a Train request names; none named: both."""
    unknown = [int(v) for v in values if v not in KINDS]
    if unknown:
        raise InvalidArgument("models", f"unknown model kind(s) {unknown}: cross-encoder (1) or ranker (2)")
    return {KINDS[v] for v in values} or set(ModelKind)


def tenant_of(tenant_id: str) -> str:
    if not _TENANT.fullmatch(tenant_id):
        raise InvalidArgument("tenant_id", "must be 1-64 characters of [a-z0-9_-]")
    return tenant_id


def query(text: str, field: str, max_chars: int) -> str:
    if len(text) > max_chars:
        raise InvalidArgument(field, f"longer than {max_chars} characters")
    return text


def repeats(values: Sequence[str]) -> Iterator[tuple[int, int]]:
    """(index, index of its first occurrence) of each value seen before."""
    first: dict[str, int] = {}
    for i, value in enumerate(values):
        if first.setdefault(value, i) != i:
            yield i, first[value]


def feature_names(names: Sequence[str], field: str) -> list[str]:
    """The names, each once: a feature named twice could not be told apart from its twin."""
    out = [FieldViolation(f"{field}[{i}]", f"repeats {field}[{j}] ({names[i]!r})") for i, j in repeats(names)]
    if out:
        raise InvalidArgument.many(out)
    return list(names)


def candidates(
    items: list[rpb.Candidate], field: str, n_features: int | None, cap: int, max_text_chars: int
) -> list[Candidate]:
    """Scores go back by id, and a session's pairs are keyed by it: an id twice is refused."""
    if len(items) > cap:
        raise InvalidArgument(
            field, f"holds {len(items)} candidates; the limit is {cap}", reason="TOO_MANY_CANDIDATES"
        )
    ids = [c.id for c in items]
    out = [FieldViolation(f"{field}[{i}].id", f"repeats {field}[{j}].id") for i, j in repeats(ids) if ids[i]]
    for i, c in enumerate(items):
        if not c.id:
            out.append(FieldViolation(f"{field}[{i}].id", "is required"))
        if len(c.text) > max_text_chars:
            out.append(FieldViolation(f"{field}[{i}].text", f"longer than {max_text_chars} characters"))
        if not math.isfinite(c.baseline_score):
            out.append(FieldViolation(f"{field}[{i}].baseline_score", "must be a finite number"))
        if n_features is not None and len(c.features) != n_features:
            out.append(
                FieldViolation(
                    f"{field}[{i}].features", f"has {len(c.features)} values for {n_features} feature names"
                )
            )
        # NaN is a missing value to the ranker; an infinity is no value at all.
        if any(map(math.isinf, c.features)):
            out.append(FieldViolation(f"{field}[{i}].features", "must not hold an infinity (NaN: missing)"))
    if out:
        raise InvalidArgument.many(out)
    return [Candidate(c.id, c.text, c.baseline_score, tuple(c.features)) for c in items]


def feedback_session(s: rpb.TrainingSession, cap: int, max_text_chars: int) -> FeedbackSession:
    if not s.session_id:
        raise InvalidArgument("session.session_id", "is required")
    query(s.query, "session.query", max_text_chars)
    feature_names(s.feature_names, "session.feature_names")
    items = candidates(
        [c.candidate for c in s.candidates], "session.candidates", len(s.feature_names), cap, max_text_chars
    )
    if len(s.session_id) > MAX_SESSION_ID_CHARS:
        raise InvalidArgument("session.session_id", f"longer than {MAX_SESSION_ID_CHARS} characters")
    end_time_ns = ts_to_ns(s.end_time, "session.end_time")
    out: list[FieldViolation] = []
    for i, c in enumerate(s.candidates):
        if not -1.0 <= c.relevance <= 1.0:
            out.append(FieldViolation(f"session.candidates[{i}].relevance", "must be between -1 and 1"))
        for name in ("baseline_rank", "predictor_rank"):
            if getattr(c, name) < 0:
                out.append(
                    FieldViolation(f"session.candidates[{i}].{name}", "must be 0 (none) or a 1-based rank")
                )
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
        end_time_ns,
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


def residency_pb(r: Residency) -> rpb.ResidentModels:
    return rpb.ResidentModels(in_memory=r.in_memory, max_resident=r.bound, loads=r.loads, drops=r.drops)


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
