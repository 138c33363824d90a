"""Plain types of the learning loop: sessions with feedback, and training outcomes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class ModelKind(StrEnum):
    CROSS_ENCODER = "cross_encoder"
    RANKER = "ranker"


@dataclass(frozen=True)
class Candidate:
    id: str
    text: str
    baseline_score: float
    features: tuple[float, ...] = ()


@dataclass(frozen=True)
class FeedbackCandidate:
    candidate: Candidate
    relevance: float  # -1 .. 1
    baseline_rank: int  # 1-based; 0 = not ranked by the baseline
    predictor_rank: int = 0


@dataclass(frozen=True)
class FeedbackSession:
    session_id: str
    query: str
    feature_names: tuple[str, ...]
    candidates: tuple[FeedbackCandidate, ...]
    end_time_ns: int = 0

    @property
    def positives(self) -> int:
        return sum(1 for c in self.candidates if c.relevance > 0)


@dataclass(frozen=True)
class SessionMark:
    """A point in a tenant's stream of sessions: how many were stored, and the sequence
    number of the newest (sequence numbers count every session ever stored, one by one)."""

    stored: int
    last_seq: int


@dataclass
class TrainingOutcome:
    model: ModelKind
    candidate_version: str
    promoted: bool
    heldout_sessions: int
    candidate_ndcg: float
    current_ndcg: float
    baseline_ndcg: float
    reason: str
    train_seconds: float
    train_pairs: int
    finish_time_ns: int = 0
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ProgressEvent:
    """One step of a training run, as its followers (Train's stream) see it."""

    model: ModelKind
    stage: str
    progress: float
    message: str
    outcome: TrainingOutcome | None = None
