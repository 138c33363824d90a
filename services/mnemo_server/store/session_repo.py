"""SQL for sessions, what they injected, transcripts, and the training-pair outbox."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import duckdb

from mnemo_server.store import session_candidates
from mnemo_server.store.compressed import deflate, inflate
from mnemo_server.store.database import Cursor, fetch_one
from mnemo_server.store.memory_repo import access_added, arrow_view, id_set
from mnemo_server.store.row_cache import rows_patched
from mnemo_server.store.session_candidates import SessionMemoryRow


@dataclass
class SessionRow:
    tenant_id: str
    id: str
    agent_id: str
    persona_id: str
    project_id: str
    context: str
    state: str
    request_fingerprint: str
    ranking_path: str
    fallback_reason: str
    model_version: str
    predictor_weight: float
    sidecar_ms: float
    sidecar_deadline_ms: int
    took_ms: float
    token_budget: int
    tokens_used: int
    dropped_count: int
    feature_names: list[str]
    start_time_ns: int
    end_time_ns: int | None = None
    feedback_delivered: bool = False


# The columns are SessionRow's fields, in its order; the one list-valued field is stored as
# JSON text.
_SESSION_FIELDS = tuple(f.name for f in fields(SessionRow))
_JSON_FIELD = _SESSION_FIELDS.index("feature_names")
_SESSION_COLUMNS = ", ".join(_SESSION_FIELDS)
_SESSION_VALUES = len(_SESSION_FIELDS)


class SessionTaken(Exception):
    """The tenant already has a session with this id (the transaction must be rolled back)."""


def insert_sessions(cur: Cursor, sessions: Sequence[tuple[SessionRow, bytes]]) -> None:
    """Sessions and their candidates (packed by session_candidates.pack), in one statement
    whatever their number. A taken id fails the whole insert (SessionTaken names the first)."""
    one = "(" + ", ".join("?" * (_SESSION_VALUES + 1)) + ")"
    values = ", ".join([one] * len(sessions))
    try:
        cur.execute(
            f"INSERT INTO sessions ({_SESSION_COLUMNS}, candidates) VALUES {values}",
            [v for s, packed in sessions for v in (*_session_values(s), packed)],
        )
    except duckdb.ConstraintException as exc:
        raise SessionTaken(sessions[0][0].id) from exc


def _session_values(s: SessionRow) -> list[Any]:
    values = [getattr(s, name) for name in _SESSION_FIELDS]
    values[_JSON_FIELD] = json.dumps(values[_JSON_FIELD])
    return values


def get_session_and_memories(
    cur: Cursor, tenant_id: str, session_id: str
) -> tuple[SessionRow, list[SessionMemoryRow]] | None:
    """A session and its candidates in order, with the relevance its end gave them, in one
    read: each DuckDB query costs ~1 ms however small."""
    row = fetch_one(
        cur,
        f"SELECT {_SESSION_COLUMNS}, candidates, continuity FROM sessions WHERE tenant_id = ? AND id = ?",
        [tenant_id, session_id],
    )
    return None if row is None else (_session_row(row[:-2]), _members(row[-2], row[-1]))


def _session_row(row: Sequence[Any]) -> SessionRow:
    values: list[Any] = list(row)
    values[_JSON_FIELD] = json.loads(values[_JSON_FIELD])
    return SessionRow(*values)


def session_state(cur: Cursor, tenant_id: str, session_id: str) -> tuple[str, int] | None:
    """(state, start time) of a session, or None."""
    row = fetch_one(
        cur,
        "SELECT state, start_time_ns FROM sessions WHERE tenant_id = ? AND id = ?",
        [tenant_id, session_id],
    )
    return None if row is None else (str(row[0]), int(row[1]))


def _members(candidates: bytes, continuity: str | None) -> list[SessionMemoryRow]:
    """The stored candidates, each with the relevance the session's end gave it (if any)."""
    members = session_candidates.unpack(candidates)
    if continuity:
        judged = {mid: (float(rel), str(src)) for mid, rel, src in json.loads(continuity)}
        for m in members:
            if m.memory_id in judged:
                m.relevance, m.relevance_source = judged[m.memory_id]
    return members


def end_session(
    cur: Cursor,
    tenant_id: str,
    session_id: str,
    start_time_ns: int,
    relevance: dict[str, tuple[float, str]],
    transcript: str,
    now_ns: int,
) -> bool:
    """End the session started at `start_time_ns`, if it is still active. False, with
    nothing written, when it is not: ended, gone, or started again since (one statement
    where a read of its state first would cost another ~1 ms inside the write lock)."""
    continuity = json.dumps([[mid, rel, src] for mid, (rel, src) in relevance.items()]) if relevance else None
    # DuckDB answers an UPDATE with the number of rows it changed (RETURNING doubled its cost).
    # A session with nothing to score has no training pairs to send: its feedback counts
    # as delivered at once (the caller queues nothing for it).
    changed = fetch_one(
        cur,
        "UPDATE sessions SET state = 'ended', end_time_ns = ?, continuity = ?, feedback_delivered = ? "
        "WHERE tenant_id = ? AND id = ? AND state = 'active' AND start_time_ns = ?",
        [now_ns, continuity, not relevance, tenant_id, session_id, start_time_ns],
    )
    if changed is None or changed[0] == 0:
        return False
    if transcript:
        cur.execute(
            "INSERT OR REPLACE INTO session_transcripts VALUES (?, ?, ?, ?)",
            [tenant_id, session_id, transcript, now_ns],
        )
    return True


def add_accesses(cur: Cursor, accesses: Sequence[tuple[str, str, int, int]]) -> None:
    """Add injections to memories' access counts (a ranker feature): (tenant_id, memory id,
    injections, time of the latest). Rows purged since match nothing; a row deleted
    (tombstoned) since still has its count raised, which no ranking reads again.

    One UPDATE per tenant and count, by memory_repo.id_set: a literal id list up to its
    bound, which DuckDB answers from the ART index (5.6 ms for 80 ids at 100k memories),
    and past it the ids as an Arrow relation, a scan of the table (~10 ms whatever its size)
    where a list of thousands took far longer. A group's last access is the latest time of
    the group, so a memory's can read up to one batch interval late."""
    groups: dict[tuple[str, int], tuple[list[str], int]] = {}
    for tenant_id, memory_id, n, last_ns in accesses:
        ids, latest = groups.get((tenant_id, n), ([], last_ns))
        ids.append(memory_id)
        groups[(tenant_id, n)] = (ids, max(latest, last_ns))
    for (tenant_id, n), (ids, latest) in groups.items():
        rows_patched(tenant_id, ids, access_added(n))
        with id_set(cur, ids) as accessed:
            cur.execute(
                "UPDATE memories SET access_count = access_count + ?, "
                "last_access_ns = greatest(coalesce(last_access_ns, 0), ?) "
                f"WHERE id IN ({accessed}) AND tenant_id = ?",
                [n, latest, tenant_id],
            )


# --- outbox --------------------------------------------------------------------------


# An outbox row that can never be delivered (its payload does not decode, or the sidecar
# refuses it as invalid) is parked: kept, with its error, and never due again, so it neither
# blocks the rows behind it nor counts as pending. Its next attempt is "never".
PARKED_NS = 2**63 - 1
# Far above any session's payload (~70 candidates of at most 20,000 characters, JSON-escaped):
# a bound on what a damaged row can make zlib allocate.
_MAX_PAYLOAD_BYTES = 256 << 20


@dataclass(frozen=True)
class OutboxItem:
    tenant_id: str
    session_id: str
    stored: bytes  # as encode_payload wrote it: decode_payload reads it
    attempts: int


def encode_payload(payload: dict[str, Any]) -> bytes:
    """A session's training pairs as the outbox stores them: JSON, zlib-compressed (level
    1: ~7.4 KB of JSON a session under the bench's mix, written to DuckDB's log at every
    EndSession; session_candidates says why the log's size matters). Encoded by the caller
    before it takes the sessions' write lock."""
    return deflate(json.dumps(payload).encode())


def decode_payload(stored: bytes) -> dict[str, Any]:
    """The payload encode_payload stored; ValueError when it is not one (damaged)."""
    # Payloads stored before compression are plain JSON objects, which begin with "{"; a
    # zlib stream never does (its first byte is 0x78 at every level).
    data = stored if stored[:1] == b"{" else inflate(stored, _MAX_PAYLOAD_BYTES, "an outbox payload's bytes")
    payload = json.loads(data)
    if not isinstance(payload, dict):
        raise ValueError(f"an outbox payload is a JSON object, not {type(payload).__name__}")
    return payload


def enqueue(cur: Cursor, tenant_id: str, session_id: str, payload: bytes, now_ns: int) -> None:
    """Queue a session's training pairs (encoded by `encode_payload`) for the sidecar."""
    cur.execute(
        "INSERT INTO sidecar_outbox (tenant_id, session_id, payload, create_time_ns, next_attempt_ns) "
        "VALUES (?, ?, ?, ?, ?)",
        [tenant_id, session_id, payload, now_ns, now_ns],
    )


def due(cur: Cursor, now_ns: int, limit: int) -> list[OutboxItem]:
    rows = cur.execute(
        "SELECT tenant_id, session_id, payload, attempts FROM sidecar_outbox WHERE delivered_ns IS NULL "
        "AND next_attempt_ns <= ? ORDER BY create_time_ns LIMIT ?",
        [min(now_ns, PARKED_NS - 1), limit],  # a parked row is never due
    ).fetchall()
    return [OutboxItem(t, s, bytes(p), a) for t, s, p, a in rows]


def mark_delivered(cur: Cursor, tenant_id: str, session_ids: Sequence[str], now_ns: int) -> None:
    """Record these sessions' training pairs as delivered: one statement per table however
    many there are (a literal id list, which DuckDB answers from the indexes on the ids)."""
    if not session_ids:
        return
    with id_set(cur, session_ids) as ids:
        cur.execute(
            "UPDATE sidecar_outbox SET delivered_ns = ?, attempts = attempts + 1 "
            f"WHERE tenant_id = ? AND session_id IN ({ids})",
            [now_ns, tenant_id],
        )
        cur.execute(
            f"UPDATE sessions SET feedback_delivered = TRUE WHERE tenant_id = ? AND id IN ({ids})",
            [tenant_id],
        )


def mark_failed(cur: Cursor, tenant_id: str, session_id: str, next_attempt_ns: int, error: str) -> None:
    cur.execute(
        "UPDATE sidecar_outbox SET attempts = attempts + 1, next_attempt_ns = ?, last_error = ? "
        "WHERE tenant_id = ? AND session_id = ?",
        [next_attempt_ns, error[:500], tenant_id, session_id],
    )


def park(cur: Cursor, tenant_id: str, session_id: str, error: str) -> None:
    """Keep the row and its error, and never try it again (see PARKED_NS)."""
    mark_failed(cur, tenant_id, session_id, PARKED_NS, error)


def unpark(cur: Cursor, now_ns: int) -> int:
    """Make every parked row due again; returns how many."""
    # DuckDB answers an UPDATE with the number of rows it changed.
    row = fetch_one(
        cur,
        "UPDATE sidecar_outbox SET next_attempt_ns = ? WHERE delivered_ns IS NULL AND next_attempt_ns = ?",
        [now_ns, PARKED_NS],
    )
    return int(row[0]) if row else 0


def outbox_counts(cur: Cursor) -> tuple[int, int]:
    """(rows still to deliver, parked rows)."""
    row = fetch_one(
        cur,
        "SELECT count(*) FILTER (WHERE next_attempt_ns < ?), count(*) FILTER (WHERE next_attempt_ns = ?) "
        "FROM sidecar_outbox WHERE delivered_ns IS NULL",
        [PARKED_NS, PARKED_NS],
    )
    return (int(row[0]), int(row[1])) if row else (0, 0)


def pending_count(cur: Cursor) -> int:
    """Rows still to deliver, parked ones not included."""
    return outbox_counts(cur)[0]


# --- retention ---------------------------------------------------------------------------


def purge_delivered_feedback(cur: Cursor, before_ns: int) -> None:
    """Outbox rows the sidecar acknowledged before `before_ns`: it holds the pairs now (and
    the session's row says they were delivered), so the payload is only disk."""
    cur.execute("DELETE FROM sidecar_outbox WHERE delivered_ns < ?", [before_ns])


def purge_sessions(cur: Cursor, before_ns: int, limit: int) -> int:
    """Delete up to `limit` sessions last active (ended, else started) before `before_ns`,
    with their transcripts and outbox rows; never one whose feedback is still to be
    delivered (a parked row does not keep it: it had the whole window). Returns how many.

    Any `limit` of them, not the oldest: all go in the end, and unordered the query stops
    once it has found them, where ordered each batch sorted every session waiting (300k
    expired sessions, batches of 500: the query 1.4-1.9 against 5.0-5.3 ms). A batch still
    costs ~30 ms at 300k, mostly the three deletes, inside the sessions' write lock; they
    join the batch, as literal id lists of that size took twice as long."""
    doomed = cur.execute(
        "SELECT s.tenant_id, s.id FROM sessions s WHERE coalesce(s.end_time_ns, s.start_time_ns) < ? "
        "AND NOT EXISTS (SELECT 1 FROM sidecar_outbox o WHERE o.tenant_id = s.tenant_id "
        "AND o.session_id = s.id AND o.delivered_ns IS NULL AND o.next_attempt_ns < ?) LIMIT ?",
        [before_ns, PARKED_NS, limit],
    ).fetchall()
    if doomed:
        with arrow_view(cur, "doomed_sessions", [{"tenant_id": t, "id": i} for t, i in doomed]):
            for table, key in (
                ("session_transcripts", "session_id"),
                ("sidecar_outbox", "session_id"),
                ("sessions", "id"),
            ):
                cur.execute(
                    f"DELETE FROM {table} USING doomed_sessions d "
                    f"WHERE {table}.tenant_id = d.tenant_id AND {table}.{key} = d.id"
                )
    return len(doomed)
