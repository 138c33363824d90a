"""Retention: tombstones are hard-purged after their window, only once the index row is gone;
old idempotency records and audit history go too."""

from __future__ import annotations

from pathlib import Path

from mnemo_server.config import RetentionConfig
from mnemo_server.memory.model import IdempotencyKey
from mnemo_server.store import idempotency_repo, memory_repo
from mnemo_server.store.database import Database
from mnemo_server.workers.retention import RetentionWorker
from tests.unit.stored import stored_memory

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
        idempotency_repo.record(
            cur, "t", IdempotencyKey("CreateMemory", "old", "fp"), {"ids": []}, now - 2 * DAY
        )
        idempotency_repo.record(cur, "t", IdempotencyKey("CreateMemory", "new", "fp"), {"ids": []}, now)
    report = RetentionWorker(
        db, RetentionConfig(tombstone_days=30, idempotency_hours=24, history_days=180), clock=lambda: now
    ).sweep()
    assert report.purged_memories == 1
    left = {r[0] for r in db.reader().execute("SELECT id FROM memories").fetchall()}
    assert left == {"m1", "m2", "m3"}
    assert db.reader().execute("SELECT request_id FROM idempotency").fetchall() == [("new",)]
    assert db.reader().execute("SELECT count(*) FROM memory_history").fetchone() == (0,)
    db.close()
