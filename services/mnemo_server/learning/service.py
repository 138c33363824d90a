"""The learning domain: candidates are proposed, reviewed (published or rejected), and
published learnings can be superseded or revoked.

Every write is one short transaction that also records a lifecycle event per state change,
so the audit trail never disagrees with the rows. Revoking or superseding a learning
revokes the skills promoted from it in the same transaction: a skill must never outlive
its source (kheish-learning-and-skills.txt: "revoking or superseding a promoted source
learning also revokes the linked promoted skill").
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from mnemo_server.errors import FailedPrecondition, FieldViolation, InvalidArgument, NotFound
from mnemo_server.learning.model import (
    CandidateDraft,
    CandidateState,
    Learning,
    LearningCandidate,
    LearningKind,
    LearningState,
    LifecycleEvent,
    Origin,
    PublishResult,
    SubjectKind,
)
from mnemo_server.learning.secrets_guard import refuse_secret_material
from mnemo_server.memory.model import IdempotencyKey, Scope, ScopeKind, now_ns
from mnemo_server.memory.paging import (
    ANSWER_BYTES,
    decode_token,
    encode_token,
    fitting,
    query_fingerprint,
    row_bytes,
)
from mnemo_server.memory.validation import Validator, check_unit_interval, raise_if
from mnemo_server.skills.model import SkillState
from mnemo_server.store import idempotency_repo, learning_repo, skill_repo, snapshots
from mnemo_server.store.database import Cursor, Database
from mnemo_server.store.learning_repo import PagePosition

MAX_CONTENT_CHARS = 4_000
MAX_EVIDENCE_REFS = 20
MAX_EVIDENCE_REF_CHARS = 256
MAX_REASON_CHARS = 1_000
# Procedures legitimately say how credentials are wired ("export API_KEY=$(vault read ...)"),
# so they are screened for secrets themselves only (a key, a token, a private key): they become
# skills, the most widely shared text there is. Run summaries are the daemon's own output.
SECRET_SCREENED_KINDS = frozenset({LearningKind.FACT, LearningKind.PREFERENCE, LearningKind.DECISION})
LITERAL_SECRET_SCREENED_KINDS = frozenset({LearningKind.PROCEDURE})


# --- newest-first paging, shared with skills ----------------------------------------------


class _Dated(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def create_time_ns(self) -> int: ...


RowT = TypeVar("RowT", bound=_Dated)


def fetch_page(
    fetch: Callable[[PagePosition | None, int], list[RowT]],
    validator: Validator,
    page_size: int,
    page_token: str,
    fingerprint: str,
) -> tuple[list[RowT], str]:
    """One page of rows newest first, plus the token for the next page ("" on the last).
    A page holds fewer rows than asked when more would not fit one answer a default gRPC
    client takes (memory/paging.py): 120 candidates or 230 skills of allowed sizes made a
    4.9 MB answer at page_size 1000, which such clients refused (probe)."""
    size = validator.page_size(page_size)
    position = decode_token(page_token, fingerprint, _is_time_and_id)
    rows = fetch(None if position is None else (position[0], position[1]), size + 1)
    fit = fitting(rows[:size], row_bytes, largest=ANSWER_BYTES + 1)
    if len(rows) <= fit:
        return rows, ""
    last = rows[fit - 1]
    return rows[:fit], encode_token([last.create_time_ns, last.id], fingerprint)


def _is_time_and_id(position: Any) -> bool:
    return (
        isinstance(position, list)
        and len(position) == 2
        and type(position[0]) is int
        and isinstance(position[1], str)
    )


def require_id(ident: str, field: str) -> None:
    if not ident:
        raise InvalidArgument(field, "is required")


def _check_content(content: str, out: list[FieldViolation]) -> None:
    if not content.strip():
        out.append(FieldViolation("candidate.content", "is required"))
    elif len(content) > MAX_CONTENT_CHARS:
        out.append(
            FieldViolation(
                "candidate.content", f"is {len(content)} characters; the limit is {MAX_CONTENT_CHARS}"
            )
        )
    if "\x00" in content:
        out.append(FieldViolation("candidate.content", "must not contain NUL characters"))


def _check_evidence_refs(refs: tuple[str, ...], out: list[FieldViolation]) -> None:
    if len(refs) > MAX_EVIDENCE_REFS:
        out.append(
            FieldViolation(
                "candidate.evidence_refs", f"holds {len(refs)} entries; the limit is {MAX_EVIDENCE_REFS}"
            )
        )
    for i, ref in enumerate(refs):
        if not ref.strip():
            out.append(FieldViolation(f"candidate.evidence_refs[{i}]", "must not be empty"))
        elif len(ref) > MAX_EVIDENCE_REF_CHARS:
            out.append(
                FieldViolation(
                    f"candidate.evidence_refs[{i}]", f"longer than {MAX_EVIDENCE_REF_CHARS} characters"
                )
            )


def check_reason(reason: str, *, required: bool) -> None:
    if required and not reason.strip():
        raise InvalidArgument("reason", "is required")
    if len(reason) > MAX_REASON_CHARS:
        raise InvalidArgument("reason", f"is {len(reason)} characters; the limit is {MAX_REASON_CHARS}")
    if "\x00" in reason:
        raise InvalidArgument("reason", "must not contain NUL characters")
    refuse_secret_material("reason", reason)


# --- the service ------------------------------------------------------------------------


class LearningService:
    def __init__(self, db: Database, validator: Validator, clock: Callable[[], int] = now_ns):
        self.db = db
        self.validator = validator
        self.clock = clock

    # --- candidates -------------------------------------------------------------------

    def create_candidate(
        self,
        tenant_id: str,
        draft: CandidateDraft,
        *,
        origin: Origin = Origin.API,
        key: IdempotencyKey | None = None,
    ) -> LearningCandidate:
        draft, kind = self._checked(draft, origin)
        with self.db.transaction() as cur:
            now = self.clock()  # under the write lock: lifecycle events stay in the order written
            replay = idempotency_repo.lookup(cur, self.db.stored.requests, tenant_id, key)
            if replay is not None:
                return self._candidate(cur, tenant_id, replay["id"])
            candidate = LearningCandidate(
                id=str(uuid.uuid4()),
                tenant_id=tenant_id,
                scope=draft.scope,
                kind=kind,
                content=draft.content,
                confidence=draft.confidence,
                source=draft.source,
                evidence_refs=draft.evidence_refs,
                origin=origin,
                state=CandidateState.PENDING,
                create_time_ns=now,
            )
            learning_repo.insert_candidate(cur, candidate)
            learning_repo.record_events(
                cur,
                tenant_id,
                [
                    LifecycleEvent(
                        SubjectKind.CANDIDATE,
                        candidate.id,
                        "",
                        CandidateState.PENDING,
                        f"proposed by {origin}",
                        now,
                    )
                ],
            )
            idempotency_repo.record(cur, self.db.stored.requests, tenant_id, key, {"id": candidate.id}, now)
            # Read back, so callers see what a later get returns (confidence is stored as FLOAT).
            return self._candidate(cur, tenant_id, candidate.id)

    def _checked(self, d: CandidateDraft, origin: Origin) -> tuple[CandidateDraft, LearningKind]:
        """The draft with its scope normalised, or INVALID_ARGUMENT naming the fields."""
        if d.kind is LearningKind.RUN_SUMMARY and origin is Origin.API:
            raise InvalidArgument(
                "candidate.kind",
                "run summaries are made by the server from finished "
                "runs; propose a fact, preference, decision or procedure",
                reason="RUN_SUMMARY_NOT_ALLOWED",
            )
        out: list[FieldViolation] = []
        if d.kind is None:
            out.append(
                FieldViolation("candidate.kind", "is required (fact, preference, decision or procedure)")
            )
        _check_content(d.content, out)
        check_unit_interval(d.confidence, "candidate.confidence", out)
        self.validator.scope_id(d.scope.kind, d.scope.id, "candidate.scope.id", out)
        _check_evidence_refs(d.evidence_refs, out)
        limit = self.validator.limits.max_scope_id_chars
        for name in ("who", "why", "run_id", "session_id"):
            if len(getattr(d.source, name)) > limit:
                out.append(FieldViolation(f"candidate.source.{name}", f"longer than {limit} characters"))
        raise_if(out)
        kind = d.kind
        assert kind is not None  # reported above
        if kind in SECRET_SCREENED_KINDS or kind in LITERAL_SECRET_SCREENED_KINDS:
            refuse_secret_material("candidate.content", d.content, mentions=kind in SECRET_SCREENED_KINDS)
        # The rest of a candidate's text is shown beside it: no secret itself there either.
        for i, ref in enumerate(d.evidence_refs):
            refuse_secret_material(f"candidate.evidence_refs[{i}]", ref)
        for name in ("who", "why", "run_id", "session_id"):
            refuse_secret_material(f"candidate.source.{name}", getattr(d.source, name))
        scope = Scope.workspace() if d.scope.kind is ScopeKind.WORKSPACE else d.scope
        return CandidateDraft(
            kind=kind,
            content=d.content,
            scope=scope,
            confidence=d.confidence,
            source=d.source,
            evidence_refs=tuple(d.evidence_refs),
        ), kind

    def get_candidate(self, tenant_id: str, candidate_id: str) -> LearningCandidate:
        require_id(candidate_id, "id")
        return self._candidate(self.db.reader(), tenant_id, candidate_id)

    def list_candidates(
        self, tenant_id: str, *, state: CandidateState | None, page_size: int, page_token: str
    ) -> tuple[list[LearningCandidate], str]:
        cur = self.db.reader()
        return fetch_page(
            lambda before, limit: learning_repo.list_candidates(cur, tenant_id, state, before, limit),
            self.validator,
            page_size,
            page_token,
            query_fingerprint("learning_candidates", tenant_id, state),
        )

    def publish_candidate(
        self,
        tenant_id: str,
        candidate_id: str,
        *,
        reason: str = "",
        supersedes_id: str = "",
        key: IdempotencyKey | None = None,
    ) -> PublishResult:
        require_id(candidate_id, "id")
        check_reason(reason, required=False)
        with self.db.transaction() as cur:
            now = self.clock()  # under the write lock: lifecycle events stay in the order written
            replay = idempotency_repo.lookup(cur, self.db.stored.requests, tenant_id, key)
            if replay is not None:
                return self._published_as_left(cur, tenant_id, replay)
            candidate = self._pending(cur, tenant_id, candidate_id)
            if supersedes_id:
                self._check_supersedable(cur, tenant_id, supersedes_id, candidate)
            learning = Learning(
                id=str(uuid.uuid4()),
                tenant_id=tenant_id,
                scope=candidate.scope,
                kind=candidate.kind,
                content=candidate.content,
                confidence=candidate.confidence,
                state=LearningState.ACTIVE,
                candidate_id=candidate.id,
                supersedes_id=supersedes_id,
                create_time_ns=now,
                update_time_ns=now,
            )
            learning_repo.insert_learning(cur, learning)
            learning_repo.review_candidate(
                cur,
                tenant_id,
                candidate.id,
                state=CandidateState.PUBLISHED,
                reason=reason,
                learning_id=learning.id,
                now_ns=now,
            )
            events = [
                LifecycleEvent(
                    SubjectKind.CANDIDATE,
                    candidate.id,
                    CandidateState.PENDING,
                    CandidateState.PUBLISHED,
                    reason,
                    now,
                ),
                LifecycleEvent(
                    SubjectKind.LEARNING,
                    learning.id,
                    "",
                    LearningState.ACTIVE,
                    f"published from candidate {candidate.id}",
                    now,
                ),
            ]
            if supersedes_id:
                learning_repo.supersede_learning(cur, tenant_id, supersedes_id, learning.id, now)
                events.append(
                    LifecycleEvent(
                        SubjectKind.LEARNING,
                        supersedes_id,
                        LearningState.ACTIVE,
                        LearningState.SUPERSEDED,
                        f"superseded by {learning.id}",
                        now,
                    )
                )
                events += _revoke_skills_from(
                    cur,
                    tenant_id,
                    supersedes_id,
                    f"source learning {supersedes_id} superseded by {learning.id}",
                    now,
                )
            learning_repo.record_events(cur, tenant_id, events)
            published = PublishResult(
                self._candidate(cur, tenant_id, candidate.id), self._learning(cur, tenant_id, learning.id)
            )
            outcome = {
                "candidate_id": candidate.id,
                "learning_id": learning.id,
                "published": snapshots.dump(published),
            }
            idempotency_repo.record(cur, self.db.stored.requests, tenant_id, key, outcome, now)
            return published

    def _published_as_left(self, cur: Cursor, tenant_id: str, replay: dict[str, Any]) -> PublishResult:
        """A retried publish's answer as the first call left it (a retry returns the first
        result, not a learning revoked since); records from before answers were kept name
        only the ids, which are then read as they are."""
        kept = replay.get("published")
        if kept is not None:
            return snapshots.load(PublishResult, kept)
        return PublishResult(
            self._candidate(cur, tenant_id, replay["candidate_id"]),
            self._learning(cur, tenant_id, replay["learning_id"]),
        )

    def _check_supersedable(
        self, cur: Cursor, tenant_id: str, learning_id: str, candidate: LearningCandidate
    ) -> None:
        old = learning_repo.get_learning(cur, tenant_id, learning_id)
        if old is None:
            raise NotFound("learning", learning_id, field="supersedes_id")
        if old.state is not LearningState.ACTIVE:
            raise FailedPrecondition(
                f"supersedes_id: learning {learning_id} is {old.state}; only an active "
                "learning can be superseded",
                reason="LEARNING_NOT_ACTIVE",
                metadata={"learning_id": learning_id, "state": old.state.value},
            )
        if old.scope != candidate.scope or old.kind is not candidate.kind:
            raise FailedPrecondition(
                f"supersedes_id: learning {learning_id} is a {old.kind} in scope {old.scope.key}, the "
                f"candidate a {candidate.kind} in scope {candidate.scope.key}; only a learning of the same "
                "scope and kind can be superseded",
                reason="SUPERSEDES_MISMATCH",
                metadata={"learning_id": learning_id},
            )

    def reject_candidate(
        self, tenant_id: str, candidate_id: str, reason: str, *, key: IdempotencyKey | None = None
    ) -> LearningCandidate:
        require_id(candidate_id, "id")
        check_reason(reason, required=True)
        with self.db.transaction() as cur:
            now = self.clock()  # under the write lock: lifecycle events stay in the order written
            replay = idempotency_repo.lookup(cur, self.db.stored.requests, tenant_id, key)
            if replay is not None:
                return snapshots.load(LearningCandidate, replay["rejected"])
            candidate = self._pending(cur, tenant_id, candidate_id)
            learning_repo.review_candidate(
                cur,
                tenant_id,
                candidate.id,
                state=CandidateState.REJECTED,
                reason=reason,
                learning_id="",
                now_ns=now,
            )
            learning_repo.record_events(
                cur,
                tenant_id,
                [
                    LifecycleEvent(
                        SubjectKind.CANDIDATE,
                        candidate.id,
                        CandidateState.PENDING,
                        CandidateState.REJECTED,
                        reason,
                        now,
                    )
                ],
            )
            rejected = self._candidate(cur, tenant_id, candidate.id)
            outcome = {"rejected": snapshots.dump(rejected)}
            idempotency_repo.record(cur, self.db.stored.requests, tenant_id, key, outcome, now)
            return rejected

    def _candidate(self, cur: Cursor, tenant_id: str, candidate_id: str) -> LearningCandidate:
        found = learning_repo.get_candidate(cur, tenant_id, candidate_id)
        if found is None:
            raise NotFound("learning_candidate", candidate_id)
        return found

    def _pending(self, cur: Cursor, tenant_id: str, candidate_id: str) -> LearningCandidate:
        candidate = self._candidate(cur, tenant_id, candidate_id)
        if candidate.state is not CandidateState.PENDING:
            raise FailedPrecondition(
                f"learning candidate {candidate_id} is already {candidate.state}; only "
                "pending candidates can be reviewed",
                reason="CANDIDATE_NOT_PENDING",
                metadata={"candidate_id": candidate_id, "state": candidate.state.value},
            )
        return candidate

    # --- learnings --------------------------------------------------------------------

    def get_learning(self, tenant_id: str, learning_id: str) -> Learning:
        require_id(learning_id, "id")
        return self._learning(self.db.reader(), tenant_id, learning_id)

    def list_learnings(
        self,
        tenant_id: str,
        *,
        state: LearningState | None,
        kind: LearningKind | None,
        page_size: int,
        page_token: str,
    ) -> tuple[list[Learning], str]:
        cur = self.db.reader()
        return fetch_page(
            lambda before, limit: learning_repo.list_learnings(
                cur, tenant_id, state=state, kind=kind, before=before, limit=limit
            ),
            self.validator,
            page_size,
            page_token,
            query_fingerprint("learnings", tenant_id, state, kind),
        )

    def revoke_learning(
        self, tenant_id: str, learning_id: str, reason: str, *, key: IdempotencyKey | None = None
    ) -> Learning:
        require_id(learning_id, "id")
        check_reason(reason, required=True)
        with self.db.transaction() as cur:
            now = self.clock()  # under the write lock: lifecycle events stay in the order written
            replay = idempotency_repo.lookup(cur, self.db.stored.requests, tenant_id, key)
            if replay is not None:
                return snapshots.load(Learning, replay["revoked"])
            current = self._learning(cur, tenant_id, learning_id)
            if current.state is not LearningState.ACTIVE:
                raise FailedPrecondition(
                    f"learning {learning_id} is {current.state}; only active learnings can be revoked",
                    reason="LEARNING_NOT_ACTIVE",
                    metadata={"learning_id": learning_id, "state": current.state.value},
                )
            learning_repo.revoke_learning(cur, tenant_id, learning_id, reason, now)
            learning_repo.record_events(
                cur,
                tenant_id,
                [
                    LifecycleEvent(
                        SubjectKind.LEARNING,
                        learning_id,
                        LearningState.ACTIVE,
                        LearningState.REVOKED,
                        reason,
                        now,
                    ),
                    *_revoke_skills_from(
                        cur, tenant_id, learning_id, f"source learning {learning_id} revoked: {reason}", now
                    ),
                ],
            )
            revoked = self._learning(cur, tenant_id, learning_id)
            outcome = {"revoked": snapshots.dump(revoked)}
            idempotency_repo.record(cur, self.db.stored.requests, tenant_id, key, outcome, now)
            return revoked

    def _learning(self, cur: Cursor, tenant_id: str, learning_id: str) -> Learning:
        found = learning_repo.get_learning(cur, tenant_id, learning_id)
        if found is None:
            raise NotFound("learning", learning_id)
        return found


def _revoke_skills_from(
    cur: Cursor, tenant_id: str, learning_id: str, why: str, now: int
) -> list[LifecycleEvent]:
    """Revoke the skills promoted from a learning that stops being active; their events."""
    skills = skill_repo.unrevoked_skills_from(cur, tenant_id, learning_id)
    skill_repo.set_state(cur, tenant_id, [s.id for s in skills], SkillState.REVOKED, now)
    return [LifecycleEvent(SubjectKind.SKILL, s.id, s.state, SkillState.REVOKED, why, now) for s in skills]
