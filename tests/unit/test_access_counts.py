"""StartSession's access counts: recorded in memory, written in one transaction per flush,
kept for the next flush when a write fails, and never lost by batching (the sums are those
of one update per injection; a last access time is its batch's latest, never moved back)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mnemo_server.errors import FailedPrecondition
from mnemo_server.sessions.access_counts import AccessCounts
from mnemo_server.store import memory_repo
from mnemo_server.store.database import Database, WriteDomain
from tests.unit.stored import database_with_memories


def _counts(db: Database) -> dict[str, tuple[int, int | None]]:
    rows = db.reader().execute("SELECT id, access_count, last_access_ns FROM memories ORDER BY id").fetchall()
    return {str(i): (int(n), None if last is None else int(last)) for i, n, last in rows}


def test_a_flush_writes_sums_and_latest_times_in_one_transaction(tmp_path: Path) -> None:
    db = database_with_memories(tmp_path / "d.duckdb", count=4)
    counts = AccessCounts(db)
    counts.record("t", ["m0", "m1"], 100)
    counts.record("t", ["m1", "m2"], 300)
    counts.record("t", ["m1"], 200)  # an earlier time arriving later does not move last_access back
    counts.record("t", ["gone"], 400)  # a memory deleted since: skipped, not an error
    assert _counts(db)["m1"] == (0, None)  # nothing written before the flush
    before = db.write_lock_stats[WriteDomain.MEMORIES].transactions
    assert counts.flush() == 4 and counts.pending() == 0
    assert db.write_lock_stats[WriteDomain.MEMORIES].transactions == before + 1
    got = _counts(db)
    assert {i: n for i, (n, _) in got.items()} == {"m0": 1, "m1": 3, "m2": 1, "m3": 0}
    assert got["m1"][1] == 300 and got["m3"][1] is None
    assert 100 <= (got["m0"][1] or 0) <= 400 and 300 <= (got["m2"][1] or 0) <= 400  # the batch's latest
    assert counts.flush() == 0  # nothing pending: no transaction at all
    assert db.write_lock_stats[WriteDomain.MEMORIES].transactions == before + 1
    counts.record("t", ["m1"], 50)
    counts.flush()
    assert _counts(db)["m1"] == (4, 300)  # an older time does not move it back
    db.close()


def test_the_row_cache_sees_flushed_counts(tmp_path: Path) -> None:
    path = tmp_path / "d.duckdb"
    database_with_memories(path, count=2).close()
    db = Database(path, rows=memory_repo.new_row_cache(100))
    assert memory_repo.read_many(db.reader(), db.rows, "t", ["m0"])["m0"].access_count == 0  # cached
    counts = AccessCounts(db)
    counts.record("t", ["m0"], 7)
    counts.flush()
    assert memory_repo.read_many(db.reader(), db.rows, "t", ["m0"])["m0"].access_count == 1
    db.close()


def test_counts_of_a_failed_flush_are_kept_for_the_next(tmp_path: Path) -> None:
    path = tmp_path / "d.duckdb"
    db = database_with_memories(path, count=2)
    counts = AccessCounts(db)
    counts.record("t", ["m0"], 10)
    db.close()
    with pytest.raises(FailedPrecondition):
        counts.flush()
    counts.record("t", ["m0", "m1"], 20)  # recorded while the failed counts were out
    assert counts.pending() == 2
    counts.db = Database(path)
    assert counts.flush() == 2
    assert _counts(counts.db) == {"m0": (2, 20), "m1": (1, 20)}
    counts.db.close()


def test_concurrent_records_are_all_counted(tmp_path: Path) -> None:
    db = database_with_memories(tmp_path / "d.duckdb", count=3)
    counts = AccessCounts(db)
    rounds = 300

    def inject(k: int) -> None:
        for n in range(rounds):
            counts.record("t", ["m0", f"m{1 + k % 2}"], n)

    def flush_meanwhile(stop: threading.Event) -> None:
        while not stop.is_set():
            counts.flush()

    stop = threading.Event()
    flusher = threading.Thread(target=flush_meanwhile, args=(stop,))
    flusher.start()
    workers = [threading.Thread(target=inject, args=(k,)) for k in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    flusher.join()
    counts.flush()
    last = rounds - 1
    assert _counts(db) == {"m0": (4 * rounds, last), "m1": (2 * rounds, last), "m2": (2 * rounds, last)}
    db.close()
