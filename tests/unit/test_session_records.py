"""session_repo.insert_sessions: several StartSession records (a session row and its packed
candidates) in one transaction, as group commit writes them; a taken id fails them all.
The relevance a session's end gives its candidates is read back with them, and an end
writes only to the active session started when its caller read it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mnemo_server.store import session_repo
from mnemo_server.store.database import Cursor, Database, WriteDomain
from mnemo_server.store.session_candidates import SessionMemoryRow
from mnemo_server.store.session_repo import SessionRow, SessionTaken
from tests.unit.stored import packed_candidates, session_row


@pytest.fixture
def db(tmp_path: Path) -> Database:
    return Database(tmp_path / "d.duckdb")


def _write(db: Database, records: list[tuple[SessionRow, bytes]]) -> None:
    with db.transaction(WriteDomain.SESSIONS) as cur:
        session_repo.insert_sessions(cur, records)


def _members(cur: Cursor, sid: str) -> list[SessionMemoryRow]:
    found = session_repo.get_session_and_memories(cur, "t", sid)
    return [] if found is None else found[1]


def test_several_sessions_and_their_candidates_are_written_together(db: Database) -> None:
    _write(
        db, [(session_row("s1"), packed_candidates("s1", 3)), (session_row("s2"), packed_candidates("s2", 2))]
    )
    _write(db, [(session_row("s3"), packed_candidates("s3", 0))])
    cur = db.reader()
    for sid, n in (("s1", 3), ("s2", 2), ("s3", 0)):
        found = session_repo.get_session_and_memories(cur, "t", sid)
        assert found is not None
        stored, members = found
        assert stored.context == f"context of {sid}" and stored.feature_names == ["x"]
        assert [m.memory_id for m in members] == [f"{sid}-m{i}" for i in range(n)]
        assert [(m.candidate_ord, m.injected_rank, m.features) for m in members] == [
            (i, i + 1, [0.5]) for i in range(n)
        ]


def test_the_end_s_relevance_is_read_back_with_the_candidates(db: Database) -> None:
    _write(
        db, [(session_row("s1"), packed_candidates("s1", 3)), (session_row("s2"), packed_candidates("s2", 2))]
    )
    with db.transaction(WriteDomain.SESSIONS) as cur:
        assert session_repo.end_session(cur, "t", "s2", 1, {"s2-m1": (0.75, "feedback")}, "", 9)
        assert session_repo.end_session(cur, "t", "s1", 1, {}, "", 9)
    cur = db.reader()
    assert [(m.relevance, m.relevance_source) for m in _members(cur, "s2")] == [
        (None, ""),
        (0.75, "feedback"),
    ]
    assert [m.relevance for m in _members(cur, "s1")] == [None, None, None]
    ended = session_repo.get_session_and_memories(cur, "t", "s2")
    assert ended is not None and ended[0].state == "ended" and ended[0].end_time_ns == 9


def test_an_end_writes_nothing_unless_the_session_is_active_and_started_when_read(db: Database) -> None:
    _write(db, [(session_row("s1"), packed_candidates("s1", 2))])
    with db.transaction(WriteDomain.SESSIONS) as cur:
        # Started at another time (ended and started again since the caller read it).
        assert not session_repo.end_session(cur, "t", "s1", 2, {"s1-m0": (1.0, "feedback")}, "words", 9)
        assert not session_repo.end_session(cur, "t", "absent", 1, {}, "words", 9)
        assert not session_repo.end_session(cur, "u", "s1", 1, {}, "words", 9)  # another tenant's id
    cur = db.reader()
    found = session_repo.get_session_and_memories(cur, "t", "s1")
    assert found is not None and found[0].state == "active" and found[0].end_time_ns is None
    assert [m.relevance for m in found[1]] == [None, None]
    assert cur.execute("SELECT count(*) FROM session_transcripts").fetchone() == (0,)
    with db.transaction(WriteDomain.SESSIONS) as cur:
        assert session_repo.end_session(cur, "t", "s1", 1, {"s1-m0": (1.0, "feedback")}, "words", 9)
        assert not session_repo.end_session(cur, "t", "s1", 1, {}, "", 10)  # ended already
    found = session_repo.get_session_and_memories(db.reader(), "t", "s1")
    assert found is not None and found[0].end_time_ns == 9 and found[1][0].relevance == 1.0


def test_a_taken_id_fails_the_whole_group_and_writes_none_of_it(db: Database) -> None:
    _write(db, [(session_row("s1"), packed_candidates("s1", 1))])
    with pytest.raises(SessionTaken):
        _write(
            db,
            [
                (session_row("s4"), packed_candidates("s4", 2)),
                (session_row("s1"), packed_candidates("s1", 1)),
            ],
        )
    cur = db.reader()
    assert session_repo.get_session_and_memories(cur, "t", "s4") is None
    assert len(_members(cur, "s1")) == 1


def test_outbox_payloads_are_stored_compressed_and_older_plain_ones_still_read(db: Database) -> None:
    payload = {
        "session_id": "s1",
        "query": "q",
        "candidates": [{"id": f"m{i}", "features": [0.0] * 40} for i in range(60)],
    }
    encoded = session_repo.encode_payload(payload)
    assert len(encoded) < len(json.dumps(payload)) / 10  # repeated features compress
    with db.transaction(WriteDomain.SESSIONS) as cur:
        session_repo.enqueue(cur, "t", "s1", encoded, 5)
        # A payload written before compression: the JSON itself.
        plain = {"session_id": "s0", "query": "older", "candidates": []}
        session_repo.enqueue(cur, "t", "s0", json.dumps(plain).encode(), 4)
    due = session_repo.due(db.reader(), 10, 10)
    decoded = [(d.session_id, session_repo.decode_payload(d.stored)) for d in due]
    assert decoded == [("s0", plain), ("s1", payload)]


@pytest.mark.parametrize(
    "stored",
    [b"{not json", b"[1, 2]", b"\xff\xfe", session_repo.encode_payload({"a": 1})[:-3], b"x\x9c damaged"],
)
def test_a_payload_that_is_not_one_is_a_value_error(stored: bytes) -> None:
    with pytest.raises(ValueError):
        session_repo.decode_payload(stored)


def test_parked_outbox_rows_are_kept_never_due_and_counted_apart(db: Database) -> None:
    with db.transaction(WriteDomain.SESSIONS) as cur:
        for i in range(3):
            session_repo.enqueue(cur, "t", f"s{i}", session_repo.encode_payload({"i": i}), i)
        session_repo.park(cur, "t", "s1", "the payload does not decode")
    assert session_repo.outbox_counts(db.reader()) == (2, 1)
    assert session_repo.pending_count(db.reader()) == 2
    assert [d.session_id for d in session_repo.due(db.reader(), session_repo.PARKED_NS, 10)] == ["s0", "s2"]
    with db.transaction(WriteDomain.SESSIONS) as cur:
        session_repo.mark_delivered(cur, "t", ["s0"], 9)
    assert session_repo.outbox_counts(db.reader()) == (1, 1)
