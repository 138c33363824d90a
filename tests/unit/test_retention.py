"""Retention: tombstones are hard-purged after their window, only once the index row is gone;
old idempotency records and audit history go too, and old sessions and delivered training
pairs, never pairs still to deliver."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mnemo_server.config import RetentionConfig
from mnemo_server.memory.model import IdempotencyKey
from mnemo_server.store import idempotency_repo, memory_repo, session_repo
from mnemo_server.store.database import Database, WriteDomain
from mnemo_server.store.session_repo import SessionRow
from mnemo_server.workers.retention import RetentionWorker
from tests.unit.stored import packed_candidates, session_row, stored_memory

DAY = 86_400 * 1_000_000_000


def test_sweep_purges_only_expired_and_unindexed_tombstones(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    now = 100 * DAY
    with db.transaction() as cur:
        memory_repo.insert_many(cur, [(stored_memory(i, 0), f"memory {i}") for i in range(4)], db.stored)
        memory_repo.tombstone(cur, "t", ["m0", "m1"], now - 40 * DAY)  # past the 30-day window
        memory_repo.tombstone(cur, "t", ["m2"], now - 5 * DAY)  # still inside it
        # m1 is still in the search index: it must not be purged before the index row is gone.
        cur.execute("UPDATE memories SET indexed_revision = revision WHERE id = 'm1'")
        memory_repo.record_history(cur, [("t", "m3", "create", "api", "", {})], now - 200 * DAY)
        for request_id, at in (("old", now - 2 * DAY), ("new", now)):
            key = IdempotencyKey("CreateMemory", request_id, "fp")
            idempotency_repo.record(cur, db.stored.requests, "t", key, {"ids": []}, at)
    report = RetentionWorker(
        db, RetentionConfig(tombstone_days=30, idempotency_hours=24, history_days=180), clock=lambda: now
    ).sweep()
    assert report.purged_memories == 1
    left = {r[0] for r in db.reader().execute("SELECT id FROM memories").fetchall()}
    assert left == {"m1", "m2", "m3"}
    assert db.reader().execute("SELECT request_id FROM idempotency").fetchall() == [("new",)]
    assert db.reader().execute("SELECT count(*) FROM memory_history").fetchone() == (0,)
    db.close()


def test_memory_purges_leave_the_sessions_lock_to_session_writes(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    now = 100 * DAY
    with db.transaction() as cur:
        memory_repo.insert_many(cur, [(stored_memory(i, 0), f"memory {i}") for i in range(3)], db.stored)
        memory_repo.tombstone(cur, "t", ["m0", "m1"], now - 40 * DAY)
        memory_repo.record_history(cur, [("t", "m2", "create", "api", "", {})], now - 200 * DAY)
    before = db.write_lock_stats
    report = RetentionWorker(
        db, RetentionConfig(tombstone_days=30, session_days=0), clock=lambda: now
    ).sweep()
    after = db.write_lock_stats
    assert report.purged_memories == 2
    assert db.reader().execute("SELECT count(*) FROM memory_history").fetchall() == [(0,)]
    # Tombstones, idempotency records, history: three memories transactions. Only the
    # idempotency purge (records every domain writes) and the delivered feedback's take the
    # sessions lock; the tombstone and history purges do not.
    taken = {d: after[d].transactions - before[d].transactions for d in WriteDomain}
    assert taken == {WriteDomain.MEMORIES: 3, WriteDomain.SESSIONS: 2, WriteDomain.SESSION_STARTS: 1}
    db.close()


def test_sweep_drops_old_sessions_and_delivered_feedback_but_never_feedback_still_to_deliver(
    tmp_path: Path,
) -> None:
    db = Database(tmp_path / "d.duckdb")
    now = 400 * DAY
    payload = session_repo.encode_payload({"pairs": 1})

    def session(sid: str, started_days_ago: float) -> tuple[SessionRow, bytes]:
        return replace(session_row(sid), start_time_ns=now - int(started_days_ago * DAY)), packed_candidates(
            sid, 2
        )

    with db.transaction(WriteDomain.SESSIONS) as cur:
        session_repo.insert_sessions(
            cur,
            [
                session("old-delivered", 200),
                session("old-pending", 200),
                session("old-parked", 200),
                session("old-never-ended", 190),
                session("recent", 20),
                session("recent-fresh-delivery", 20),
            ],
        )
        for sid in ("old-delivered", "old-pending", "old-parked"):
            started, ended = now - 200 * DAY, now - 190 * DAY
            assert session_repo.end_session(cur, "t", sid, started, {}, f"transcript of {sid}", ended)
            session_repo.enqueue(cur, "t", sid, payload, now - 190 * DAY)
        session_repo.mark_delivered(cur, "t", ["old-delivered"], now - 190 * DAY)
        session_repo.park(cur, "t", "old-parked", "the sidecar refuses the pairs")
        for sid, delivered_hours_ago in (("recent", 48), ("recent-fresh-delivery", 1)):
            assert session_repo.end_session(cur, "t", sid, now - 20 * DAY, {}, "", now - 10 * DAY)
            session_repo.enqueue(cur, "t", sid, payload, now - 10 * DAY)
            session_repo.mark_delivered(cur, "t", [sid], now - delivered_hours_ago * 3600 * 10**9)
    report = RetentionWorker(
        db, RetentionConfig(session_days=180, delivered_feedback_hours=24), clock=lambda: now
    ).sweep()

    def ids(sql: str) -> set[str]:
        return {r[0] for r in db.reader().execute(sql).fetchall()}

    assert report.purged_sessions == 3
    assert ids("SELECT id FROM sessions") == {"old-pending", "recent", "recent-fresh-delivery"}
    assert ids("SELECT session_id FROM session_transcripts") == {"old-pending"}
    # Still to deliver: kept whatever its age; delivered 2 days ago: gone; an hour ago: kept.
    assert ids("SELECT session_id FROM sidecar_outbox") == {"old-pending", "recent-fresh-delivery"}
    assert session_repo.outbox_counts(db.reader()) == (1, 0)
    # What is left reads back whole.
    kept = session_repo.get_session_and_memories(db.reader(), "t", "old-pending")
    assert kept is not None and len(kept[1]) == 2
    db.close()


def test_session_days_zero_keeps_every_session(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    with db.transaction(WriteDomain.SESSIONS) as cur:
        session_repo.insert_sessions(cur, [(session_row("ancient"), packed_candidates("ancient", 1))])
    report = RetentionWorker(db, RetentionConfig(session_days=0), clock=lambda: 10_000 * DAY).sweep()
    assert report.purged_sessions == 0
    assert db.reader().execute("SELECT id FROM sessions").fetchall() == [("ancient",)]
    db.close()
