"""mnemo.v1.LearningService: protobuf in, domain call, protobuf out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import grpc

from mnemo.v1 import learning_service_pb2 as pb
from mnemo.v1 import learning_service_pb2_grpc as pb_grpc
from mnemo_server.api import convert
from mnemo_server.api.interceptor import current_principal
from mnemo_server.errors import InvalidArgument
from mnemo_server.learning.model import (
    CandidateDraft,
    CandidateState,
    Learning,
    LearningCandidate,
    LearningKind,
    LearningState,
)
from mnemo_server.learning.service import LearningService
from mnemo_server.tenancy.tenants import require_tenant

_KIND_TO_PB = {
    LearningKind.RUN_SUMMARY: pb.LEARNING_KIND_RUN_SUMMARY,
    LearningKind.FACT: pb.LEARNING_KIND_FACT,
    LearningKind.PREFERENCE: pb.LEARNING_KIND_PREFERENCE,
    LearningKind.DECISION: pb.LEARNING_KIND_DECISION,
    LearningKind.PROCEDURE: pb.LEARNING_KIND_PROCEDURE,
}
_KIND_FROM_PB = {v: k for k, v in _KIND_TO_PB.items()}
_CANDIDATE_STATE_TO_PB = {
    CandidateState.PENDING: pb.CANDIDATE_STATE_PENDING,
    CandidateState.PUBLISHED: pb.CANDIDATE_STATE_PUBLISHED,
    CandidateState.REJECTED: pb.CANDIDATE_STATE_REJECTED,
}
_CANDIDATE_STATE_FROM_PB = {v: k for k, v in _CANDIDATE_STATE_TO_PB.items()}
_LEARNING_STATE_TO_PB = {
    LearningState.ACTIVE: pb.LEARNING_STATE_ACTIVE,
    LearningState.REVOKED: pb.LEARNING_STATE_REVOKED,
    LearningState.SUPERSEDED: pb.LEARNING_STATE_SUPERSEDED,
}
_LEARNING_STATE_FROM_PB = {v: k for k, v in _LEARNING_STATE_TO_PB.items()}

_E = TypeVar("_E")


def _tenant() -> str:
    return require_tenant(current_principal())


def enum_from_pb(value: int, table: Mapping[Any, _E], field: str, what: str) -> _E | None:
    """The domain value of a proto enum; None for UNSPECIFIED (0). Proto3 enums are open, so
    a number this server does not know is the caller's error."""
    if value == 0:
        return None
    try:
        return table[value]
    except KeyError:
        raise InvalidArgument(field, f"unknown {what} {value}") from None


def _candidate_pb(c: LearningCandidate) -> pb.LearningCandidate:
    out = pb.LearningCandidate(
        id=c.id,
        scope=convert.scope_to_pb(c.scope),
        kind=_KIND_TO_PB[c.kind],
        content=c.content,
        confidence=c.confidence,
        source=convert.source_to_pb(c.source),
        evidence_refs=list(c.evidence_refs),
        state=_CANDIDATE_STATE_TO_PB[c.state],
        review_reason=c.review_reason,
        learning_id=c.learning_id,
        create_time=convert.ns_to_ts(c.create_time_ns),
    )
    if c.review_time_ns is not None:
        out.review_time.CopyFrom(convert.ns_to_ts(c.review_time_ns))
    return out


def _learning_pb(lr: Learning) -> pb.Learning:
    return pb.Learning(
        id=lr.id,
        scope=convert.scope_to_pb(lr.scope),
        kind=_KIND_TO_PB[lr.kind],
        content=lr.content,
        confidence=lr.confidence,
        state=_LEARNING_STATE_TO_PB[lr.state],
        candidate_id=lr.candidate_id,
        supersedes_id=lr.supersedes_id,
        superseded_by_id=lr.superseded_by_id,
        revoke_reason=lr.revoke_reason,
        create_time=convert.ns_to_ts(lr.create_time_ns),
        update_time=convert.ns_to_ts(lr.update_time_ns),
    )


def _draft(c: pb.LearningCandidate) -> CandidateDraft:
    return CandidateDraft(
        kind=enum_from_pb(c.kind, _KIND_FROM_PB, "candidate.kind", "learning kind"),
        content=c.content,
        scope=convert.scope_from_pb(c.scope, "candidate.scope", present=c.HasField("scope")),
        # proto3 floats carry no presence: 0 is "unset", which means full confidence.
        confidence=c.confidence if c.confidence != 0 else 1.0,
        source=convert.source_from_pb(c.source),
        evidence_refs=tuple(c.evidence_refs),
    )


class LearningServicer(pb_grpc.LearningServiceServicer):
    def __init__(self, learnings: LearningService):
        self.learnings = learnings

    def CreateLearningCandidate(
        self, request: pb.CreateLearningCandidateRequest, context: grpc.ServicerContext
    ) -> pb.CreateLearningCandidateResponse:
        tenant = _tenant()
        self.learnings.validator.request_id(request.request_id)
        created = self.learnings.create_candidate(
            tenant,
            _draft(request.candidate),
            key=convert.idempotency_key("CreateLearningCandidate", request, request.request_id),
        )
        return pb.CreateLearningCandidateResponse(candidate=_candidate_pb(created))

    def GetLearningCandidate(
        self, request: pb.GetLearningCandidateRequest, context: grpc.ServicerContext
    ) -> pb.GetLearningCandidateResponse:
        found = self.learnings.get_candidate(_tenant(), request.id)
        return pb.GetLearningCandidateResponse(candidate=_candidate_pb(found))

    def ListLearningCandidates(
        self, request: pb.ListLearningCandidatesRequest, context: grpc.ServicerContext
    ) -> pb.ListLearningCandidatesResponse:
        tenant = _tenant()
        state = enum_from_pb(request.state, _CANDIDATE_STATE_FROM_PB, "state", "candidate state")
        rows, token = self.learnings.list_candidates(
            tenant, state=state, page_size=request.page_size, page_token=request.page_token
        )
        return pb.ListLearningCandidatesResponse(
            candidates=[_candidate_pb(c) for c in rows], next_page_token=token
        )

    def PublishLearningCandidate(
        self, request: pb.PublishLearningCandidateRequest, context: grpc.ServicerContext
    ) -> pb.PublishLearningCandidateResponse:
        tenant = _tenant()
        self.learnings.validator.request_id(request.request_id)
        result = self.learnings.publish_candidate(
            tenant,
            request.id,
            reason=request.reason,
            supersedes_id=request.supersedes_id,
            key=convert.idempotency_key("PublishLearningCandidate", request, request.request_id),
        )
        return pb.PublishLearningCandidateResponse(
            candidate=_candidate_pb(result.candidate), learning=_learning_pb(result.learning)
        )

    def RejectLearningCandidate(
        self, request: pb.RejectLearningCandidateRequest, context: grpc.ServicerContext
    ) -> pb.RejectLearningCandidateResponse:
        self.learnings.validator.request_id(request.request_id)
        rejected = self.learnings.reject_candidate(
            _tenant(),
            request.id,
            request.reason,
            key=convert.idempotency_key("RejectLearningCandidate", request, request.request_id),
        )
        return pb.RejectLearningCandidateResponse(candidate=_candidate_pb(rejected))

    def GetLearning(
        self, request: pb.GetLearningRequest, context: grpc.ServicerContext
    ) -> pb.GetLearningResponse:
        found = self.learnings.get_learning(_tenant(), request.id)
        return pb.GetLearningResponse(learning=_learning_pb(found))

    def ListLearnings(
        self, request: pb.ListLearningsRequest, context: grpc.ServicerContext
    ) -> pb.ListLearningsResponse:
        tenant = _tenant()
        state = enum_from_pb(request.state, _LEARNING_STATE_FROM_PB, "state", "learning state")
        kind = enum_from_pb(request.kind, _KIND_FROM_PB, "kind", "learning kind")
        rows, token = self.learnings.list_learnings(
            tenant, state=state, kind=kind, page_size=request.page_size, page_token=request.page_token
        )
        return pb.ListLearningsResponse(learnings=[_learning_pb(lr) for lr in rows], next_page_token=token)

    def RevokeLearning(
        self, request: pb.RevokeLearningRequest, context: grpc.ServicerContext
    ) -> pb.RevokeLearningResponse:
        self.learnings.validator.request_id(request.request_id)
        revoked = self.learnings.revoke_learning(
            _tenant(),
            request.id,
            request.reason,
            key=convert.idempotency_key("RevokeLearning", request, request.request_id),
        )
        return pb.RevokeLearningResponse(learning=_learning_pb(revoked))
