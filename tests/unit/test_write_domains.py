"""Write transactions are serialised per domain, not store-wide.

The memories' writes and the sessions' writes touch different rows, so one of each runs at
a time and DuckDB commits them side by side; a write that names no domain holds every lock.
Should two domains still meet on one row or key, DuckDB refuses the second commit and the
caller gets WriteConflict (gRPC ABORTED) with nothing of it written, never INTERNAL."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mnemo_server.store.database import Cursor, Database, WriteConflict, WriteDomain
from tests.unit.stored import database_with_memories

MEMORIES, SESSIONS = WriteDomain.MEMORIES, WriteDomain.SESSIONS


@pytest.fixture
def db(tmp_path: Path) -> Database:
    return database_with_memories(tmp_path / "d.duckdb")


def _bump(cur: Cursor, memory_id: str = "m1") -> None:
    cur.execute("UPDATE memories SET access_count = access_count + 1 WHERE id = ?", [memory_id])


def _count(db: Database, memory_id: str = "m1") -> int:
    rows = db.reader().execute("SELECT access_count FROM memories WHERE id = ?", [memory_id]).fetchall()
    return int(rows[0][0])


class Holder:
    """A transaction of some domains held open on another thread until released."""

    def __init__(self, db: Database, *domains: WriteDomain, body: Callable[[Cursor], None] = _bump):
        self.inside, self.release = threading.Event(), threading.Event()
        self.error: BaseException | None = None

        def run() -> None:
            try:
                with db.transaction(*domains) as cur:
                    body(cur)
                    self.inside.set()
                    self.release.wait(5)
            except BaseException as exc:  # handed to the test
                self.error = exc

        self.thread = threading.Thread(target=run)
        self.thread.start()
        assert self.inside.wait(5)

    def finish(self) -> BaseException | None:
        self.release.set()
        self.thread.join(5)
        return self.error


def _timed(fn: Callable[[], None]) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()
    thread = threading.Thread(target=lambda: (fn(), done.set()))
    thread.start()
    return thread, done


def test_a_sessions_write_does_not_wait_for_a_memories_write(db: Database) -> None:
    holder = Holder(db, MEMORIES)

    def sessions_write() -> None:
        with db.transaction(SESSIONS) as cur:
            cur.execute("INSERT INTO store_meta VALUES ('k', 'v')")

    thread, done = _timed(sessions_write)
    assert done.wait(5), "the sessions domain's write queued behind the memories domain's"
    thread.join()
    assert holder.finish() is None
    assert db.get_meta("k") == "v" and _count(db) == 1


@pytest.mark.parametrize("held", [MEMORIES, SESSIONS])
def test_a_write_naming_no_domain_waits_for_every_domain(db: Database, held: WriteDomain) -> None:
    holder = Holder(db, held)

    def store_wide() -> None:
        with db.transaction() as cur:
            _bump(cur, "m2")

    thread, done = _timed(store_wide)
    assert not done.wait(0.3), f"a store-wide write ran while the {held.value} lock was held"
    assert holder.finish() is None
    assert done.wait(5)
    thread.join()
    assert _count(db, "m2") == 1


def test_writes_of_one_domain_run_one_at_a_time(db: Database) -> None:
    holder = Holder(db, MEMORIES)

    def memories_write() -> None:
        with db.transaction(MEMORIES) as cur:
            _bump(cur)

    thread, done = _timed(memories_write)
    assert not done.wait(0.3)
    assert holder.finish() is None
    assert done.wait(5)
    thread.join()
    assert _count(db) == 2  # both increments, neither lost nor refused


def test_one_key_written_by_two_domains_is_a_conflict_and_nothing_of_the_loser_is_written(
    db: Database,
) -> None:
    """Two requests with one request_id for different operations: the first commit wins,
    the second is refused whole (its other writes included)."""

    def claim_and_bump(cur: Cursor) -> None:
        cur.execute("INSERT INTO store_meta VALUES ('request-1', 'sessions')")
        _bump(cur, "m2")

    loser = Holder(db, SESSIONS, body=claim_and_bump)
    with db.transaction(MEMORIES) as cur:
        cur.execute("INSERT INTO store_meta VALUES ('request-1', 'memories')")
    error = loser.finish()
    assert isinstance(error, WriteConflict) and error.reason == "WRITE_CONFLICT", error
    assert db.get_meta("request-1") == "memories" and _count(db, "m2") == 0
    with db.transaction(SESSIONS) as cur:  # the cursor is usable again
        _bump(cur, "m2")
    assert _count(db, "m2") == 1


def test_one_row_updated_by_two_domains_is_a_conflict(db: Database) -> None:
    holder = Holder(db, MEMORIES)
    with pytest.raises(WriteConflict), db.transaction(SESSIONS) as cur:
        _bump(cur)
    assert holder.finish() is None
    assert _count(db) == 1


def test_each_domain_counts_its_transactions_held_time_and_waits(db: Database) -> None:
    """GetStatus and the bench report these per domain: held time, and time writers queued."""
    before = db.write_lock_stats
    with pytest.raises(RuntimeError), db.transaction(SESSIONS):
        raise RuntimeError("rolled back: still a transaction that held the lock")
    holder = Holder(db, MEMORIES)

    asking = threading.Event()

    def queued_write() -> None:
        asking.set()
        with db.transaction(MEMORIES) as cur:
            _bump(cur)

    thread, done = _timed(queued_write)
    # Released 0.2 s after the writer asked for the lock (not after the thread was
    # started: on a loaded machine starting it can take a while).
    assert asking.wait(5)
    time.sleep(0.2)
    assert holder.finish() is None
    assert done.wait(5)
    thread.join()
    after = db.write_lock_stats
    memories = (after[MEMORIES].transactions - before[MEMORIES].transactions, after[MEMORIES].waited_s)
    assert memories[0] == 2 and memories[1] - before[MEMORIES].waited_s >= 0.1
    assert after[MEMORIES].held_s - before[MEMORIES].held_s >= 0.2
    assert after[SESSIONS].transactions - before[SESSIONS].transactions == 1
    assert after[SESSIONS].waited_s - before[SESSIONS].waited_s < 0.1
