"""Recall: hybrid search over a tenant's memories.

LanceDB vector top-K and BM25 top-K (filters pushed down), fused, then checked against
DuckDB (the source of truth: tombstones and filters are re-applied there, so the derived
index can lag without ever showing a deleted or out-of-scope memory)."""

from __future__ import annotations

import time
from collections.abc import Set
from dataclasses import dataclass, field
from enum import StrEnum

from mnemo_server.config import LimitsConfig, RecallConfig
from mnemo_server.embed.embedder import CachedQueryEmbedder
from mnemo_server.errors import InvalidArgument
from mnemo_server.index.lance_index import LanceIndex, LegHit, filter_sql
from mnemo_server.memory.model import Memory, MemoryFilter
from mnemo_server.memory.validation import Validator, raise_if
from mnemo_server.store import memory_repo
from mnemo_server.store.database import Database


class Stage(StrEnum):
    VECTOR = "vector"
    FULL_TEXT = "full_text"


@dataclass
class HitScores:
    vector_score: float = 0.0
    vector_rank: int = 0
    text_score: float = 0.0
    text_rank: int = 0
    fused_score: float = 0.0
    signals: dict[str, float] = field(default_factory=dict)


@dataclass
class Hit:
    memory: Memory
    score: float
    scores: HitScores
    explanation: str = ""


@dataclass
class RecallResult:
    hits: list[Hit]
    vector_candidates: int
    text_candidates: int
    took_ms: float


@dataclass(frozen=True)
class RecallQuery:
    text: str
    top_k: int = 10
    filter: MemoryFilter = field(default_factory=MemoryFilter)
    disabled: Set[Stage] = frozenset()
    explain: bool = False


def _normalised(hits: list[LegHit]) -> dict[str, tuple[float, int, float]]:
    """id -> (raw score, 1-based rank, score scaled to [0, 1] by the leg's best)."""
    if not hits:
        return {}
    best = max(h.score for h in hits) or 1.0
    return {h.id: (h.score, rank, max(h.score, 0.0) / best) for rank, h in enumerate(hits, start=1)}


class RecallPipeline:
    def __init__(
        self,
        db: Database,
        index: LanceIndex,
        embedder: CachedQueryEmbedder,
        validator: Validator,
        limits: LimitsConfig,
        cfg: RecallConfig,
    ):
        self.db = db
        self.index = index
        self.embedder = embedder
        self.validator = validator
        self.limits = limits
        self.cfg = cfg

    def validate(self, q: RecallQuery) -> RecallQuery:
        if not q.text.strip():
            raise InvalidArgument("query", "must not be empty")
        if len(q.text) > self.limits.max_query_chars:
            raise InvalidArgument(
                "query", f"is {len(q.text)} characters; the limit is {self.limits.max_query_chars}"
            )
        raise_if(self.validator.filter(q.filter))
        top_k = self.validator.top_k(q.top_k)
        return RecallQuery(q.text, top_k, q.filter, q.disabled, q.explain)

    def recall(self, tenant_id: str, query: RecallQuery) -> RecallResult:
        started = time.perf_counter()
        q = self.validate(query)
        k = max(q.top_k * self.cfg.leg_multiplier, self.cfg.leg_floor)
        where = filter_sql(q.filter)
        vec_hits: list[LegHit] = []
        txt_hits: list[LegHit] = []
        if Stage.VECTOR not in q.disabled:
            vec_hits = self.index.vector_search(tenant_id, self.embedder.embed_one(q.text), k, where)
        if Stage.FULL_TEXT not in q.disabled:
            txt_hits = self.index.text_search(tenant_id, q.text, k, where)
        vec, txt = _normalised(vec_hits), _normalised(txt_hits)
        fused: dict[str, HitScores] = {}
        for mid in dict.fromkeys([*vec, *txt]):
            s = HitScores()
            if mid in vec:
                s.vector_score, s.vector_rank, v_norm = vec[mid]
                s.fused_score += self.cfg.vector_weight * v_norm
            if mid in txt:
                s.text_score, s.text_rank, t_norm = txt[mid]
                s.fused_score += self.cfg.text_weight * t_norm
            fused[mid] = s
        ranked = sorted(fused.items(), key=lambda kv: -kv[1].fused_score)
        memories = memory_repo.get_many(self.db.reader(), tenant_id, [mid for mid, _ in ranked])
        hits: list[Hit] = []
        for mid, s in ranked:
            m = memories.get(mid)
            if m is None or m.deleted or not q.filter.matches(m):
                continue
            hits.append(Hit(m, s.fused_score, s, self._explain(s) if q.explain else ""))
            if len(hits) == q.top_k:
                break
        return RecallResult(hits, len(vec_hits), len(txt_hits), (time.perf_counter() - started) * 1000.0)

    def _explain(self, s: HitScores) -> str:
        legs = []
        if s.vector_rank:
            legs.append(f"vector #{s.vector_rank} (cosine {s.vector_score:.3f})")
        if s.text_rank:
            legs.append(f"full-text #{s.text_rank} (BM25 {s.text_score:.2f})")
        signals = ", ".join(f"{k} {v:+.3f}" for k, v in s.signals.items())
        return f"{' + '.join(legs) or 'no leg'} → fused {s.fused_score:.3f}" + (
            f"; {signals}" if signals else ""
        )
