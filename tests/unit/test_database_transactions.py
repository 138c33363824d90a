"""No read leaves a DuckDB transaction open behind it.

A result that is not read to the end keeps its transaction open until the cursor's next
query; the per-thread reader cursors of idle threads then pin old row versions and the WAL
for good, and every update gets slower (the bench slid from 0.3 to 2 s per StartSession).
DuckDB refuses a CHECKPOINT while another transaction is open, which is what these tests
use to see a leak."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from mnemo_server.memory.model import MemoryFilter, MemoryType, Scope
from mnemo_server.store import memory_repo, session_repo, tenant_repo
from mnemo_server.store.database import Cursor, Database
from tests.unit.stored import database_with_memories

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
    return database_with_memories(tmp_path / "d.duckdb")


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
        lambda cur: memory_repo.count_through(cur, "t", MemoryFilter(), include_deleted=False)[0],
        lambda cur: memory_repo.count_live_in(cur, "t", Scope.workspace(), MemoryType.SEMANTIC),
        lambda cur: memory_repo.tenant_stats(cur, "t", "m"),
        lambda cur: session_repo.get_session_and_memories(cur, "t", "s"),
        session_repo.pending_count,
        lambda cur: tenant_repo.get_tenant(cur, "t"),
        lambda cur: memory_repo.has_history(cur, "t", "m1"),
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
        "has_history",
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


def test_a_fatal_error_marks_the_store_failed_and_other_errors_do_not(db: Database) -> None:
    """DuckDB invalidates a database after a fatal error (a checkpoint inside a COMMIT failed
    once under load); every statement fails from then on, so `mnemo serve` exits on it."""
    with pytest.raises(duckdb.ConstraintException), db.transaction() as cur:
        cur.execute("INSERT INTO tenants (id) VALUES (NULL)")
    assert not db.failed.is_set() and db.failure is None
    fatal = duckdb.FatalException("FATAL Error: Failed: database has been invalidated")
    with pytest.raises(duckdb.FatalException), db.transaction():
        raise fatal
    assert db.failed.is_set() and db.failure is fatal


@pytest.mark.parametrize(
    ("limit", "problem"),
    [
        ("-5MB", "is not a size like '512MB'"),
        ("lots", "is not a size like '512MB'"),
        ("1KB", "is too small for the store"),
        ("0MB", "is too small for the store"),
        ("16000KiB", "is too small for the store"),
    ],
)
def test_a_duckdb_memory_limit_that_cannot_serve_is_one_config_error(
    tmp_path: Path, limit: str, problem: str
) -> None:
    """ "1KB" or "0MB" passed the size check, then DuckDB's OutOfMemory escaped as a traceback."""
    from mnemo_server.errors import FailedPrecondition

    with pytest.raises(FailedPrecondition, match=f"storage.duckdb_memory_limit '{limit}' {problem}") as err:
        Database(tmp_path / "m.duckdb", memory_limit=limit)
    assert err.value.reason == "BAD_CONFIG"
    db = Database(tmp_path / "m.duckdb", memory_limit="16MiB")  # the file was left usable
    assert db.reader().execute("SELECT current_setting('memory_limit')").fetchall()[0][0] == "16.0 MiB"
    db.close()


def test_a_store_file_cut_short_past_its_header_is_one_clear_error(tmp_path: Path) -> None:
    """A partial copy opens, then fails its first reads: serve, reindex and reembed ended in
    DuckDB's traceback (maintenance probe) instead of the error a file cut shorter gets."""
    from mnemo_server.errors import FailedPrecondition

    path = tmp_path / "d.duckdb"
    database = database_with_memories(path, count=20_000)
    database.checkpoint()
    database.close()
    with path.open("r+b") as fh:
        fh.truncate(path.stat().st_size // 3)
    with pytest.raises(FailedPrecondition, match=r"d\.duckdb cannot be") as err:
        Database(path)
    assert err.value.reason == "BAD_DATA_DIR"
