"""Migration 7 rebuilds session_memories without its primary key: a store written by the
version before keeps every candidate row, and reads them as before."""

from __future__ import annotations

from pathlib import Path

import duckdb

from mnemo_server.store import session_repo
from mnemo_server.store.database import Database
from mnemo_server.store.schema import MIGRATIONS

_ROW = "(?, ?, ?, ?, ?, 'recall', 0.5, ?, 0.0, 0, 0.5, 12, '[1.0, 2.0]', ?, ?)"


def _store_at_version_6(path: Path) -> None:
    con = duckdb.connect(str(path))
    for ddl in MIGRATIONS[:6]:
        con.execute(ddl)
    con.execute("INSERT INTO store_meta VALUES ('schema_version', '6')")
    rows = [
        ("t", "s1", "m1", 0, 1, 1, 0.8, "feedback"),
        ("t", "s1", "m2", 1, 0, 2, None, ""),
        ("t", "s2", "m1", 0, 1, 1, None, ""),
        ("u", "s1", "m9", 0, 1, 1, -0.5, "transcript"),
    ]
    for r in rows:
        con.execute(f"INSERT INTO session_memories VALUES {_ROW}", list(r))
    con.close()


def test_candidate_rows_survive_the_rebuild_without_the_key(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    _store_at_version_6(path)
    db = Database(path)  # opening runs migration 7
    assert db.get_meta("schema_version") == str(len(MIGRATIONS))
    cur = db.reader()
    s1 = session_repo.session_memories(cur, "t", "s1")
    assert [(m.memory_id, m.candidate_ord, m.injected_rank, m.relevance, m.relevance_source) for m in s1] == [
        ("m1", 0, 1, 0.800000011920929, "feedback"),
        ("m2", 1, 0, None, ""),
    ]
    assert s1[0].features == [1.0, 2.0]
    assert [m.memory_id for m in session_repo.session_memories(cur, "u", "s1")] == ["m9"]
    assert [m.memory_id for m in session_repo.session_memories(cur, "t", "s2")] == ["m1"]
    kinds = cur.execute(
        "SELECT constraint_type FROM duckdb_constraints() WHERE table_name = 'session_memories'"
    ).fetchall()
    assert ("PRIMARY KEY",) not in kinds and kinds  # the NOT NULLs stay
    indexes = cur.execute(
        "SELECT index_name FROM duckdb_indexes() WHERE table_name = 'session_memories'"
    ).fetchall()
    assert indexes == [("session_memories_by_session",)]
    db.close()


def test_a_new_store_and_a_migrated_one_have_the_same_columns(tmp_path: Path) -> None:
    _store_at_version_6(tmp_path / "old.duckdb")
    migrated, fresh = Database(tmp_path / "old.duckdb"), Database(tmp_path / "new.duckdb")
    sql = (
        "SELECT column_name, data_type, is_nullable, column_default FROM information_schema.columns "
        "WHERE table_name = 'session_memories' ORDER BY ordinal_position"
    )
    assert migrated.reader().execute(sql).fetchall() == fresh.reader().execute(sql).fetchall()
    migrated.close()
    fresh.close()
