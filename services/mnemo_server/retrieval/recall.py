"""Recall: hybrid search over a tenant's memories.

1. Query analysis: the scope's speakers are taken out of the text the legs search with
   (a name matches every memory of that speaker; the speaker stage uses it instead).
2. Legs (filters pushed into LanceDB): BM25 top-K and vector top-K.
3. Fusion: 0.3 x BM25 / best BM25 + 0.7 x cosine (a text hit outside the vector leg's top K
   gets its cosine too).
4. Pool: the same-session neighbours of the best candidates join (an answer often sits in
   the turn after its question).
5. Signals, in order: adjacency (a turn after a question shares the question's score),
   speaker match, date proximity, "when" questions x time expressions, importance, session
   support (a memory whose session's best members score well gets a share).
6. Every hit is re-checked against DuckDB (the source of truth: tombstones and filters), so
   the derived index can lag without ever showing a deleted or out-of-scope memory.
7. Optionally the head is reranked by the sidecar's cross-encoder, within a deadline.

The weights were tuned on the LoCoMo DEV split with cross-validation across its
conversations (held-out NDCG@10 within 0.005 of the tuned one) and then left alone."""

from __future__ import annotations

import datetime as dt
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field
from enum import StrEnum

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo_server.call_trace import mark
from mnemo_server.config import LimitsConfig, RankingConfig, RecallConfig
from mnemo_server.embed.embedder import CachedQueryEmbedder, Vectors
from mnemo_server.errors import InvalidArgument
from mnemo_server.index.attrs import Attrs
from mnemo_server.index.lance_index import LanceIndex, LegHit
from mnemo_server.memory.model import Memory, MemoryFilter
from mnemo_server.memory.validation import Validator, raise_if
from mnemo_server.ranking.client import RankingClient, reply_margin_s
from mnemo_server.retrieval.query_analysis import QueryAnalysis, analyse, has_time_expression, speaker_of
from mnemo_server.retrieval.scoring import minmax
from mnemo_server.retrieval.speakers import ScopeSpeakers
from mnemo_server.store import memory_repo
from mnemo_server.store.database import Database

Vector = Vectors  # one query vector (a row of Vectors)


class Stage(StrEnum):
    VECTOR = "vector"
    FULL_TEXT = "full_text"
    ENTITY_STRIP = "entity_strip"
    ADJACENCY = "adjacency"
    SPEAKER = "speaker"
    DATE = "date"
    TIME_QUESTION = "time_question"
    SESSION_SUPPORT = "session_support"
    IMPORTANCE = "importance"


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
    reranked: bool = False
    rerank_fallback_reason: str = ""
    # Hit id -> (previous, next) memory of its source session ("" where none), as the
    # adjacency stage found them; hits without a source session are absent.
    neighbours: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class RecallQuery:
    text: str
    top_k: int = 10
    filter: MemoryFilter = field(default_factory=MemoryFilter)
    disabled: Set[Stage] = frozenset()
    explain: bool = False
    rerank: bool = False
    rerank_deadline_s: float = 0.0  # 0: the configured default
    caller_remaining_s: float | None = None


@dataclass
class _Candidate:
    scores: HitScores
    attrs: Attrs
    base: float = 0.0
    score: float = 0.0


def _day(ns: int) -> dt.date:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).date()


class RecallPipeline:
    def __init__(
        self,
        db: Database,
        index: LanceIndex,
        embedder: CachedQueryEmbedder,
        validator: Validator,
        limits: LimitsConfig,
        cfg: RecallConfig,
        ranking: RankingClient | None = None,
        ranking_cfg: RankingConfig | None = None,
    ):
        self.db = db
        self.index = index
        self.embedder = embedder
        self.validator = validator
        self.limits = limits
        self.cfg = cfg
        self.ranking = ranking
        self.ranking_cfg = ranking_cfg or RankingConfig()
        self._speakers = ScopeSpeakers(
            db, index, cfg.min_speaker_memories, cfg.speakers_cache_s, cfg.speakers_stale_s
        )

    def close(self) -> None:
        """Stop the background refresh of speaker counts (before the store closes)."""
        self._speakers.close()

    def validate(self, q: RecallQuery) -> RecallQuery:
        if not q.text.strip():
            raise InvalidArgument("query", "must not be empty")
        if len(q.text) > self.limits.max_query_chars:
            raise InvalidArgument(
                "query", f"is {len(q.text)} characters; the limit is {self.limits.max_query_chars}"
            )
        raise_if(self.validator.filter(q.filter))
        return RecallQuery(
            q.text,
            self.validator.top_k(q.top_k),
            q.filter,
            q.disabled,
            q.explain,
            q.rerank,
            q.rerank_deadline_s,
            q.caller_remaining_s,
        )

    def indexed_texts(self, tenant_id: str, ids: Sequence[str]) -> dict[str, str]:
        """Memory texts as indexed (for signals only: hits themselves are read from DuckDB)."""
        return {i: a.text for i, a in self.index.attrs(tenant_id, ids).items()}

    def speakers(self, tenant_id: str, f: MemoryFilter) -> list[str]:
        return self._speakers.names(tenant_id, f.scopes)

    # --- the pipeline ------------------------------------------------------------------

    def recall(self, tenant_id: str, query: RecallQuery) -> RecallResult:
        started = time.perf_counter()
        q = self.validate(query)
        off = q.disabled
        speakers = (
            self.speakers(tenant_id, q.filter) if not {Stage.ENTITY_STRIP, Stage.SPEAKER} <= off else []
        )
        analysis = analyse(q.text, speakers, strip=Stage.ENTITY_STRIP not in off)
        k = max(self.cfg.leg_min, min(self.cfg.leg_max, 2 * q.top_k))
        mark("recall.analysis")
        # The query's vector is made on another thread while this one searches full text.
        vector_soon = self.embedder.embed_soon(analysis.text)
        txt_hits = (
            [] if Stage.FULL_TEXT in off else self.index.text_search(tenant_id, analysis.text, k, q.filter)
        )
        mark("recall.full_text")
        vector = vector_soon()
        mark("recall.embedding")  # what was left of it after the full-text search
        vec_hits = [] if Stage.VECTOR in off else self.index.vector_search(tenant_id, vector, k, q.filter)
        mark("recall.vector")
        pool = self._fuse(vec_hits, txt_hits)
        if vec_hits:
            self._score_text_only(tenant_id, pool, txt_hits, vector)
        links = self._expand(tenant_id, pool, vector) if Stage.ADJACENCY not in off and pool else {}
        mark("recall.neighbours")
        self._signals(pool, links, analysis, off)
        ranked = sorted(pool.items(), key=lambda kv: (-kv[1].score, kv[1].attrs.seq))
        mark("recall.signals")
        hits = self._hydrate(tenant_id, ranked, q)
        mark("recall.hydration")
        result = RecallResult(hits, len(vec_hits), len(txt_hits), 0.0)
        result.neighbours = {h.memory.id: links[h.memory.id] for h in hits if h.memory.id in links}
        if q.rerank and hits:
            self._rerank(tenant_id, q, result, started)
            mark("recall.rerank")
        if q.explain:
            for h in result.hits:
                h.explanation = self._explain(h.scores)
        result.took_ms = (time.perf_counter() - started) * 1000.0
        return result

    def _fuse(self, vec_hits: list[LegHit], txt_hits: list[LegHit]) -> dict[str, _Candidate]:
        pool: dict[str, _Candidate] = {}
        best_text = max((h.score for h in txt_hits), default=0.0) or 1.0
        for rank, h in enumerate(vec_hits, start=1):
            pool[h.id] = _Candidate(HitScores(vector_score=h.score, vector_rank=rank), h.attrs)
        for rank, h in enumerate(txt_hits, start=1):
            # Not setdefault: it would build a candidate for every text hit the vector leg
            # also found, and drop it.
            if (c := pool.get(h.id)) is None:
                pool[h.id] = c = _Candidate(HitScores(), h.attrs)
            c.scores.text_score, c.scores.text_rank = h.score, rank
        for c in pool.values():
            s = c.scores
            s.fused_score = (
                self.cfg.text_weight * s.text_score / best_text + self.cfg.vector_weight * s.vector_score
            )
            c.base = c.score = s.fused_score
        return pool

    def _score_text_only(
        self, tenant_id: str, pool: dict[str, _Candidate], txt_hits: list[LegHit], vector: Vector
    ) -> None:
        """Give the candidates only the full-text leg found their cosine too. Left at 0, a
        text hit the vector leg's top K missed scored its BM25 share alone, below vector hits
        with no word of the query: a query of one rare code ("INV-3MCR") lost its one
        matching memory to the other invoices in 7 of 100 searches (0 with this)."""
        text_only = [h for h in txt_hits if not pool[h.id].scores.vector_rank]
        for mid, cos in self.index.cosines(tenant_id, vector, text_only).items():
            c = pool[mid]
            c.scores.vector_score = cos
            c.scores.fused_score += self.cfg.vector_weight * cos
            c.base = c.score = c.scores.fused_score

    def _expand(
        self, tenant_id: str, pool: dict[str, _Candidate], vector: Vector
    ) -> dict[str, tuple[str, str]]:
        """Add the same-session neighbours of the best candidates; returns prev/next links.
        Only memories with a source session have neighbours (nothing to look up otherwise)."""
        in_sessions = [i for i, c in pool.items() if c.attrs.session]
        if not in_sessions:
            return {}
        links = memory_repo.session_neighbours(self.db.reader(), tenant_id, in_sessions)
        head = sorted(in_sessions, key=lambda i: -pool[i].base)[: self.cfg.neighbour_head]
        new = sorted({n for i in head for n in links.get(i, ("", "")) if n and n not in pool})
        for mid, (attrs, v) in self.index.rows(tenant_id, new).items():
            cos = float(v @ vector)
            s = HitScores(vector_score=cos, fused_score=self.cfg.vector_weight * cos)
            pool[mid] = _Candidate(s, attrs, base=s.fused_score, score=s.fused_score)
        return links

    def _hydrate(self, tenant_id: str, ranked: list[tuple[str, _Candidate]], q: RecallQuery) -> list[Hit]:
        """Read the best candidates from DuckDB, the source of truth: a memory deleted, or
        whose content changed since it was indexed (or outside the filter) is dropped, and
        the next one is read instead. A changed content is PENDING, not yet searchable: its
        hit was found by the old text and scored on it, and came back holding the new text,
        without the words it was found by (recall probe). Other changes keep it."""
        hits: list[Hit] = []
        # Nearly every candidate is live (the index trails DuckDB by well under a second),
        # and each row read costs ~0.035 ms at 100k: read a small margin, not twice top_k.
        chunk = q.top_k + max(2, q.top_k // 5)
        for start in range(0, len(ranked), chunk):
            part = ranked[start : start + chunk]
            memories = memory_repo.read_many(
                self.db.reader(), self.db.rows, tenant_id, [mid for mid, _ in part]
            )
            for mid, c in part:
                m = memories.get(mid)
                if m is not None and not m.deleted and m.content == c.attrs.text and q.filter.matches(m):
                    hits.append(Hit(m, c.score, c.scores))
                    if len(hits) == q.top_k:
                        return hits
        return hits

    def _signals(
        self,
        pool: dict[str, _Candidate],
        links: dict[str, tuple[str, str]],
        a: QueryAnalysis,
        off: Set[Stage],
    ) -> None:
        members = list(pool.values())
        if Stage.ADJACENCY not in off:
            self._adjacency(pool, links)
        if Stage.SPEAKER not in off and len(a.named_speakers) == 1:
            self._scale(
                members,
                "speaker",
                lambda m: 1 - self.cfg.speaker_penalty if speaker_of(m.text) != a.named_speakers[0] else 1.0,
            )
        if Stage.DATE not in off and a.dates:
            tau = self.cfg.date_tau_days
            self._scale(
                members,
                "date",
                lambda m: (
                    1
                    + self.cfg.date_boost
                    * max(
                        math.exp(
                            -max(0, (lo - _day(m.event_time_ns)).days, (_day(m.event_time_ns) - hi).days)
                            / tau
                        )
                        for lo, hi in a.dates
                    )
                ),
            )
        if Stage.TIME_QUESTION not in off and a.when_question:
            self._scale(
                members,
                "time_question",
                lambda m: 1 + self.cfg.time_question_boost if has_time_expression(m.text) else 1.0,
            )
        if Stage.IMPORTANCE not in off:
            self._scale(
                members, "importance", lambda m: 1 + self.cfg.importance_weight * (2 * m.importance - 1)
            )
        if Stage.SESSION_SUPPORT not in off:
            self._session_support(members)

    @staticmethod
    def _scale(members: list[_Candidate], name: str, factor_of: Callable[[Attrs], float]) -> None:
        for c in members:
            factor = factor_of(c.attrs)
            if factor != 1.0:
                c.score *= factor
                c.scores.signals[name] = factor

    def _adjacency(self, pool: dict[str, _Candidate], links: dict[str, tuple[str, str]]) -> None:
        """A turn right after a question shares the question's fused score."""
        for mid, c in pool.items():
            prev = pool.get(links.get(mid, ("", ""))[0])
            if prev is not None and "?" in prev.attrs.text:
                bonus = self.cfg.adjacency * prev.base
                c.score += bonus
                c.scores.signals["adjacency"] = bonus

    def _session_support(self, members: list[_Candidate]) -> None:
        """Add a share of the mean of the session's best scores."""
        top = self.cfg.session_top
        by_session: dict[tuple[str, str], list[float]] = defaultdict(list)
        for c in members:
            if c.attrs.session:
                by_session[(c.attrs.scope, c.attrs.session)].append(c.score)
        support = {k: sum(sorted(v, reverse=True)[:top]) / min(len(v), top) for k, v in by_session.items()}
        for c in members:
            key = (c.attrs.scope, c.attrs.session)
            if key in support:
                bonus = self.cfg.session_support * support[key]
                c.score += bonus
                c.scores.signals["session_support"] = bonus

    def _rerank(self, tenant_id: str, q: RecallQuery, result: RecallResult, started: float) -> None:
        """Blend the sidecar's cross-encoder scores into the head, 50/50 after min-max; on any
        trouble the fused order stands and the reason is reported."""
        if self.ranking is None or not self.ranking.enabled:
            result.rerank_fallback_reason = "no_sidecar"
            return
        own = self.ranking_cfg.rerank_deadline_ms / 1000.0
        budget = q.rerank_deadline_s or own
        if q.caller_remaining_s is not None:
            budget = min(
                budget,
                q.caller_remaining_s
                - (time.perf_counter() - started)
                - reply_margin_s(self.ranking_cfg, q.caller_remaining_s),
            )
        head = result.hits[: self.ranking_cfg.rerank_head]
        answer = self.ranking.rerank(
            rpb.RerankRequest(
                tenant_id=tenant_id,
                query=q.text,
                candidates=[
                    rpb.Candidate(id=h.memory.id, text=h.memory.content, baseline_score=h.score) for h in head
                ],
            ),
            budget,
            caller_limited=budget < own,  # the caller's choice or deadline cut it
        )
        if answer.value is None or len(answer.value.scores) != len(head):
            result.rerank_fallback_reason = answer.fallback_reason or "partial_scores"
            return
        ce = minmax([s.score for s in answer.value.scores])
        fused = minmax([h.score for h in head])
        for h, c, f in zip(head, ce, fused, strict=True):
            h.scores.signals["rerank"] = c
            h.score = 0.5 * c + 0.5 * f
        head.sort(key=lambda h: -h.score)
        # Keep the head above the untouched tail.
        floor = min(h.score for h in head)
        tail = result.hits[len(head) :]
        top = max((h.score for h in tail), default=0.0)
        if tail and floor <= top:
            for h in head:
                h.score += top - floor + 1e-6
        result.hits = head + tail
        result.reranked = True

    @staticmethod
    def _explain(s: HitScores) -> str:
        legs = []
        if s.vector_rank:
            legs.append(f"vector #{s.vector_rank} (cosine {s.vector_score:.3f})")
        if s.text_rank:
            legs.append(f"full-text #{s.text_rank} (BM25 {s.text_score:.2f})")
        if not legs:
            legs.append(f"session neighbour (cosine {s.vector_score:.3f})")
        signals = ", ".join(f"{k} {v:.3f}" for k, v in s.signals.items())
        return f"{' + '.join(legs)} → fused {s.fused_score:.3f}" + (f"; {signals}" if signals else "")
