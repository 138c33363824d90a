"""SQL for learning candidates, learnings and the lifecycle_events audit trail. Functions
take a cursor so callers decide the transaction; every statement is filtered by tenant_id."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from mnemo_server.learning.model import (
    CandidateState,
    Learning,
    LearningCandidate,
    LearningKind,
    LearningState,
    LifecycleEvent,
    Origin,
    SubjectKind,
)
from mnemo_server.memory.model import Scope, ScopeKind, Source
from mnemo_server.store.database import Cursor, fetch_one

# A page position: (create_time_ns, id) of the last row of the previous page.
PagePosition = tuple[int, str]

_CANDIDATE_COLUMNS = (
    "tenant_id, id, scope_kind, scope_id, kind, content, confidence, source, evidence_refs, origin, "
    "state, review_reason, learning_id, create_time_ns, review_time_ns"
)
_LEARNING_COLUMNS = (
    "tenant_id, id, scope_kind, scope_id, kind, content, confidence, state, candidate_id, supersedes_id, "
    "superseded_by_id, revoke_reason, create_time_ns, update_time_ns"
)


def newest_first_page(
    where: list[str],
    params: list[Any],
    before: PagePosition | None,
    limit: int,
) -> tuple[str, list[Any]]:
    """WHERE ... ORDER BY ... LIMIT for newest-first keyset paging on (create_time_ns, id);
    the id breaks ties between rows created in the same nanosecond."""
    clauses, values = list(where), list(params)
    if before is not None:
        clauses.append("(create_time_ns < ? OR (create_time_ns = ? AND id < ?))")
        values.extend([before[0], before[0], before[1]])
    return (f"WHERE {' AND '.join(clauses)} ORDER BY create_time_ns DESC, id DESC LIMIT ?", [*values, limit])


def _placeholders(values: Sequence[Any]) -> str:
    return ", ".join("?" * len(values))


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


# --- candidates ------------------------------------------------------------------------


def _decode_candidate(row: Sequence[Any]) -> LearningCandidate:
    (
        tenant_id,
        cid,
        scope_kind,
        scope_id,
        kind,
        content,
        confidence,
        source,
        evidence_refs,
        origin,
        state,
        review_reason,
        learning_id,
        create_ns,
        review_ns,
    ) = row
    return LearningCandidate(
        id=cid,
        tenant_id=tenant_id,
        scope=Scope(ScopeKind(scope_kind), scope_id),
        kind=LearningKind(kind),
        content=content,
        confidence=float(confidence),
        source=Source(**json.loads(source)),
        evidence_refs=tuple(json.loads(evidence_refs)),
        origin=Origin(origin),
        state=CandidateState(state),
        review_reason=review_reason,
        learning_id=learning_id,
        create_time_ns=create_ns,
        review_time_ns=review_ns,
    )


def insert_candidate(cur: Cursor, c: LearningCandidate) -> None:
    source = {
        "who": c.source.who,
        "why": c.source.why,
        "run_id": c.source.run_id,
        "session_id": c.source.session_id,
    }
    values = [
        c.tenant_id,
        c.id,
        c.scope.kind.value,
        c.scope.id,
        c.kind.value,
        c.content,
        c.confidence,
        _json(source),
        _json(list(c.evidence_refs)),
        c.origin.value,
        c.state.value,
        c.review_reason,
        c.learning_id,
        c.create_time_ns,
        c.review_time_ns,
    ]
    cur.execute(
        f"INSERT INTO learning_candidates ({_CANDIDATE_COLUMNS}) VALUES ({_placeholders(values)})", values
    )


def get_candidate(cur: Cursor, tenant_id: str, candidate_id: str) -> LearningCandidate | None:
    row = fetch_one(
        cur,
        f"SELECT {_CANDIDATE_COLUMNS} FROM learning_candidates WHERE tenant_id = ? AND id = ?",
        [tenant_id, candidate_id],
    )
    return None if row is None else _decode_candidate(row)


def list_candidates(
    cur: Cursor, tenant_id: str, state: CandidateState | None, before: PagePosition | None, limit: int
) -> list[LearningCandidate]:
    where, params = ["tenant_id = ?"], [tenant_id]
    if state is not None:
        where.append("state = ?")
        params.append(state.value)
    tail, values = newest_first_page(where, params, before, limit)
    rows = cur.execute(f"SELECT {_CANDIDATE_COLUMNS} FROM learning_candidates {tail}", values).fetchall()
    return [_decode_candidate(r) for r in rows]


def review_candidate(
    cur: Cursor,
    tenant_id: str,
    candidate_id: str,
    *,
    state: CandidateState,
    reason: str,
    learning_id: str,
    now_ns: int,
) -> None:
    """Move a pending candidate to its final state (the state guard keeps a review final)."""
    cur.execute(
        "UPDATE learning_candidates SET state = ?, review_reason = ?, learning_id = ?, review_time_ns = ? "
        "WHERE tenant_id = ? AND id = ? AND state = ?",
        [state.value, reason, learning_id, now_ns, tenant_id, candidate_id, CandidateState.PENDING.value],
    )


# --- learnings -------------------------------------------------------------------------


def _decode_learning(row: Sequence[Any]) -> Learning:
    (
        tenant_id,
        lid,
        scope_kind,
        scope_id,
        kind,
        content,
        confidence,
        state,
        candidate_id,
        supersedes_id,
        superseded_by_id,
        revoke_reason,
        create_ns,
        update_ns,
    ) = row
    return Learning(
        id=lid,
        tenant_id=tenant_id,
        scope=Scope(ScopeKind(scope_kind), scope_id),
        kind=LearningKind(kind),
        content=content,
        confidence=float(confidence),
        state=LearningState(state),
        candidate_id=candidate_id,
        supersedes_id=supersedes_id,
        superseded_by_id=superseded_by_id,
        revoke_reason=revoke_reason,
        create_time_ns=create_ns,
        update_time_ns=update_ns,
    )


def insert_learning(cur: Cursor, lr: Learning) -> None:
    values = [
        lr.tenant_id,
        lr.id,
        lr.scope.kind.value,
        lr.scope.id,
        lr.kind.value,
        lr.content,
        lr.confidence,
        lr.state.value,
        lr.candidate_id,
        lr.supersedes_id,
        lr.superseded_by_id,
        lr.revoke_reason,
        lr.create_time_ns,
        lr.update_time_ns,
    ]
    cur.execute(f"INSERT INTO learnings ({_LEARNING_COLUMNS}) VALUES ({_placeholders(values)})", values)


def get_learning(cur: Cursor, tenant_id: str, learning_id: str) -> Learning | None:
    row = fetch_one(
        cur,
        f"SELECT {_LEARNING_COLUMNS} FROM learnings WHERE tenant_id = ? AND id = ?",
        [tenant_id, learning_id],
    )
    return None if row is None else _decode_learning(row)


def list_learnings(
    cur: Cursor,
    tenant_id: str,
    *,
    state: LearningState | None,
    kind: LearningKind | None,
    before: PagePosition | None,
    limit: int,
) -> list[Learning]:
    where, params = ["tenant_id = ?"], [tenant_id]
    if state is not None:
        where.append("state = ?")
        params.append(state.value)
    if kind is not None:
        where.append("kind = ?")
        params.append(kind.value)
    tail, values = newest_first_page(where, params, before, limit)
    rows = cur.execute(f"SELECT {_LEARNING_COLUMNS} FROM learnings {tail}", values).fetchall()
    return [_decode_learning(r) for r in rows]


def supersede_learning(
    cur: Cursor, tenant_id: str, learning_id: str, superseded_by_id: str, now_ns: int
) -> None:
    cur.execute(
        "UPDATE learnings SET state = ?, superseded_by_id = ?, update_time_ns = ? "
        "WHERE tenant_id = ? AND id = ? AND state = ?",
        [
            LearningState.SUPERSEDED.value,
            superseded_by_id,
            now_ns,
            tenant_id,
            learning_id,
            LearningState.ACTIVE.value,
        ],
    )


def revoke_learning(cur: Cursor, tenant_id: str, learning_id: str, reason: str, now_ns: int) -> None:
    cur.execute(
        "UPDATE learnings SET state = ?, revoke_reason = ?, update_time_ns = ? "
        "WHERE tenant_id = ? AND id = ? AND state = ?",
        [LearningState.REVOKED.value, reason, now_ns, tenant_id, learning_id, LearningState.ACTIVE.value],
    )


# --- lifecycle events (shared with skills) ---------------------------------------------


def record_events(cur: Cursor, tenant_id: str, events: Sequence[LifecycleEvent]) -> None:
    if events:
        cur.executemany(
            "INSERT INTO lifecycle_events (tenant_id, subject_kind, subject_id, from_state, to_state, "
            "reason, time_ns) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                [tenant_id, e.subject_kind.value, e.subject_id, e.from_state, e.to_state, e.reason, e.time_ns]
                for e in events
            ],
        )


def events_for(cur: Cursor, tenant_id: str, subject_id: str) -> list[LifecycleEvent]:
    """A subject's events, oldest first (insertion order breaks ties within one transaction)."""
    rows = cur.execute(
        "SELECT subject_kind, subject_id, from_state, to_state, reason, time_ns FROM lifecycle_events "
        "WHERE tenant_id = ? AND subject_id = ? ORDER BY time_ns, rowid",
        [tenant_id, subject_id],
    ).fetchall()
    return [LifecycleEvent(SubjectKind(k), s, f, t, r, ns) for k, s, f, t, r, ns in rows]
