"""The row cache never serves a memory row older than the last acknowledged write to it.

Every repository write that changes `memories` rows is run against a real DuckDB file with
the cache warm, and the cached read must then equal DuckDB's own; fills that race a write
must not put the old row back; a writer and readers on threads check the guarantee a
client relies on (a read started after a write returned sees that write)."""

from __future__ import annotations

import sys
import threading
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from mnemo_server.memory.model import Memory, MemoryFilter, MemoryType, Scope, ScopeKind, Source
from mnemo_server.store import index_marks, memory_repo, row_cache, session_repo, write_changes
from mnemo_server.store.database import Cursor, Database, WriteDomain
from mnemo_server.store.row_cache import Row, RowCache, RowChange, RowPatch
from mnemo_server.store.stored_summary import StoredSummary
from tests.unit.stored import stored_memory

COUNT = 8


def _db(path: Path, rows: int = 1000) -> Database:
    db = Database(path, rows=memory_repo.new_row_cache(rows))
    with db.transaction() as cur:
        memory_repo.insert_many(cur, [(stored_memory(i, i), f"memory {i}") for i in range(COUNT)], db.stored)
    return db


def _ids() -> list[str]:
    return [f"m{i}" for i in range(COUNT)]


def _cached(db: Database) -> dict[str, Memory]:
    return memory_repo.read_many(db.reader(), db.rows, "t", _ids())


def _truth(db: Database) -> dict[str, Memory]:
    return memory_repo.get_many(db.reader(), "t", _ids())


WRITES: dict[str, Callable[[Cursor], None]] = {
    "tombstone": lambda cur: memory_repo.tombstone(cur, "t", ["m1", "m2"], 99),
    "update_columns": lambda cur: memory_repo.update_columns(
        cur, StoredSummary(), "t", "m3", {"content": "changed", "importance": 0.9, "pinned": True}, 99
    ),
    "mark_indexed": lambda cur: index_marks.mark_indexed(cur, [("t", "m4", 1), ("t", "m5", 1)], "m"),
    "add_accesses": lambda cur: session_repo.add_accesses(cur, [("t", "m0", 2, 99), ("t", "m6", 1, 99)]),
    "delete_rows": lambda cur: memory_repo.delete_rows(cur, "t", ["m7"]),
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_write_through_the_repositories_is_never_hidden_by_the_cache(tmp_path: Path, name: str) -> None:
    db = _db(tmp_path / "d.duckdb")
    before = _cached(db)
    assert before == _truth(db) and db.rows.stats().rows == COUNT  # warm
    with db.transaction() as cur:
        WRITES[name](cur)
    after = _truth(db)
    assert after != before  # the write changed something visible
    assert _cached(db) == after
    db.close()


@pytest.mark.parametrize("name", ["mark_indexed", "add_accesses"])
def test_rows_a_write_patches_stay_cached_and_equal_duckdb(tmp_path: Path, name: str) -> None:
    db = _db(tmp_path / "d.duckdb")
    _cached(db)  # warm
    with db.transaction(WriteDomain.MEMORIES) as cur:
        WRITES[name](cur)
    misses = db.rows.stats().misses
    assert _cached(db) == _truth(db)
    assert db.rows.stats().misses == misses  # every row answered from the cache, patched
    db.close()


def test_an_index_mark_of_a_changed_or_deleted_row_patches_it_as_duckdb_does(tmp_path: Path) -> None:
    db = _db(tmp_path / "d.duckdb")
    with db.transaction() as cur:
        memory_repo.tombstone(cur, "t", ["m1"], 5)
        memory_repo.update_columns(cur, db.stored, "t", "m2", {"content": "new"}, 5)  # revision 2
    _cached(db)
    with db.transaction(WriteDomain.MEMORIES) as cur:
        index_marks.mark_indexed(cur, [("t", "m1", 1), ("t", "m2", 1), ("t", "m3", 1)], "m2-model")
    misses = db.rows.stats().misses
    cached = _cached(db)
    assert cached == _truth(db) and db.rows.stats().misses == misses
    assert [cached[i].indexed for i in ("m1", "m2", "m3")] == [False, False, True]
    assert cached["m3"].embedding_model == "m2-model" and cached["m2"].embedding_model == "m"
    db.close()


def test_a_rolled_back_or_refused_patch_leaves_the_cached_rows_as_they_were(tmp_path: Path) -> None:
    db = _db(tmp_path / "d.duckdb")
    before = _cached(db)
    misses = db.rows.stats().misses

    def accesses_then(domain: WriteDomain, fail: bool) -> None:
        with db.transaction(domain) as cur:
            session_repo.add_accesses(cur, [("t", "m0", 3, 9)])
            if fail:
                raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        accesses_then(WriteDomain.MEMORIES, fail=True)
    # Patches and drops of a row are applied in commit order only under the memories lock.
    with pytest.raises(RuntimeError, match="outside the memories write lock"):
        accesses_then(WriteDomain.SESSIONS, fail=False)
    assert _truth(db) == before and _cached(db) == before
    assert db.rows.stats().misses == misses  # the rows stayed cached
    accesses_then(WriteDomain.MEMORIES, fail=False)
    assert _cached(db)["m0"].access_count == 3 == _truth(db)["m0"].access_count
    db.close()


def _plus_one(row: Row) -> Row:
    return (*row[:2], row[2] + 1)


def test_a_fill_between_a_patch_s_commit_and_its_application_is_skipped() -> None:
    cache = RowCache(100, id_column=1)
    cache.fill("t", [_row("m1", 0)], cache.generation())
    change = RowPatch("t", frozenset({"m1", "m2"}), _plus_one)
    cache.announce([change])  # the writer is about to commit
    since = cache.generation()  # a reader starts after the commit: it reads the new rows ...
    cache.fill("t", [_row("m1", 1), _row("m2", 1)], since)  # ... and fills before the patch
    assert cache.lookup("t", ["m1"])[0] == [_row("m1", 0)]  # the row before the commit, unpatched
    cache.apply([change], committed=True, announced=True)
    assert cache.lookup("t", ["m1", "m2"]) == ([_row("m1", 1)], ["m2"])  # patched once, m2 not filled
    cache.fill("t", [_row("m2", 0)], since)  # a read from before the patch, filled after it
    assert cache.lookup("t", ["m2"]) == ([], ["m2"])
    cache.fill("t", [_row("m2", 1)], cache.generation())
    assert cache.lookup("t", ["m2"]) == ([_row("m2", 1)], [])
    assert cache.stats().fills_skipped == 3


def test_a_patch_whose_commit_failed_leaves_rows_and_lets_later_fills_in() -> None:
    cache = RowCache(100, id_column=1)
    cache.fill("t", [_row("m1", 0)], cache.generation())
    change = RowPatch("t", frozenset({"m1", "m2"}), _plus_one)
    cache.announce([change])
    cache.apply([change], committed=False, announced=True)
    cache.fill("t", [_row("m2", 0)], cache.generation())
    assert cache.lookup("t", ["m1", "m2"]) == ([_row("m1", 0), _row("m2", 0)], [])
    # A rule that fails on a row drops the row (it is read again) rather than the write.
    broken = RowPatch("t", frozenset({"m1"}), lambda row: row[5:6])
    cache.announce([broken])
    cache.apply([broken], committed=True, announced=True)
    assert cache.lookup("t", ["m1", "m2"]) == ([_row("m2", 0)], ["m1"])


def test_readers_racing_access_counts_never_see_one_twice_or_lost(tmp_path: Path) -> None:
    """A patch applied to a row already read after its commit would count the access twice.
    The window is narrow (this catches such a bug now and then); the interleaving itself is
    pinned by the test of a fill between a patch's commit and its application."""
    db = _db(tmp_path / "d.duckdb", rows=4)  # small: evictions and refills all the time
    started, acknowledged = [0], [0]
    stop = threading.Event()
    errors: list[str] = []

    def write() -> None:
        for n in range(1, 300):
            started[0] = n
            with db.transaction(WriteDomain.MEMORIES) as cur:
                session_repo.add_accesses(cur, [("t", "m0", 1, n), ("t", f"m{1 + n % 7}", 1, n)])
            acknowledged[0] = n
        stop.set()

    def read() -> None:
        while not stop.is_set():
            floor = acknowledged[0]
            seen = memory_repo.read_many(db.reader(), db.rows, "t", _ids())["m0"].access_count
            ceiling = started[0]
            if not floor <= seen <= ceiling:
                errors.append(f"m0 counted {seen} between writes {floor} and {ceiling}")

    readers = [threading.Thread(target=read) for _ in range(3)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads interleave often enough to meet the narrow window
    try:
        for t in readers:
            t.start()
        write()
        for t in readers:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    assert not errors, errors[:3]
    assert _cached(db) == _truth(db) and _truth(db)["m0"].access_count == 299
    assert db.rows.stats().hits > 0
    db.close()


def test_rows_created_a_few_at_a_time_are_cached_as_duckdb_stored_them(tmp_path: Path) -> None:
    db = _db(tmp_path / "d.duckdb")
    # Values a float32 column cannot hold exactly, text beyond ASCII, every optional column.
    new = [
        (replace(stored_memory(8, 8), metadata={"k": [8]}, pinned=True), "memory 8"),
        (
            replace(
                stored_memory(9, 9),
                content="Zoë: 東京 — ok?",
                metadata={"città": "Roma", "n": 1.5, "none": None},
                importance=0.3,
                confidence=0.1,
                external_id="ext-9",
                scope=Scope(ScopeKind.PROJECT, "p-1"),
                type=MemoryType.EPISODIC,
                source=Source("agent", "because", "run-1", "session-1"),
                supersedes_id="m8",
            ),
            "zoë: 東京 — ok?",
        ),
    ]
    with db.transaction(WriteDomain.MEMORIES) as cur:
        memory_repo.insert_many(cur, new, db.stored)
    found, missing = db.rows.lookup("t", ["m8", "m9"])
    assert missing == [] and found == memory_repo._rows_by_id(db.reader(), "t", ["m8", "m9"])
    read = memory_repo._rows_by_id(db.reader(), "t", ["m8", "m9"])
    for cached, stored in zip(sorted(found), sorted(read), strict=True):
        assert [type(v) for v in cached] == [type(v) for v in stored]
    # Changed in the transaction that inserts it: cached as it ends up, or not at all.
    with db.transaction(WriteDomain.MEMORIES) as cur:
        memory_repo.insert_many(cur, [(stored_memory(10, 10), "memory 10")], db.stored)
        memory_repo.update_columns(cur, db.stored, "t", "m10", {"importance": 0.9}, 11)
        index_marks.mark_indexed(cur, [("t", "m10", 2)], "m")
    assert memory_repo.read_many(db.reader(), db.rows, "t", ["m10"]) == memory_repo.get_many(
        db.reader(), "t", ["m10"]
    )
    db.close()


def test_bulk_inserts_are_cached_only_into_room_and_rolled_back_ones_never(tmp_path: Path) -> None:
    size = memory_repo.CACHED_AT_INSERT + 1  # past what is cached whatever the room

    def bulk(first: int) -> list[tuple[Memory, str]]:
        return [(stored_memory(i, i), f"memory {i}") for i in range(first, first + size)]

    # Room for one bulk insert beside the rows _db wrote: it goes in, as DuckDB stores it.
    db = _db(tmp_path / "d.duckdb", rows=COUNT + size)
    first = bulk(100)
    with db.transaction(WriteDomain.MEMORIES) as cur:
        memory_repo.insert_many(cur, first, db.stored)
    ids = [m.id for m, _ in first]
    found, missing = db.rows.lookup("t", ids)
    assert missing == [] and sorted(found) == sorted(memory_repo._rows_by_id(db.reader(), "t", ids))
    # No room for the next: it would evict the rows read so far, so it stays out.
    with db.transaction(WriteDomain.MEMORIES) as cur:
        memory_repo.insert_many(cur, bulk(200), db.stored)
    assert db.rows.stats().rows == COUNT + size
    assert db.rows.lookup("t", _ids() + ids)[1] == []

    def insert_then_fail() -> None:
        with db.transaction(WriteDomain.MEMORIES) as cur:
            memory_repo.insert_many(cur, [(stored_memory(99, 99), "memory 99")], db.stored)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        insert_then_fail()
    assert db.rows.stats().rows == COUNT + size
    # A read that does not fill (the index worker's) leaves it so.
    later = [m.id for m, _ in bulk(200)]
    assert len(memory_repo.read_many(db.reader(), db.rows, "t", later, fill=False)) == size
    assert db.rows.stats().rows == COUNT + size
    assert memory_repo.get_many(db.reader(), "t", ["m99"]) == {}
    db.close()


def test_index_mark_resets_and_purges_are_seen(tmp_path: Path) -> None:
    db = _db(tmp_path / "d.duckdb")
    with db.transaction() as cur:
        index_marks.mark_indexed(cur, [("t", i, 1) for i in _ids()], "m")
    assert all(m.indexed for m in _cached(db).values())
    with db.transaction() as cur:
        index_marks.reset_index_marks(cur, "t")
    assert not any(m.indexed for m in _cached(db).values())
    with db.transaction() as cur:
        index_marks.mark_indexed(cur, [("t", i, 1) for i in _ids()], "m")
    _cached(db)
    with db.transaction() as cur:
        index_marks.reset_index_marks(cur)
    assert not any(m.indexed for m in _cached(db).values())
    with db.transaction() as cur:
        index_marks.mark_indexed(cur, [("t", "m1", 1)], "m")
    _cached(db)
    with db.transaction() as cur:
        index_marks.forget_index_marks(cur, "t", ["m1"])
    assert not _cached(db)["m1"].indexed
    with db.transaction() as cur:
        memory_repo.tombstone(cur, "t", ["m2"], 5)
    _cached(db)
    with db.transaction() as cur:
        assert memory_repo.purge_tombstones(cur, 10, 10) == [("t", "m2")]
    assert "m2" not in _cached(db) and _cached(db) == _truth(db)
    db.close()


def test_a_rolled_back_write_leaves_the_cache_consistent(tmp_path: Path) -> None:
    db = _db(tmp_path / "d.duckdb")
    before = _cached(db)

    def change_then_fail() -> None:
        with db.transaction() as cur:
            memory_repo.update_columns(cur, db.stored, "t", "m3", {"content": "never"}, 99)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        change_then_fail()
    assert _cached(db) == before == _truth(db)
    db.close()


def test_listing_through_the_cache_matches_duckdb(tmp_path: Path) -> None:
    db = _db(tmp_path / "d.duckdb")
    cur = db.reader()
    pinned = MemoryFilter(scopes=(Scope.workspace(),), pinned_only=True)

    def both(f: MemoryFilter) -> tuple[list[Memory], list[Memory]]:
        cached, plain = (
            memory_repo.list_page(cur, "t", f, include_deleted=False, before_seq=None, limit=5, cache=c)
            for c in (db.rows, None)
        )
        return cached, plain

    cached, plain = both(MemoryFilter())
    assert [m.id for m in plain] == ["m7", "m6", "m5", "m4", "m3"] and cached == plain
    with db.transaction() as w:
        memory_repo.update_columns(w, db.stored, "t", "m2", {"pinned": True}, 9)
        memory_repo.tombstone(w, "t", ["m6"], 9)
    cached, plain = both(MemoryFilter())
    assert "m6" not in [m.id for m in plain] and cached == plain
    cached, plain = both(pinned)
    assert [m.id for m in plain] == ["m2"] and cached == plain
    db.close()


def test_changing_rows_outside_a_transaction_is_refused(tmp_path: Path) -> None:
    db = _db(tmp_path / "d.duckdb")
    with pytest.raises(RuntimeError, match=r"outside Database\.transaction"):
        memory_repo.tombstone(db.reader(), "t", ["m1"], 9)
    assert not _truth(db)["m1"].deleted  # refused before the statement ran
    db.close()


def _row(i: str, v: int = 0) -> tuple[object, ...]:
    return ("t", i, v)


def test_a_fill_that_raced_a_drop_does_not_bring_the_old_row_back() -> None:
    cache = RowCache(100, id_column=1)
    since = cache.generation()  # a reader starts, reads m1 and m2 from DuckDB ...
    cache.drop([RowChange("t", frozenset({"m1"}))])  # ... while a writer changes m1
    cache.fill("t", [_row("m1"), _row("m2")], since)
    found, missing = cache.lookup("t", ["m1", "m2"])
    assert found == [_row("m2")] and missing == ["m1"]
    # Another tenant's drop does not stop the fill; a whole-tenant drop does.
    since = cache.generation()
    cache.drop([RowChange("u", frozenset({"m3"}))])
    cache.fill("t", [_row("m3")], since)
    since = cache.generation()
    cache.drop([RowChange("t", None)])
    cache.fill("t", [_row("m4")], since)
    found, missing = cache.lookup("t", ["m3", "m4"])
    assert found == [] and missing == ["m3", "m4"]  # m3 dropped with the tenant, m4 not filled
    assert cache.stats().fills_skipped == 2


def test_fills_older_than_the_log_and_large_drops_are_skipped() -> None:
    cache = RowCache(100, id_column=1)
    since = cache.generation()
    for n in range(RowCache.LOG_LENGTH + 1):
        cache.drop([RowChange("t", frozenset({f"x{n}"}))])
    cache.fill("t", [_row("m1")], since)  # the log no longer reaches back: unknown, skipped
    since = cache.generation()
    cache.drop([RowChange("t", frozenset(f"y{n}" for n in range(RowCache.LOG_IDS + 1)))])
    cache.fill("t", [_row("m2")], since)  # a large drop counts as the whole tenant's
    assert cache.lookup("t", ["m1", "m2"]) == ([], ["m1", "m2"])


def test_the_cache_keeps_at_most_its_rows_and_none_when_off() -> None:
    cache = RowCache(50, id_column=1)
    for n in range(120):
        cache.fill("t", [_row(f"m{n}")], cache.generation())
    assert cache.stats().rows <= 50
    assert cache.lookup("t", ["m119"])[0] == [_row("m119")]  # the newest fills stay
    off = RowCache(0, id_column=1)
    off.fill("t", [_row("m1")], off.generation())
    assert off.lookup("t", ["m1"]) == ([], ["m1"])


def test_readers_racing_a_writer_never_see_a_row_older_than_an_acknowledged_write(tmp_path: Path) -> None:
    db = _db(tmp_path / "d.duckdb", rows=4)  # small: evictions and refills all the time
    acknowledged = [0]
    stop = threading.Event()
    errors: list[str] = []

    def write() -> None:
        for n in range(1, 200):
            with db.transaction() as cur:
                memory_repo.update_columns(cur, db.stored, "t", f"m{n % COUNT}", {"importance": n / 1000}, n)
                memory_repo.update_columns(cur, db.stored, "t", "m0", {"category": str(n)}, n)
            acknowledged[0] = n
        stop.set()

    def read() -> None:
        while not stop.is_set():
            floor = acknowledged[0]
            seen = memory_repo.read_many(db.reader(), db.rows, "t", _ids())
            if int(seen["m0"].category if seen["m0"].category != "general" else 0) < floor:
                errors.append(f"m0 at {seen['m0'].category} after write {floor} was acknowledged")

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    write()
    for t in readers:
        t.join()
    assert not errors, errors[:3]
    assert _cached(db) == _truth(db)
    assert db.rows.stats().hits > 0
    db.close()


def test_changes_are_collected_per_thread_and_transaction() -> None:
    write_changes.begin()
    row_cache.rows_changed("t", ["a"])
    row_cache.all_rows_changed()
    assert write_changes.end() == [RowChange("t", frozenset({"a"})), RowChange(None, None)]
    assert write_changes.end() == []
    with pytest.raises(RuntimeError):
        row_cache.rows_changed("t", ["a"])


def test_a_cached_row_decodes_to_a_fresh_object(tmp_path: Path) -> None:
    """Callers may change the Memory they get; the cache keeps DuckDB's immutable row."""
    db = _db(tmp_path / "d.duckdb")
    first = _cached(db)["m1"]
    first.content = "changed by a caller"
    again = _cached(db)["m1"]
    assert again.content == "memory 1" and again == replace(first, content="memory 1")
    db.close()


def _wide(n: int, tenant: str = "t") -> tuple[object, ...]:
    """A row shaped like a memory row: the id, repeated strings, text, numbers, None."""
    return (
        tenant,
        f"m{n}",
        "project",
        f"kind-{n % 3}",
        f"text {n} with ünïcode and {'x' * (n % 50)}",
        n * 1_000_000_000_007,
        0.25 + n,
        n % 2 == 0,
        None if n % 3 else n,
        "",
        "model-a",
    )


def test_packed_rows_come_back_as_they_went_in_whatever_the_combination() -> None:
    cache = RowCache(1000, id_column=1, shared_columns=frozenset({0, 2, 3, 10}))
    rows = [_wide(n) for n in range(300)]
    cache.fill("t", rows, cache.generation())
    found, missing = cache.lookup("t", [f"m{n}" for n in range(300)])
    assert missing == [] and found == rows
    assert [type(v) for v in found[7]] == [type(v) for v in rows[7]]


def test_past_the_numbered_combinations_rows_carry_their_shared_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(row_cache._Packing, "MAX_COMBINATIONS", 2)
    cache = RowCache(1000, id_column=1, shared_columns=frozenset({0, 3}))
    rows = [(*_wide(n)[:3], f"unique-{n}", *_wide(n)[4:]) for n in range(20)]
    cache.fill("t", rows, cache.generation())
    assert cache.lookup("t", [f"m{n}" for n in range(20)]) == (rows, [])


def test_a_row_marshal_cannot_write_is_not_cached() -> None:
    cache = RowCache(100, id_column=1)
    odd = ("t", "m1", object())
    cache.fill("t", [_row("m0"), odd], cache.generation())
    assert cache.lookup("t", ["m0", "m1"]) == ([_row("m0")], ["m1"])
    assert cache.stats().fills_skipped == 1


def test_a_large_row_is_read_from_duckdb_not_kept(tmp_path: Path) -> None:
    """The cache is bounded by rows: a tenant's memories of 20,000 characters took the
    server ~1.6 GB past its size for 4,000 of them (fairness probe). A row packed past
    MAX_PACKED_BYTES is not kept, and reads of it still answer from DuckDB."""
    db = Database(tmp_path / "d.duckdb", rows=memory_repo.new_row_cache(1000))
    big = replace(stored_memory(0, 0), id="big", content="界" * 20_000, content_hash="hbig")
    with db.transaction() as cur:
        memory_repo.insert_many(cur, [(stored_memory(1, 1), "memory 1"), (big, big.content)], db.stored)
    read = memory_repo.read_many(db.reader(), db.rows, "t", ["m1", "big"])
    assert read["big"].content == big.content and read["m1"].content == "memory 1"
    assert db.rows.lookup("t", ["m1", "big"])[1] == ["big"]
    db.close()


def test_a_tenant_drop_leaves_a_tenant_whose_name_starts_alike() -> None:
    cache = RowCache(100, id_column=1)
    cache.fill("t", [_row("m1")], cache.generation())
    cache.fill("tx", [("tx", "m1", 0)], cache.generation())
    cache.drop([RowChange("t", None)])
    assert cache.lookup("t", ["m1"]) == ([], ["m1"])
    assert cache.lookup("tx", ["m1"]) == ([("tx", "m1", 0)], [])


def test_fills_numbering_combinations_at_once_never_mix_them_up() -> None:
    cache = RowCache(100_000, id_column=1, shared_columns=frozenset({0, 3}))
    start = threading.Barrier(4)

    def fill(worker: int) -> None:
        start.wait()
        for n in range(500):
            row = ("t", f"w{worker}-{n}", 0, f"kind-{worker}-{n % 40}")
            cache.fill("t", [row], cache.generation())

    threads = [threading.Thread(target=fill, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in range(4):
        found, missing = cache.lookup("t", [f"w{w}-{n}" for n in range(500)])
        assert missing == [] and [r[3] for r in found] == [f"kind-{w}-{n % 40}" for n in range(500)]


def test_packed_rows_take_far_less_memory_than_the_tuples_duckdb_returns() -> None:
    shared = frozenset({0, 2, 3, 10})
    rows = [_wide(n) for n in range(5000)]
    cache = RowCache(10_000, id_column=1, shared_columns=shared)
    tracemalloc.start()
    try:
        cache.fill("t", rows, cache.generation())
        packed = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # What the cache held before: the tuples DuckDB returned (made afresh here, so their
    # strings count too), the shared strings interned, by (tenant, id).
    tracemalloc.start()
    try:
        fresh = (_wide(n) for n in range(5000))
        as_tuples = {
            (r[0], r[1]): tuple(
                sys.intern(v) if i in shared and isinstance(v, str) else v for i, v in enumerate(r)
            )
            for r in fresh
        }
        tuples = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(as_tuples) == cache.stats().rows == 5000
    assert packed < 0.75 * tuples, (packed, tuples)


def test_preload_fills_the_newest_live_rows_up_to_the_limit(tmp_path: Path) -> None:
    written = _db(tmp_path / "d.duckdb", rows=4)
    with written.transaction() as cur:
        memory_repo.tombstone(cur, "t", ["m7"], 99)
        other = replace(stored_memory(0, 0), tenant_id="u", id="u0", seq=8)
        memory_repo.insert_many(cur, [(other, "memory u0")], written.stored)
    written.close()
    db = Database(tmp_path / "d.duckdb", rows=memory_repo.new_row_cache(4))  # a restart: none cached
    assert db.rows.stats().rows == 0
    assert memory_repo.preload(db.reader(), db.rows, 5) == 5  # u0, m6 .. m3 (m7 is deleted)
    found, missing = db.rows.lookup("t", _ids())
    assert missing == ["m0", "m1", "m2", "m3", "m7"]  # at most 4 kept: the oldest fill went first
    assert [r[1] for r in found] == ["m4", "m5", "m6"]
    assert db.rows.lookup("u", ["u0"])[0][0] == memory_repo._rows_by_id(db.reader(), "u", ["u0"])[0]
    assert _cached(db) == _truth(db)
    assert memory_repo.preload(db.reader(), memory_repo.new_row_cache(0), 5) == 0
    db.close()
