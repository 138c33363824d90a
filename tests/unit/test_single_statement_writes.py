"""Database.single_statement: one write statement under its domain's lock, committed by
DuckDB on its own (StartSession's record). It must be all or nothing like a transaction,
leave the writer's cursor usable after a failure, count as a use of its lock, refuse a second
statement, and refuse repositories that change memory rows (only `transaction` keeps the row
cache in step)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnemo_server.store import memory_repo, session_repo
from mnemo_server.store.database import Database, WriteDomain
from tests.unit.stored import packed_candidates, session_row, stored_memory


def _sessions(db: Database) -> list[str]:
    return [r[0] for r in db.reader().execute("SELECT id FROM sessions ORDER BY id").fetchall()]


def test_a_single_statement_commits_by_itself_and_counts_as_its_locks_use(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    before = db.write_lock_stats[WriteDomain.SESSION_STARTS].transactions
    with db.single_statement(WriteDomain.SESSION_STARTS) as cur:
        session_repo.insert_sessions(cur, [(session_row(s), packed_candidates(s, 3)) for s in ("a", "b")])
    assert _sessions(db) == ["a", "b"]
    stats = db.write_lock_stats
    assert stats[WriteDomain.SESSION_STARTS].transactions == before + 1
    assert stats[WriteDomain.SESSIONS].transactions == 0  # no other domain's lock taken
    db.checkpoint()  # no transaction left open behind it
    db.close()


def test_a_failed_statement_writes_nothing_and_the_cursor_writes_on(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    with db.single_statement(WriteDomain.SESSION_STARTS) as cur:
        session_repo.insert_sessions(cur, [(session_row("a"), packed_candidates("a", 2))])
    # A group whose second session's id is taken: neither is written.
    with pytest.raises(session_repo.SessionTaken), db.single_statement(WriteDomain.SESSION_STARTS) as cur:
        session_repo.insert_sessions(cur, [(session_row(s), packed_candidates(s, 2)) for s in ("b", "a")])
    assert _sessions(db) == ["a"]
    with db.single_statement(WriteDomain.SESSION_STARTS) as cur:
        session_repo.insert_sessions(cur, [(session_row("c"), packed_candidates("c", 2))])
    assert _sessions(db) == ["a", "c"]
    db.checkpoint()
    db.close()


def test_memory_rows_are_not_written_outside_a_transaction(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    with (
        pytest.raises(RuntimeError, match=r"outside Database\.transaction"),
        db.single_statement(WriteDomain.MEMORIES) as cur,
    ):
        memory_repo.insert_many(cur, [(stored_memory(0, 0), "memory 0")], db.stored)
    db.close()


def test_a_second_statement_is_refused_and_the_first_stands(tmp_path: Path) -> None:
    """Each statement outside a transaction commits by itself, so a second one would not be
    all or nothing with the first: it is refused before it runs."""
    db = Database(tmp_path / "d.duckdb")
    with db.single_statement(WriteDomain.SESSION_STARTS) as cur:
        session_repo.insert_sessions(cur, [(session_row("a"), packed_candidates("a", 2))])
        with pytest.raises(RuntimeError, match="second statement"):
            session_repo.insert_sessions(cur, [(session_row("b"), packed_candidates("b", 2))])
    assert _sessions(db) == ["a"]
    db.close()
