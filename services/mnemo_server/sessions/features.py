"""Per-candidate feature vectors for the learned ranker. Names travel with the values, so
the sidecar matches them by name and the set can grow without breaking trained models."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from mnemo_server.memory.model import Memory, MemoryType, ScopeKind
from mnemo_server.retrieval.query_analysis import TermMatcher, body_of, content_terms
from mnemo_server.retrieval.recall import HitScores

NS_PER_DAY = 86_400 * 1_000_000_000
# Signet's decision battery, in short: content that records a choice is worth surfacing.
DECISION_PATTERN = (
    r"\b(decided|decision|chose|chosen|switched (?:from|to)|migrated|went with|sticking with|settled on|"
    r"committed to|will use|prefers? .+ over|adopted)\b"
)
_DECISION = re.compile(DECISION_PATTERN)
# The characters other than ASCII capitals that re.IGNORECASE takes for these ASCII letters;
# lower() alone would miss them (and makes two characters of U+0130).
_FOLD_TO_ASCII = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"})


def records_decision(text: str) -> bool:
    """DECISION_PATTERN found in the text, case aside. The pattern searches the lower-cased
    text: with re.IGNORECASE it took ~9 us a text here, ~2 this way (the features read ~70
    texts a StartSession). Checked against re.IGNORECASE over every code point."""
    folded = text if text.isascii() else text.translate(_FOLD_TO_ASCII)
    return _DECISION.search(folded.lower()) is not None


BASE_FEATURES: tuple[str, ...] = (
    "baseline_score",
    "baseline_rrank",
    "recall_score",
    "fused_score",
    "vector_score",
    "vector_rrank",
    "text_score_rel",
    "text_rrank",
    "importance",
    "confidence",
    "pinned",
    "age_log_days",
    "event_age_log_days",
    "chars_log",
    "access_log",
    "decision",
    *(f"type_{t.value}" for t in MemoryType),
    *(f"scope_{k.value}" for k in ScopeKind),
    "origin_recall",
    "origin_pinned",
    "origin_recent",
    # Against the session's opening context and the memory's neighbours in its source
    # session (an answer often follows a question, and a question seldom holds the answer).
    "has_question",
    "query_overlap",
    "baseline_rel",
    "prev_has_question",
    "prev_query_overlap",
    "prev_baseline_rel",
    "next_has_question",
    "next_baseline_rel",
)


@dataclass
class Candidate:
    memory: Memory
    origins: set[str]
    scores: HitScores | None = None  # None when not returned by recall
    recall_score: float = 0.0
    baseline_score: float = 0.0
    baseline_rank: int = 0
    # The previous and next memory of its source session ("" when none or unknown).
    prev_id: str = ""
    next_id: str = ""
    features: list[float] = field(default_factory=list)


def signal_names(candidates: list[Candidate]) -> list[str]:
    names: set[str] = set()
    for c in candidates:
        if c.scores is not None:
            names.update(c.scores.signals)
    return [f"sig_{n}" for n in sorted(names)]


# One-hot columns by value: iterating an Enum class for each row cost more than the row's
# other columns.
_TYPE_COLUMNS = {t: tuple(float(t is u) for u in MemoryType) for t in MemoryType}
_SCOPE_COLUMNS = {k: tuple(float(k is u) for u in ScopeKind) for k in ScopeKind}


@dataclass(frozen=True)
class _Context:
    """What the query-and-neighbour features of one pool compare against."""

    query: TermMatcher
    texts: dict[str, str]  # id -> text, pool members and their neighbours
    baseline: dict[str, float]  # id -> baseline score / best baseline score, pool members
    cache: dict[str, tuple[float, float]] = field(default_factory=dict)

    def question_and_overlap(self, memory_id: str) -> tuple[float, float]:
        """(has a question mark, share of the query's terms it contains); 0s when unknown."""
        if memory_id not in self.cache:
            body = body_of(self.texts.get(memory_id, ""))
            terms = self.query.terms
            overlap = len(self.query.found(body)) / len(terms) if terms else 0.0
            self.cache[memory_id] = (1.0 if "?" in body else 0.0, overlap)
        return self.cache[memory_id]

    def row(self, c: Candidate) -> list[float]:
        has_q, overlap = self.question_and_overlap(c.memory.id)
        prev_q, prev_overlap = self.question_and_overlap(c.prev_id) if c.prev_id else (0.0, 0.0)
        next_q = self.question_and_overlap(c.next_id)[0] if c.next_id else 0.0
        return [
            has_q,
            overlap,
            self.baseline[c.memory.id],
            prev_q,
            prev_overlap,
            self.baseline.get(c.prev_id, 0.0),
            next_q,
            self.baseline.get(c.next_id, 0.0),
        ]


def compute_features(
    candidates: list[Candidate], now_ns: int, query: str = "", neighbour_texts: dict[str, str] | None = None
) -> list[str]:
    """Fill each candidate's features; returns the feature names (same order).
    neighbour_texts: the texts of candidates' neighbours outside the pool."""
    sig_names = signal_names(candidates)
    best_text = max((c.scores.text_score for c in candidates if c.scores), default=0.0) or 1.0
    best_base = max((c.baseline_score for c in candidates), default=0.0) or 1.0
    ctx = _Context(
        TermMatcher(content_terms(query)),
        {**(neighbour_texts or {}), **{c.memory.id: c.memory.content for c in candidates}},
        {c.memory.id: c.baseline_score / best_base for c in candidates},
    )
    for c in candidates:
        m, s = c.memory, c.scores
        row = [
            c.baseline_score,
            1.0 / c.baseline_rank if c.baseline_rank else 0.0,
            c.recall_score,
            s.fused_score if s else 0.0,
            s.vector_score if s else 0.0,
            1.0 / s.vector_rank if s and s.vector_rank else 0.0,
            s.text_score / best_text if s else 0.0,
            1.0 / s.text_rank if s and s.text_rank else 0.0,
            m.importance,
            m.confidence,
            float(m.pinned),
            math.log1p(max(0, now_ns - m.create_time_ns) / NS_PER_DAY),
            math.log1p(max(0, now_ns - m.event_time_ns) / NS_PER_DAY),
            math.log1p(len(m.content)),
            math.log1p(m.access_count),
            1.0 if records_decision(m.content) else 0.0,
            *_TYPE_COLUMNS[m.type],
            *_SCOPE_COLUMNS[m.scope.kind],
            float("recall" in c.origins),
            float("pinned" in c.origins),
            float("recent" in c.origins),
            *ctx.row(c),
            *((s.signals.get(n[4:], 0.0) if s else 0.0) for n in sig_names),
        ]
        c.features = row
    return [*BASE_FEATURES, *sig_names]
