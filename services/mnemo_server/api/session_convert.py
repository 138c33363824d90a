"""Protobuf <-> domain for sessions."""

from __future__ import annotations

from mnemo.v1 import memory_service_pb2 as pb
from mnemo_server.api import convert
from mnemo_server.sessions.service import BASELINE, FALLBACK, MODEL, SessionBundle
from mnemo_server.store.session_repo import SessionRow

_PATHS = {
    MODEL: pb.RANKING_PATH_MODEL,
    BASELINE: pb.RANKING_PATH_BASELINE,
    FALLBACK: pb.RANKING_PATH_FALLBACK,
}


def ranking_pb(s: SessionRow) -> pb.RankingDecision:
    return pb.RankingDecision(
        path=_PATHS.get(s.ranking_path, pb.RANKING_PATH_UNSPECIFIED),
        fallback_reason=s.fallback_reason,
        model_version=s.model_version,
        predictor_weight=s.predictor_weight,
        sidecar_ms=s.sidecar_ms,
        sidecar_deadline_ms=s.sidecar_deadline_ms,
        took_ms=s.took_ms,
    )


def injected_pb(b: SessionBundle) -> list[pb.InjectedMemory]:
    return [
        pb.InjectedMemory(
            memory=convert.memory_to_pb(x.memory),
            rank=x.rank,
            score=x.score,
            baseline_score=x.baseline_score,
            predictor_score=x.predictor_score,
            origin=x.origin,
            tokens=x.tokens,
        )
        for x in b.injected
    ]


def start_response(b: SessionBundle) -> pb.StartSessionResponse:
    s = b.session
    return pb.StartSessionResponse(
        session_id=s.id,
        memories=injected_pb(b),
        ranking=ranking_pb(s),
        token_budget=s.token_budget,
        tokens_used=s.tokens_used,
        dropped_count=s.dropped_count,
        context_text=b.context_text,
    )


def continuity_pb(items: list[tuple[str, float, str]]) -> list[pb.MemoryContinuity]:
    return [pb.MemoryContinuity(memory_id=m, relevance=r, source=src) for m, r, src in items]


def session_pb(b: SessionBundle) -> pb.Session:
    s = b.session
    out = pb.Session(
        session_id=s.id,
        agent_id=s.agent_id,
        persona_id=s.persona_id,
        project_id=s.project_id,
        context=s.context,
        state=pb.SESSION_STATE_ACTIVE if s.state == "active" else pb.SESSION_STATE_ENDED,
        ranking=ranking_pb(s),
        injected=injected_pb(b),
        continuity=continuity_pb(b.continuity),
        start_time=convert.ns_to_ts(s.start_time_ns),
        feedback_delivered=s.feedback_delivered,
    )
    if s.end_time_ns is not None:
        out.end_time.CopyFrom(convert.ns_to_ts(s.end_time_ns))
    return out
