"""Migrations of a store written by an earlier version: 7 rebuilt session_memories without
its primary key, 8 packs each session's candidate rows into its own row (with the relevance
its end gave them) and drops the table, 9 indexes memory_history by memory id. A store from
before them reads every candidate and history entry as before, and ends up with the same
schema as a new store."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from mnemo_server.store import memory_repo, session_repo
from mnemo_server.store.database import Cursor, Database
from mnemo_server.store.schema import MIGRATIONS
from mnemo_server.store.session_candidates import SessionMemoryRow

_ROW = "(?, ?, ?, ?, ?, 'recall', 0.5, ?, 0.0, 0, 0.5, 12, ?, ?, ?)"
_SESSION = (
    "INSERT INTO sessions (tenant_id, id, agent_id, persona_id, project_id, context, state, "
    "request_fingerprint, ranking_path, fallback_reason, model_version, predictor_weight, sidecar_ms, "
    "sidecar_deadline_ms, took_ms, token_budget, tokens_used, dropped_count, feature_names, "
    "start_time_ns) VALUES (?, ?, '', '', '', 'ctx', ?, '', 'baseline', '', '', 0, 0, 0, 0, 0, 0, 0, "
    '\'["a", "b"]\', 1)'
)


def _store_at_version_6(path: Path) -> None:
    con = duckdb.connect(str(path))
    for ddl in MIGRATIONS[:6]:
        assert isinstance(ddl, str)
        con.execute(ddl)
    con.execute("INSERT INTO store_meta VALUES ('schema_version', '6')")
    for tenant, sid, state in (
        ("t", "s1", "ended"),
        ("t", "s2", "active"),
        ("u", "s1", "ended"),
        ("t", "s3", "active"),
    ):
        con.execute(_SESSION, [tenant, sid, state])
    rows = [
        ("t", "s1", "m2", 1, 0, 2, "[3.0, NaN]", None, ""),
        ("t", "s1", "m1", 0, 1, 1, "[1.0, 2.0]", 0.8, "feedback"),
        ("t", "s2", "m1", 0, 1, 1, "[1.0, 2.0]", None, ""),
        ("u", "s1", "m9", 0, 1, 1, "[0.5, 0.25]", -0.5, "transcript"),
    ]
    for r in rows:
        con.execute(f"INSERT INTO session_memories VALUES {_ROW}", list(r))
    # Entries of one memory at one instant come back ordered by their content.
    for memory_id, action, time_ns in (
        ("m1", "updated", 3),
        ("m2", "created", 1),
        ("m1", "created", 1),
        ("m1", "deleted", 3),
    ):
        con.execute(
            "INSERT INTO memory_history VALUES ('t', ?, ?, 'alice', '', '{}', ?)",
            [memory_id, action, time_ns],
        )
    con.close()


def _members(cur: Cursor, tenant_id: str, session_id: str) -> list[SessionMemoryRow]:
    found = session_repo.get_session_and_memories(cur, tenant_id, session_id)
    assert found is not None, f"session {session_id} of {tenant_id} is gone"
    return found[1]


def test_candidate_rows_survive_both_migrations_in_order_with_their_relevance(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    _store_at_version_6(path)
    db = Database(path)  # opening runs migrations 7 and 8
    assert db.get_meta("schema_version") == str(len(MIGRATIONS))
    cur = db.reader()
    s1 = _members(cur, "t", "s1")
    assert [(m.memory_id, m.candidate_ord, m.injected_rank, m.relevance, m.relevance_source) for m in s1] == [
        ("m1", 0, 1, pytest.approx(0.8), "feedback"),
        ("m2", 1, 0, None, ""),
    ]
    assert (
        s1[0].features == [1.0, 2.0] and s1[1].features[0] == 3.0 and s1[1].features[1] != s1[1].features[1]
    )
    (m9,) = _members(cur, "u", "s1")
    assert (m9.memory_id, m9.relevance, m9.relevance_source, m9.features) == (
        "m9",
        -0.5,
        "transcript",
        [0.5, 0.25],
    )
    assert [m.memory_id for m in _members(cur, "t", "s2")] == ["m1"]
    assert _members(cur, "t", "s3") == []  # a session without candidates
    tables = {r[0] for r in cur.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert "session_memories" not in tables
    db.close()


def test_a_new_store_and_a_migrated_one_have_the_same_schema(tmp_path: Path) -> None:
    _store_at_version_6(tmp_path / "old.duckdb")
    migrated, fresh = Database(tmp_path / "old.duckdb"), Database(tmp_path / "new.duckdb")
    columns = (
        "SELECT table_name, column_name, data_type, is_nullable, column_default "
        "FROM information_schema.columns ORDER BY table_name, ordinal_position"
    )
    indexes = "SELECT table_name, index_name, sql FROM duckdb_indexes() ORDER BY index_name"
    for sql in (columns, indexes):
        assert migrated.reader().execute(sql).fetchall() == fresh.reader().execute(sql).fetchall()
    migrated.close()
    fresh.close()


def test_history_is_read_through_the_memory_id_index_after_the_migration(tmp_path: Path) -> None:
    _store_at_version_6(tmp_path / "old.duckdb")
    db = Database(tmp_path / "old.duckdb")
    cur = db.reader()
    indexed = cur.execute(
        "SELECT expressions FROM duckdb_indexes() WHERE table_name = 'memory_history'"
    ).fetchall()
    assert indexed == [("[memory_id]",)]
    entries = memory_repo.history(cur, "t", "m1")
    assert [(e.action, e.time_ns) for e in entries] == [("created", 1), ("deleted", 3), ("updated", 3)]
    # A page past the first entry at instant 3, as a page token names it.
    later = memory_repo.history(cur, "t", "m1", from_ns=3, skip=1, limit=5)
    assert [(e.action, e.time_ns) for e in later] == [("updated", 3)]
    assert memory_repo.has_history(cur, "t", "m2") and not memory_repo.has_history(cur, "u", "m2")
    db.close()


def test_a_failing_migration_leaves_the_store_at_its_version(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    _store_at_version_6(path)
    con = duckdb.connect(str(path))
    con.execute("UPDATE session_memories SET features = 'not json' WHERE memory_id = 'm9'")
    con.close()
    with pytest.raises(ValueError):
        Database(path)
    con = duckdb.connect(str(path))
    assert con.execute("SELECT value FROM store_meta WHERE key = 'schema_version'").fetchall() == [("7",)]
    assert con.execute("SELECT count(*) FROM session_memories").fetchall() == [(4,)]
    con.close()
