"""Statements by a set of ids (a purge's tombstones, index marks, access counts, reads by id)
give the same rows whichever way the ids reach DuckDB: a literal IN list up to a bound, an
Arrow relation past it (a real DuckDB file). A purge of a tenant's 77k memories held the
memories write lock 2.3 s with the list, ~20 ms with the relation."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnemo_server.memory.model import MemoryFilter
from mnemo_server.store import index_marks, memory_repo, session_repo
from mnemo_server.store.database import Database, fetch_one
from tests.unit.stored import database_with_memories

# Either side of memory_repo's bound between a literal list and a relation.
SIZES = [0, 1, 7, memory_repo._LITERAL_IDS_MAX, memory_repo._LITERAL_IDS_MAX + 1, 2_600]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Database:
    return database_with_memories(tmp_path_factory.mktemp("ids") / "m.duckdb", count=3_000)


@pytest.mark.parametrize("n", SIZES)
def test_each_size_reads_exactly_its_rows_and_leaves_no_relation_behind(db: Database, n: int) -> None:
    # n memories spread over the 3,000, an id that is not stored and one with a quote in it.
    ids = [f"m{i}" for i in range(0, 3_000, max(1, 3_000 // max(n, 1)))][:n]
    assert len(ids) == n
    asked = [*ids, "m-none", "it's"] if n else []
    with db.transaction() as cur:
        got = memory_repo.get_many(cur, "t", asked)
        assert sorted(got) == sorted(ids)
        assert all(got[i].id == i for i in ids)
        assert memory_repo.get_many(cur, "another tenant", asked) == {}
        views = fetch_one(cur, "SELECT count(*) FROM duckdb_views() WHERE view_name LIKE 'wanted_ids_%'")
        assert views == (0,)


@pytest.mark.parametrize("n", SIZES)
def test_tombstones_index_marks_and_access_counts_touch_exactly_their_rows(tmp_path: Path, n: int) -> None:
    total = 8_000
    db = database_with_memories(tmp_path / "m.duckdb", count=total)
    doomed = [f"m{i}" for i in range(n)]
    with db.transaction() as cur:
        cur.execute("UPDATE memories SET indexed_revision = revision, indexed_model = 'm'")
        memory_repo.tombstone(cur, "t", doomed, 99)
        session_repo.add_accesses(cur, [("t", f"m{i}", 2, 50) for i in range(n, 2 * n)])
        index_marks.forget_index_marks(cur, "t", [f"m{i}" for i in range(2 * n, 3 * n)])
    cur = db.reader()
    stored = cur.execute("SELECT id, delete_time_ns, access_count, indexed_revision FROM memories")
    rows = {r[0]: (r[1], r[2], r[3]) for r in stored.fetchall()}
    for i in range(total):
        deleted, accesses, indexed = rows[f"m{i}"]
        assert (deleted == 99) == (i < n), i
        assert accesses == (2 if n <= i < 2 * n else 0), i
        assert (indexed is None) == (2 * n <= i < 3 * n), (i, indexed)
    live = memory_repo.count_through(cur, "t", MemoryFilter(), include_deleted=False)[0]
    assert live == total - n
