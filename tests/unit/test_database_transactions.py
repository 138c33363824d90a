"""No read leaves a DuckDB transaction open behind it.

A result that is not read to the end keeps its transaction open until the cursor's next
query; the per-thread reader cursors of idle threads then pin old row versions and the WAL
for good, and every update gets slower (the bench slid from 0.3 to 2 s per StartSession).
DuckDB refuses a CHECKPOINT while another transaction is open, which is what these tests
use to see a leak."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from mnemo_server.memory.model import MemoryFilter, MemoryType, Scope
from mnemo_server.store import memory_repo, session_repo, tenant_repo
from mnemo_server.store.database import Cursor, Database
from tests.unit.stored import stored_memory

SERVICES = Path(__file__).resolve().parents[2] / "services"


def _read_on_idle_thread(db: Database, read: Callable[[Cursor], object]) -> None:
    """Run a read on another thread's reader cursor; the thread then ends, its cursor stays."""
    worker = threading.Thread(target=lambda: read(db.reader()))
    worker.start()
    worker.join()


def _write(db: Database) -> None:
    with db.transaction() as cur:
        cur.execute("UPDATE memories SET access_count = access_count + 1 WHERE id = 'm1'")


def _write_then_checkpoint(db: Database) -> None:
    _write(db)
    db.checkpoint()


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database(tmp_path / "d.duckdb")
    with database.transaction() as cur:
        memory_repo.insert_many(cur, [(stored_memory(i, i), f"memory {i}") for i in range(3)])
    return database


def test_an_unread_result_blocks_the_checkpoint(db: Database) -> None:
    """The detector works: a raw fetchone() on an idle cursor makes CHECKPOINT fail."""
    _read_on_idle_thread(db, lambda cur: cur.execute("SELECT id FROM memories").fetchone())
    with pytest.raises(duckdb.TransactionException):
        _write_then_checkpoint(db)
    db.close()


@pytest.mark.parametrize(
    "read",
    [
        lambda cur: memory_repo.get(cur, "t", "m1"),
        lambda cur: memory_repo.get(cur, "t", "absent"),
        lambda cur: memory_repo.get_by_external_id(cur, "t", "x"),
        lambda cur: memory_repo.count(cur, "t", MemoryFilter(), include_deleted=False),
        lambda cur: memory_repo.count_live_in(cur, "t", Scope.workspace(), MemoryType.SEMANTIC),
        lambda cur: memory_repo.tenant_stats(cur, "t", "m"),
        lambda cur: session_repo.get_session(cur, "t", "s"),
        session_repo.pending_count,
        lambda cur: tenant_repo.get_tenant(cur, "t"),
    ],
    ids=[
        "get",
        "get_missing",
        "get_by_external_id",
        "count",
        "count_live_in",
        "tenant_stats",
        "get_session",
        "pending_count",
        "get_tenant",
    ],
)
def test_single_row_reads_close_their_transaction(db: Database, read: Callable[[Cursor], object]) -> None:
    _read_on_idle_thread(db, read)
    _write_then_checkpoint(db)  # raises if the read left its transaction open
    _read_on_idle_thread(db, lambda cur: db.get_meta("schema_version"))
    _write_then_checkpoint(db)
    db.close()


def test_no_fetchone_in_the_server() -> None:
    """fetchone() leaves the result unread even for one row; store code uses fetch_one()."""
    offenders = [
        f"{p.relative_to(SERVICES)}:{n}"
        for p in SERVICES.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), start=1)
        if ".fetchone(" in line
    ]
    assert offenders == []


def test_the_write_lock_counts_its_transactions_and_the_waits_for_it(db: Database) -> None:
    """GetStatus and the bench report these: held time, and time writers queued for the lock."""
    before = db.write_lock_stats
    with pytest.raises(RuntimeError), db.transaction():
        raise RuntimeError("rolled back: still a transaction that held the lock")
    holding, queued = threading.Event(), threading.Event()

    def hold() -> None:
        with db.transaction():
            holding.set()
            queued.wait(5)
            time.sleep(0.2)  # the other writer is queued by now

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(5)
    waiter = threading.Thread(target=lambda: (queued.set(), _write(db)))
    waiter.start()
    holder.join()
    waiter.join()
    after = db.write_lock_stats
    assert after.transactions - before.transactions == 3
    assert after.held_s - before.held_s >= 0.2
    assert after.waited_s - before.waited_s >= 0.1
