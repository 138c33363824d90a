"""Sessions: the session-start injection bundle and the session-end feedback loop.

StartSession: candidate pool (hybrid recall on the opening context + pinned + recent, in
the session's visible scopes) → feature vectors → the sidecar's learned ranker under a
deadline → fused with the baseline by the predictor's health weight → packed into the
token budget → recorded (what was injected, at which rank). Any sidecar trouble means the
baseline order, never an error and never a missed deadline.

EndSession: continuity per injected memory (feedback, else transcript overlap, else 0) →
a training session queued in the outbox in the same transaction → delivered to the
sidecar in the background."""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo_server.call_trace import mark
from mnemo_server.config import LimitsConfig, RankingConfig
from mnemo_server.errors import AlreadyExists, FailedPrecondition, FieldViolation, InvalidArgument, NotFound
from mnemo_server.memory.model import IdempotencyKey, Memory, MemoryFilter, Scope, ScopeKind, now_ns
from mnemo_server.memory.validation import Validator, raise_if
from mnemo_server.ranking.client import RankingClient, reply_margin_s
from mnemo_server.retrieval.query_analysis import content_words
from mnemo_server.retrieval.recall import RecallPipeline, RecallQuery
from mnemo_server.retrieval.scoring import minmax, reciprocal_ranks
from mnemo_server.sessions.access_counts import AccessCounts
from mnemo_server.sessions.continuity import overlap_relevance
from mnemo_server.sessions.features import Candidate, compute_features
from mnemo_server.sessions.packing import pack, render
from mnemo_server.sessions.time_after_ranking import TimeAfterRanking
from mnemo_server.store import idempotency_repo, memory_repo, session_candidates, session_repo
from mnemo_server.store.database import Cursor, Database, WriteDomain
from mnemo_server.store.group_commit import GroupCommit
from mnemo_server.store.row_cache import RowCache
from mnemo_server.store.session_candidates import SessionMemoryRow
from mnemo_server.store.session_repo import SessionRow

MODEL, BASELINE, FALLBACK = "model", "baseline", "fallback"


def training_session_key(session_id: str, start_time_ns: int) -> str:
    """The id a session's training pairs carry to the sidecar, which keeps one session per
    id (a retried delivery is a duplicate). Retention purges ended sessions and lets their ids
    be started again, so the server's id alone would have the sidecar take a new session's
    pairs for a retry of the old one's and drop them; its start time makes each its own."""
    return f"{session_id}@{start_time_ns}"


@dataclass(frozen=True)
class StartSessionInput:
    session_id: str
    context: str = ""
    agent_id: str = ""
    persona_id: str = ""
    project_id: str = ""
    token_budget: int = 0
    max_memories: int = 0
    request_fingerprint: str = ""


@dataclass
class Injected:
    memory: Memory
    rank: int
    score: float
    baseline_score: float
    predictor_score: float
    origin: str
    tokens: int


@dataclass
class SessionBundle:
    session: SessionRow
    injected: list[Injected]
    context_text: str
    continuity: list[tuple[str, float, str]] = field(default_factory=list)


@dataclass
class RankDecision:
    path: str
    reason: str
    version: str = ""
    weight: float = 0.0
    predictor: list[float] = field(default_factory=list)
    sidecar_ms: float = 0.0
    deadline_ms: int = 0
    # When the sidecar's budget ran out (perf_counter); inf when no call went out.
    sidecar_due: float = math.inf


@dataclass(frozen=True)
class Feedback:
    memory_id: str
    relevance: float
    used: bool


@dataclass(frozen=True)
class _EndRequest:
    """An EndSession's input, once validated."""

    tenant_id: str
    session_id: str
    feedback: Sequence[Feedback]
    transcript: str
    now: int


@dataclass
class _Ending:
    """What an EndSession writes, worked out before the write lock is taken."""

    start_time_ns: int
    continuity: dict[str, tuple[float, str]]
    pairs: int
    payload: bytes  # the outbox's (session_repo.encode_payload)


@dataclass(frozen=True)
class _EndWrite:
    """An EndSession ready for its write transaction: the request, its request_id key, and
    what was read for it before the lock (None: not found active then; checked again inside)."""

    req: _EndRequest
    key: IdempotencyKey | None
    ending: _Ending | None


# What an EndSession answers: (memory id, relevance, source) per scored memory, and the
# number of training pairs queued.
EndResult = tuple[list[tuple[str, float, str]], int]


class SessionService:
    def __init__(
        self,
        db: Database,
        recall: RecallPipeline,
        ranking: RankingClient,
        access: AccessCounts,
        validator: Validator,
        limits: LimitsConfig,
        cfg: RankingConfig,
        on_feedback: Callable[[], None] = lambda: None,
        clock: Callable[[], int] = now_ns,
        group_commit_max_sessions: int = 0,
    ):
        self.db = db
        self.recall = recall
        self.ranking = ranking
        self.access = access
        self.validator = validator
        self.limits = limits
        self.cfg = cfg
        self._fusion = ScoreFusion(cfg.fusion_rank_k)
        self.after_ranking = TimeAfterRanking()
        # Sessions ordered by the baseline, by reason (GetStatus.ranking_fallbacks).
        self._baseline_sessions: Counter[str] = Counter()
        self._counts_lock = threading.Lock()
        self.on_feedback = on_feedback
        self.clock = clock
        # Session records that queue while another is being written share its transaction
        # (store/group_commit.py); max 0: each its own.
        self._records: GroupCommit[tuple[SessionRow, bytes], None] = GroupCommit(
            self._record_together, self._record_alone, group_commit_max_sessions
        )
        # Likewise EndSession's writes, which all take the sessions' lock. One at a time, under
        # the bench's StartSession/EndSession load (20k memories, C 8) each held it ~29 ms
        # (its statements wait for the GIL between them) and the next waited 77 ms for it on
        # average, up to 1.7 s; grouped, the wait fell to ~5 ms and EndSession's p99 from
        # ~340 to ~190 ms.
        self._ends: GroupCommit[_EndWrite, EndResult] = GroupCommit(
            self._end_together,
            self._end_alone,
            group_commit_max_sessions,
            tenant_of=lambda w: w.req.tenant_id,
        )

    # --- start -------------------------------------------------------------------------

    def _validate(self, req: StartSessionInput) -> tuple[int, int]:
        out: list[FieldViolation] = []
        if not req.session_id:
            out.append(FieldViolation("session_id", "is required"))
        else:
            self.validator.identifier(req.session_id, "session_id", self.limits.max_request_id_chars, out)
        for name in ("agent_id", "persona_id", "project_id"):
            value = getattr(req, name)
            if value:
                self.validator.identifier(value, name, self.limits.max_scope_id_chars, out)
        if len(req.context) > self.limits.max_query_chars:
            out.append(FieldViolation("context", f"longer than {self.limits.max_query_chars} characters"))
        if not 0 <= req.token_budget <= 100_000:
            out.append(FieldViolation("token_budget", "must be between 0 and 100000"))
        if not 0 <= req.max_memories <= self.limits.max_top_k:
            out.append(FieldViolation("max_memories", f"must be between 0 and {self.limits.max_top_k}"))
        raise_if(out)
        return (
            req.token_budget or self.cfg.default_token_budget,
            req.max_memories or self.cfg.default_max_memories,
        )

    @staticmethod
    def visible_scopes(req: StartSessionInput) -> tuple[Scope, ...]:
        scopes = [Scope.workspace(), Scope(ScopeKind.SESSION, req.session_id)]
        if req.persona_id:
            scopes.append(Scope(ScopeKind.PERSONA, req.persona_id))
        if req.project_id:
            scopes.append(Scope(ScopeKind.PROJECT, req.project_id))
        return tuple(scopes)

    def _pool(self, tenant_id: str, req: StartSessionInput, scopes: tuple[Scope, ...]) -> list[Candidate]:
        by_id: dict[str, Candidate] = {}
        f = MemoryFilter(scopes=scopes)
        if req.context.strip():
            result = self.recall.recall(
                tenant_id, RecallQuery(req.context, min(self.cfg.pool_recall, self.limits.max_top_k), f)
            )
            for h in result.hits:
                prev_id, next_id = result.neighbours.get(h.memory.id, ("", ""))
                by_id[h.memory.id] = Candidate(
                    h.memory, {"recall"}, h.scores, h.score, prev_id=prev_id, next_id=next_id
                )
        cur = self.db.reader()
        pinned = (
            memory_repo.list_page(
                cur,
                tenant_id,
                MemoryFilter(scopes=scopes, pinned_only=True),
                include_deleted=False,
                before_seq=None,
                limit=self.cfg.pool_pinned,
                cache=self.db.rows,
            )
            if self.db.stored.pinned_tenants.may_hold(tenant_id)
            else []
        )
        recent = memory_repo.newest_in_scopes(
            cur, self.db.recent, self.db.stored, self.db.rows, tenant_id, scopes, self.cfg.pool_recent
        )
        mark("pinned_and_recent")
        for origin, rows in (("pinned", pinned), ("recent", recent)):
            for m in rows:
                by_id.setdefault(m.id, Candidate(m, set())).origins.add(origin)
        return list(by_id.values())

    def start(
        self, tenant_id: str, req: StartSessionInput, caller_remaining_s: float | None
    ) -> SessionBundle:
        started = time.perf_counter()
        budget, max_items = self._validate(req)
        scopes = self.visible_scopes(req)
        pool = self._pool(tenant_id, req, scopes)
        now = self.clock()
        # Baseline: recall's own order; pinned/recent-only candidates after it, by importance.
        for c in pool:
            c.baseline_score = c.recall_score if "recall" in c.origins else 0.01 * c.memory.importance
        pool.sort(key=lambda c: -c.baseline_score)
        for rank, c in enumerate(pool, start=1):
            c.baseline_rank = rank
        outside = sorted({n for c in pool for n in (c.prev_id, c.next_id) if n} - {c.memory.id for c in pool})
        names = compute_features(pool, now, req.context, self.recall.indexed_texts(tenant_id, outside))
        mark("features")

        decision = self._rank(tenant_id, req, pool, names, started, caller_remaining_s)
        ranked = time.perf_counter()
        mark("sidecar")
        path, reason, version, weight = decision.path, decision.reason, decision.version, decision.weight
        sidecar_ms, deadline_ms, predictor = decision.sidecar_ms, decision.deadline_ms, decision.predictor

        if path == MODEL:
            final = self._fusion.scores(predictor, [c.baseline_score for c in pool], weight)
        else:
            final = [c.baseline_score for c in pool]
        order = sorted(range(len(pool)), key=lambda i: (-final[i], pool[i].baseline_rank))
        pred_rank = {i: r for r, i in enumerate(sorted(range(len(pool)), key=lambda i: -predictor[i]), 1)}
        packed = pack([pool[i].memory for i in order], budget, max_items)
        injected_rank = {order[p]: r for r, p in enumerate(packed.chosen, start=1)}
        tokens_of = {order[p]: t for p, t in zip(packed.chosen, packed.tokens, strict=True)}

        session = SessionRow(
            tenant_id,
            req.session_id,
            req.agent_id,
            req.persona_id,
            req.project_id,
            req.context,
            "active",
            req.request_fingerprint,
            path,
            reason,
            version,
            weight,
            sidecar_ms,
            deadline_ms,
            0.0,
            budget,
            packed.tokens_used,
            packed.dropped,
            names,
            now,
        )
        members = [
            SessionMemoryRow(
                c.memory.id,
                i,
                injected_rank.get(i, 0),
                "+".join(sorted(c.origins)),
                c.baseline_score,
                c.baseline_rank,
                predictor[i],
                pred_rank[i] if path == MODEL else 0,
                final[i],
                tokens_of.get(i, 0),
                c.features,
            )
            for i, c in enumerate(pool)
        ]
        injected = [
            Injected(
                pool[i].memory,
                r,
                final[i],
                pool[i].baseline_score,
                predictor[i],
                "+".join(sorted(pool[i].origins)),
                tokens_of[i],
            )
            for i, r in sorted(injected_rank.items(), key=lambda kv: kv[1])
        ]
        candidates = session_candidates.pack(members)
        session.took_ms = (time.perf_counter() - started) * 1000.0
        mark("packing")
        try:
            self._records.submit((session, candidates))
        except session_repo.SessionTaken:
            # The insert is the check, not a read before the work: a copy of this request
            # running at the same time (a client's retry after a timeout) would pass a read.
            return self._existing(tenant_id, req)
        # Counted after the session's commit and written in batches (access_counts).
        self.access.record(tenant_id, [x.memory.id for x in injected], now)
        bundle = SessionBundle(session, injected, render([x.memory for x in injected]))
        # From the sidecar's answer, or from the end of its budget when the answer came later:
        # under load the call's timeout fires late (5-13 ms past a 260 ms budget, probe), and
        # that overrun is taken from what the deadline leaves as surely as the work after it.
        self.after_ranking.add(time.perf_counter() - min(ranked, decision.sidecar_due))
        if pool and path != MODEL:
            with self._counts_lock:
                self._baseline_sessions[reason or path] += 1
        return bundle

    def baseline_sessions(self) -> dict[str, int]:
        """Sessions ordered by the baseline since the server started, by reason (cold_start,
        no_sidecar, partial_scores, or why the sidecar's answer did not come: deadline,
        unavailable, circuit_open, no_time, ...)."""
        with self._counts_lock:
            return dict(self._baseline_sessions)

    def _record_together(self, records: Sequence[tuple[SessionRow, bytes]]) -> list[None]:
        # One INSERT for the whole group, committed by itself.
        with self.db.single_statement(WriteDomain.SESSION_STARTS) as cur:
            session_repo.insert_sessions(cur, records)
        return [None] * len(records)

    def _record_alone(self, record: tuple[SessionRow, bytes]) -> None:
        self._record_together([record])

    def _existing(self, tenant_id: str, req: StartSessionInput) -> SessionBundle:
        """The answer to a StartSession whose id is taken: the recorded session again for
        a retry of the request that recorded it, ALREADY_EXISTS for any other."""
        existing = session_repo.get_session_and_memories(self.db.reader(), tenant_id, req.session_id)
        fingerprint = req.request_fingerprint
        if existing is not None and fingerprint and existing[0].request_fingerprint == fingerprint:
            return self._replay(tenant_id, *existing)
        raise AlreadyExists(f"session {req.session_id!r} already exists", reason="SESSION_EXISTS")

    def _rank(
        self,
        tenant_id: str,
        req: StartSessionInput,
        pool: list[Candidate],
        names: list[str],
        started: float,
        caller_remaining_s: float | None,
    ) -> RankDecision:
        """Ask the sidecar's ranker within what is left of the deadline; baseline otherwise."""
        if not pool:
            return RankDecision(BASELINE, "", predictor=[])
        if not self.ranking.enabled:
            return RankDecision(BASELINE, "no_sidecar", predictor=[0.0] * len(pool))
        # The server's deadline or the caller's (as it was when the call started), whichever
        # comes first, less the time spent so far, less what is kept back: the work after the
        # sidecar's answer (as it has taken lately, time_after_ranking.py) and the reply's
        # margin, never more than half of the deadline.
        limit_s = self.cfg.start_session_deadline_ms / 1000.0
        caller_limited = caller_remaining_s is not None and caller_remaining_s < limit_s
        if caller_remaining_s is not None:
            limit_s = min(limit_s, caller_remaining_s)
        margin_s = reply_margin_s(self.cfg, limit_s if caller_limited else None)
        reserve_s = min(margin_s + self.after_ranking.high_s(), limit_s / 2)
        budget_s = limit_s - (time.perf_counter() - started) - reserve_s
        request = rpb.ScoreRequest(
            tenant_id=tenant_id,
            session_id=req.session_id,
            query=req.context,
            feature_names=names,
            candidates=[
                rpb.Candidate(
                    id=c.memory.id,
                    text=c.memory.content,
                    baseline_score=c.baseline_score,
                    features=c.features,
                )
                for c in pool[: self.cfg.max_scored]  # the pool is in baseline order here
            ],
        )
        sidecar_due = time.perf_counter() + budget_s
        answer = self.ranking.score(request, budget_s, caller_limited)
        zeros = [0.0] * len(pool)
        # The budget the sidecar was given; 0 when no call went out (circuit open, no time).
        ms, deadline_ms = answer.elapsed_ms, max(0, int(budget_s * 1000)) if answer.called else 0
        due = sidecar_due if answer.called else math.inf

        def decided(
            path: str, reason: str, predictor: list[float], version: str = "", weight: float = 0.0
        ) -> RankDecision:
            return RankDecision(path, reason, version, weight, predictor, ms, deadline_ms, due)

        if answer.value is None:
            return decided(FALLBACK, answer.fallback_reason, zeros)
        sent = len(request.candidates)
        if answer.value.cold_start:
            return decided(BASELINE, "cold_start", zeros)
        if len(answer.value.scores) != sent:  # a sidecar fault, not a cold start
            return decided(FALLBACK, "partial_scores", zeros)
        scores = [s.score for s in answer.value.scores]
        # Candidates beyond what was sent keep the bottom of the predictor's scale.
        scores += [min(scores)] * (len(pool) - sent)
        return decided(MODEL, "", scores, answer.value.model_version, answer.value.predictor_weight)

    def _replay(self, tenant_id: str, s: SessionRow, members: list[SessionMemoryRow]) -> SessionBundle:
        """The bundle a recorded session injected, from its row and candidates, as it stands
        now: a memory deleted since is left out (a deletion hides a memory from sessions at
        once, a retried StartSession included), and one updated since is shown with its new
        content, packed again in the recorded order into the recorded budget so the bundle
        still fits it. Ranks stay the recorded ones: they are what EndSession's training
        pairs refer to."""
        members = sorted((m for m in members if m.injected_rank), key=lambda m: m.injected_rank)
        mems = memory_repo.read_many(
            self.db.reader(), self.db.rows, tenant_id, [m.memory_id for m in members]
        )
        live = [
            (m, mems[m.memory_id]) for m in members if m.memory_id in mems and not mems[m.memory_id].deleted
        ]
        packed = pack([memory for _, memory in live], s.token_budget, len(live))
        injected = [
            Injected(
                live[i][1],
                live[i][0].injected_rank,
                live[i][0].final_score,
                live[i][0].baseline_score,
                live[i][0].predictor_score,
                live[i][0].origin,
                tokens,
            )
            for i, tokens in zip(packed.chosen, packed.tokens, strict=True)
        ]
        now_left_out = len(members) - len(injected)
        row = replace(s, tokens_used=packed.tokens_used, dropped_count=s.dropped_count + now_left_out)
        return SessionBundle(row, injected, render([x.memory for x in injected]))

    def get(self, tenant_id: str, session_id: str) -> SessionBundle:
        if not session_id:
            raise InvalidArgument("session_id", "is required")
        found = session_repo.get_session_and_memories(self.db.reader(), tenant_id, session_id)
        if found is None:
            raise NotFound("session", session_id)
        s, members = found
        bundle = self._replay(tenant_id, s, members)
        bundle.continuity = [
            (m.memory_id, m.relevance, m.relevance_source) for m in members if m.relevance is not None
        ]
        return bundle

    # --- end ---------------------------------------------------------------------------

    @staticmethod
    def _continuity(
        members: Sequence[SessionMemoryRow],
        feedback: Sequence[Feedback],
        transcript: str,
        texts: dict[str, Memory],
        context: str,
    ) -> dict[str, tuple[float, str]]:
        """memory id -> (relevance, source): explicit feedback (for any candidate), else the
        transcript overlap or 0 for each injected memory."""
        known = {m.memory_id for m in members}
        given: dict[str, float] = {}
        for i, fb in enumerate(feedback):
            if fb.memory_id not in known:
                raise InvalidArgument(f"feedback[{i}].memory_id", "was not a candidate of this session")
            given[fb.memory_id] = 1.0 if fb.used and fb.relevance == 0 else fb.relevance
        words = content_words(transcript) if transcript else set()
        asked = content_words(context) if words else set()
        continuity: dict[str, tuple[float, str]] = {}
        for m in members:
            mem = texts.get(m.memory_id)
            if m.memory_id in given:
                continuity[m.memory_id] = (given[m.memory_id], "feedback")
            elif m.injected_rank and words and mem is not None:
                continuity[m.memory_id] = (overlap_relevance(mem.content, words, asked), "transcript")
            elif m.injected_rank:
                continuity[m.memory_id] = (0.0, "default")
        return continuity

    def end(
        self,
        tenant_id: str,
        session_id: str,
        feedback: Sequence[Feedback],
        transcript: str,
        key: IdempotencyKey | None = None,
    ) -> EndResult:
        """Returns (continuity per injected memory, training pairs queued)."""
        out: list[FieldViolation] = []
        if not session_id:
            out.append(FieldViolation("session_id", "is required"))
        judged: set[str] = set()
        for i, fb in enumerate(feedback):
            if not -1.0 <= fb.relevance <= 1.0:
                out.append(FieldViolation(f"feedback[{i}].relevance", "must be between -1 and 1"))
            if fb.memory_id in judged:
                out.append(FieldViolation(f"feedback[{i}].memory_id", "repeats another entry's memory"))
            judged.add(fb.memory_id)
        if len(transcript) > 1_000_000:
            out.append(FieldViolation("transcript", "longer than 1,000,000 characters"))
        raise_if(out)
        now = self.clock()
        # Read and work out everything before taking the sessions' write lock, which every
        # session write shares: done inside it, the reads held it ~14 ms of a 15 ms EndSession
        # (in-process, 100k memories) and 42 ms at the p50 under the bench's load. Inside, one
        # conditional UPDATE ends the session only if it is the one read and still active.
        req = _EndRequest(tenant_id, session_id, feedback, transcript, now)
        reader = self.db.reader()
        ending = self._ending(reader, req, self.db.rows)
        if ending is None:
            self._refuse_early(reader, req, key)
        # Ends that queue while another is written share its transaction (GroupCommit):
        # written in it one after another, as they would have been each in its own; if one
        # fails, each is written again alone, so its error is its own.
        result = self._ends.submit(_EndWrite(req, key, ending))
        self.on_feedback()
        return result

    @property
    def end_writes(self) -> GroupCommit[_EndWrite, EndResult]:
        """EndSession's group commit: how many wait, how many are being written."""
        return self._ends

    def _end_together(self, writes: Sequence[_EndWrite]) -> list[EndResult]:
        with self.db.transaction(WriteDomain.SESSIONS) as cur:
            return [self._write_end(cur, w) for w in writes]

    def _end_alone(self, write: _EndWrite) -> EndResult:
        return self._end_together([write])[0]

    def _write_end(self, cur: Cursor, w: _EndWrite) -> EndResult:
        """One EndSession's writes, inside the sessions' write transaction: the recorded
        answer for a retried request_id, else the session ended (if it is still the active
        one read before the lock, or whatever it is now), its training pairs queued for the
        sidecar and the answer recorded under the request_id."""
        req = w.req
        replay = idempotency_repo.lookup(cur, self.db.stored.requests, req.tenant_id, w.key)
        if replay is not None:
            return [(str(m), float(r), str(src)) for m, r, src in replay["continuity"]], int(replay["pairs"])
        ending = w.ending
        if ending is None or not self._end(cur, req, ending):
            ending = self._end_as_found(cur, req)
        if ending.pairs:  # a session without pairs has nothing to teach the sidecar
            session_repo.enqueue(cur, req.tenant_id, req.session_id, ending.payload, req.now)
        result = [(mid, rel, src) for mid, (rel, src) in ending.continuity.items()]
        idempotency_repo.record(
            cur,
            self.db.stored.requests,
            req.tenant_id,
            w.key,
            {"continuity": result, "pairs": ending.pairs},
            req.now,
        )
        return result, ending.pairs

    @staticmethod
    def _end(cur: Cursor, req: _EndRequest, ending: _Ending) -> bool:
        """End the session as `ending` says, if it is still the active one it was read as."""
        return session_repo.end_session(
            cur,
            req.tenant_id,
            req.session_id,
            ending.start_time_ns,
            ending.continuity,
            req.transcript,
            req.now,
        )

    def _refuse_early(self, cur: Cursor, req: _EndRequest, key: IdempotencyKey | None) -> None:
        """Before the write is queued, when the read found no active session: NOT_FOUND or
        SESSION_ENDED at once, unless an answer is recorded under key (a retry, answered
        from the record in the write) or the session was started since the read. A refusal
        found inside the write rolls back the whole group it joined, and each of the group
        is written again alone: under a stream of such requests (a client ending sessions
        twice) every group paid that, for every tenant."""
        if idempotency_repo.lookup(cur, self.db.stored.requests, req.tenant_id, key) is None:
            self._refuse_unless_active(cur, req)

    @staticmethod
    def _refuse_unless_active(cur: Cursor, req: _EndRequest) -> None:
        state = session_repo.session_state(cur, req.tenant_id, req.session_id)
        if state is None:
            raise NotFound("session", req.session_id)
        if state[0] != "active":
            raise FailedPrecondition(f"session {req.session_id!r} has already ended", reason="SESSION_ENDED")

    def _end_as_found(self, cur: Cursor, req: _EndRequest) -> _Ending:
        """Inside the write transaction, when the session is not the active one read before
        it: say why, or, if it was started (or replaced) after that read, end it as it is."""
        self._refuse_unless_active(cur, req)
        ending = self._ending(cur, req, None)
        if ending is None or not self._end(cur, req, ending):
            raise NotFound("session", req.session_id)  # read active under the same lock: cannot happen
        return ending

    def _ending(self, cur: Cursor, req: _EndRequest, rows: RowCache | None) -> _Ending | None:
        """What ending this session writes; None if it does not exist or is not active.
        `rows`: the row cache, for a read outside the write transaction (inside it, None)."""
        tenant_id, session_id, feedback = req.tenant_id, req.session_id, req.feedback
        found = session_repo.get_session_and_memories(cur, tenant_id, session_id)
        if found is None or found[0].state != "active":
            return None
        s, members = found
        # Texts only of the memories that get a continuity score (injected, or given
        # feedback), not of the whole pool: each row read from DuckDB costs ~0.4 ms at 100k.
        rated = {fb.memory_id for fb in feedback}
        ids = [m.memory_id for m in members if m.injected_rank or m.memory_id in rated]
        texts = (
            memory_repo.get_many(cur, tenant_id, ids)
            if rows is None
            else memory_repo.read_many(cur, rows, tenant_id, ids)
        )
        continuity = self._continuity(members, feedback, req.transcript, texts, s.context)
        training = [m for m in members if m.memory_id in continuity]
        payload = {
            "session_id": training_session_key(session_id, s.start_time_ns),
            "query": s.context,
            "feature_names": s.feature_names,
            "end_time_ns": req.now,
            "candidates": [
                {
                    "id": m.memory_id,
                    "text": texts[m.memory_id].content if m.memory_id in texts else "",
                    "baseline_score": m.baseline_score,
                    "features": m.features,
                    "relevance": continuity[m.memory_id][0],
                    "baseline_rank": m.baseline_rank,
                    "predictor_rank": m.predictor_rank,
                }
                for m in training
            ],
        }
        return _Ending(s.start_time_ns, continuity, len(training), session_repo.encode_payload(payload))


class ScoreFusion:
    """The served score of each candidate: the model's and the baseline's, by the health
    weight, blended as reciprocal ranks (rank_k > 0) or as min-max-scaled scores (0)."""

    def __init__(self, rank_k: float):
        if rank_k < 0:
            raise FailedPrecondition(
                f"ranking.fusion_rank_k must be 0 (blend scores) or more (blend ranks), not {rank_k}",
                reason="BAD_CONFIG",
            )
        self.rank_k = rank_k

    def scores(self, predictor: Sequence[float], baseline: Sequence[float], weight: float) -> list[float]:
        if self.rank_k > 0:
            pred, base = reciprocal_ranks(predictor, self.rank_k), reciprocal_ranks(baseline, self.rank_k)
        else:
            pred, base = minmax(predictor), minmax(baseline)
        return [weight * p + (1 - weight) * b for p, b in zip(pred, base, strict=True)]


def fingerprint(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]
