"""Plain domain types for the learning review workflow: a candidate is proposed, then
published as a learning or rejected; a learning can later be superseded or revoked.
Times are integer nanoseconds since the Unix epoch (UTC), as for memories."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from mnemo_server.memory.model import Scope, Source


class LearningKind(StrEnum):
    # Made by the daemon from a finished run; never accepted from API callers.
    RUN_SUMMARY = "run_summary"
    FACT = "fact"
    PREFERENCE = "preference"
    DECISION = "decision"
    PROCEDURE = "procedure"


class CandidateState(StrEnum):
    PENDING = "pending"
    PUBLISHED = "published"
    REJECTED = "rejected"


class LearningState(StrEnum):
    ACTIVE = "active"
    REVOKED = "revoked"
    SUPERSEDED = "superseded"


class Origin(StrEnum):
    """Who proposed a candidate: an API caller or the server's own daemon."""

    API = "api"
    DAEMON = "daemon"


class SubjectKind(StrEnum):
    """What a lifecycle event is about (lifecycle_events.subject_kind)."""

    CANDIDATE = "learning_candidate"
    LEARNING = "learning"
    SKILL = "skill"


@dataclass(frozen=True)
class CandidateDraft:
    """What a caller proposes; server-owned fields are absent. kind None means the caller
    left it unset, which validation reports."""

    kind: LearningKind | None
    content: str
    scope: Scope = field(default_factory=Scope.workspace)
    confidence: float = 1.0
    source: Source = field(default_factory=Source)
    evidence_refs: tuple[str, ...] = ()


@dataclass(frozen=True)
class LearningCandidate:
    id: str
    tenant_id: str
    scope: Scope
    kind: LearningKind
    content: str
    confidence: float
    source: Source
    evidence_refs: tuple[str, ...]
    origin: Origin
    state: CandidateState
    create_time_ns: int
    review_reason: str = ""
    # Set once published: the learning it became.
    learning_id: str = ""
    review_time_ns: int | None = None


@dataclass(frozen=True)
class Learning:
    id: str
    tenant_id: str
    scope: Scope
    kind: LearningKind
    content: str
    confidence: float
    state: LearningState
    candidate_id: str
    create_time_ns: int
    update_time_ns: int
    supersedes_id: str = ""
    superseded_by_id: str = ""
    revoke_reason: str = ""


@dataclass(frozen=True)
class PublishResult:
    candidate: LearningCandidate
    learning: Learning


@dataclass(frozen=True)
class LifecycleEvent:
    """One state change of a candidate, learning or skill. from_state is "" on creation."""

    subject_kind: SubjectKind
    subject_id: str
    from_state: str
    to_state: str
    reason: str
    time_ns: int
