"""StartSession's recent candidates come from in-memory lists of each scope's newest live
ids (`store/recent_ids.py`). They must give exactly what DuckDB's query gives: after
inserts, tombstones, restores and deletes, racing fills, rolled-back writes and restarts."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from pathlib import Path

import pytest

from mnemo_server.memory.model import Memory, MemoryFilter, Scope, ScopeKind
from mnemo_server.store import memory_repo, recent_ids
from mnemo_server.store.database import Database
from mnemo_server.store.recent_ids import RecentIds, RowsAdded, RowsGone, RowsRevived
from tests.unit.stored import stored_memory

A = ("t", "workspace", "a")
B = ("t", "workspace", "b")


def _added(key: tuple[str, str, str], *seqs: int) -> RowsAdded:
    return RowsAdded(tuple((key, s, f"m{s}") for s in seqs))


def test_lists_answer_across_scopes_newest_first_and_say_which_scopes_they_cannot() -> None:
    r = RecentIds(depth=4)
    ids, missing = r.newest([A, B], 3)
    assert (ids, missing) == ([], [A, B])
    r.fill(A, [(9, "m9"), (5, "m5"), (2, "m2")], since=0)  # three rows: the whole scope
    r.fill(B, [(8, "m8"), (7, "m7"), (6, "m6"), (4, "m4")], since=0)  # full: more may exist
    assert r.newest([A, B], 3) == (["m9", "m8", "m7"], [])
    assert r.newest([A], 4) == (["m9", "m5", "m2"], [])  # complete, so shorter is exact
    r.apply([RowsGone("t", frozenset({"m8", "m7"}))])
    assert r.newest([B], 2) == (["m6", "m4"], [])  # the rest stay the newest live ones
    assert r.newest([B], 3) == ([], [B])  # too short to say


def test_an_insert_joins_a_list_where_it_belongs_and_only_there() -> None:
    r = RecentIds(depth=3)
    r.fill(A, [(10, "m10"), (8, "m8"), (6, "m6")], since=0)  # full
    r.apply([_added(A, 12)])
    assert r.newest([A], 3) == (["m12", "m10", "m8"], [])
    r.apply([_added(A, 1)])  # older than the whole list: leaves it as it was
    assert r.newest([A], 3) == (["m12", "m10", "m8"], [])
    r.apply([RowsGone("t", frozenset({"m10"}))])
    r.apply([_added(A, 9)])  # between listed rows: certainly one of the newest
    assert r.newest([A], 3) == (["m12", "m9", "m8"], [])
    r.apply([RowsGone("t", frozenset({"m9"}))])
    r.apply([_added(A, 7)])  # past the end of a list that is not the whole scope: an unlisted
    # row (m6 here, but the list cannot know) may lie between it and the list's last
    assert r.newest([A], 3)[1] == [A]
    r.apply([_added(A, 12)])  # a fill that raced the insert already has it: no copy
    assert r.newest([A], 2) == (["m12", "m8"], [])
    r.apply([_added(B, 20)])  # a scope nobody read yet keeps no list
    assert r.newest([B], 1) == ([], [B])


def test_a_complete_list_takes_older_rows_and_stops_being_complete_when_it_overflows() -> None:
    r = RecentIds(depth=2)
    r.fill(A, [(5, "m5")], since=0)
    r.apply([_added(A, 3)])
    assert r.newest([A], 2) == (["m5", "m3"], [])
    r.apply([_added(A, 1)])  # a third row: the list keeps two and is no longer the scope
    assert r.newest([A], 2) == (["m5", "m3"], [])
    r.apply([RowsGone("t", frozenset({"m3"}))])
    assert r.newest([A], 2)[1] == [A]


def test_a_revived_row_drops_its_tenants_lists_and_no_other() -> None:
    r = RecentIds(depth=2)
    other = ("u", "workspace", "a")
    r.fill(A, [(5, "m5")], since=0)
    r.fill(other, [(4, "m4")], since=0)
    r.apply([RowsRevived("t")])
    assert r.newest([A], 1) == ([], [A])
    assert r.newest([other], 1) == (["m4"], [])


def test_a_fill_is_skipped_when_its_tenant_changed_since_the_read_began() -> None:
    r = RecentIds(depth=4)
    since = r.generation("t")
    r.apply([_added(B, 9)])  # another scope of the same tenant, applied while A was read
    r.fill(A, [(5, "m5")], since=since)
    assert r.newest([A], 1) == ([], [A])
    assert r.stats().fills_skipped == 1
    r.fill(A, [(5, "m5")], since=r.generation("t"))
    assert r.newest([A], 1) == (["m5"], [])
    r.fill(("u", "workspace", "a"), [(1, "m1")], since=r.generation("u"))  # other tenants' changes
    assert r.stats().scopes == 2


def test_at_most_max_scopes_lists_are_kept_oldest_fill_first_out() -> None:
    r = RecentIds(depth=2, max_scopes=2)
    keys = [("t", "session", str(i)) for i in range(3)]
    for k in keys:
        r.fill(k, [(1, "x")], since=0)
    assert r.newest([keys[0]], 1)[1] == [keys[0]]
    assert r.newest([keys[2]], 1) == (["x"], [])
    assert RecentIds(depth=0).enabled is False


def _memory(i: int, scope_id: str, tenant: str = "t") -> Memory:
    return dataclasses.replace(
        stored_memory(i, i), tenant_id=tenant, scope=Scope(ScopeKind.WORKSPACE, scope_id)
    )


def _insert(db: Database, memories: list[Memory]) -> None:
    with db.transaction() as cur:
        memory_repo.insert_many(cur, [(m, m.content) for m in memories], db.stored)


def _both(db: Database, scopes: list[Scope], limit: int) -> tuple[list[str], list[str]]:
    cur = db.reader()
    from_lists = memory_repo.newest_in_scopes(cur, db.recent, db.stored, db.rows, "t", scopes, limit)
    from_duckdb = memory_repo.list_page(
        cur, "t", MemoryFilter(scopes=tuple(scopes)), include_deleted=False, before_seq=None, limit=limit
    )
    return [m.id for m in from_lists], [m.id for m in from_duckdb]


def test_newest_in_scopes_agrees_with_duckdb_through_random_writes(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb", rows=memory_repo.new_row_cache(1000), recent=RecentIds(depth=6))
    rng = random.Random(7)
    names = ["a", "b", "c"]
    live: list[str] = []
    deleted: list[str] = []
    seq = 0
    for step in range(300):
        op = rng.random()
        if op < 0.5 or not live:
            batch = []
            for _ in range(rng.randint(1, 3)):
                seq += 1
                batch.append(_memory(seq, rng.choice(names)))
            _insert(db, batch)
            live += [m.id for m in batch]
        elif op < 0.8:
            doomed = rng.sample(live, min(len(live), rng.randint(1, 2)))
            with db.transaction() as cur:
                memory_repo.tombstone(cur, "t", doomed, step)
            live = [i for i in live if i not in doomed]
            deleted += doomed
        elif op < 0.9 and deleted:
            back = deleted.pop(rng.randrange(len(deleted)))
            with db.transaction() as cur:
                memory_repo.update_columns(cur, db.stored, "t", back, {"delete_time_ns": None}, step)
            live.append(back)
        elif deleted:
            gone = deleted.pop(rng.randrange(len(deleted)))
            with db.transaction() as cur:
                memory_repo.delete_rows(cur, "t", [gone])
        scopes = [Scope(ScopeKind.WORKSPACE, n) for n in rng.sample(names, rng.randint(1, 3))]
        scopes.append(Scope(ScopeKind.SESSION, f"new-{step}"))  # never written: no query needed
        limit = rng.randint(1, 6)
        got, want = _both(db, scopes, limit)
        assert got == want, (step, scopes, limit)
    stats = db.recent.stats()
    assert stats.hits + stats.misses == 300
    assert stats.hits > 100  # most reads were answered by the lists alone, with no query
    db.close()


def test_a_rolled_back_insert_or_tombstone_changes_no_list(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb", recent=RecentIds(depth=4))
    scope = [Scope(ScopeKind.WORKSPACE, "a")]
    _insert(db, [_memory(1, "a"), _memory(2, "a")])
    assert _both(db, scope, 3) == (["m2", "m1"], ["m2", "m1"])

    def write_then_fail() -> None:
        with db.transaction() as cur:
            memory_repo.insert_many(cur, [(_memory(3, "a"), "memory 3")], db.stored)
            memory_repo.tombstone(cur, "t", ["m2"], 5)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_then_fail()
    assert db.recent.newest([recent_ids.scope_key("t", scope[0])], 3) == (["m2", "m1"], [])
    assert _both(db, scope, 3) == (["m2", "m1"], ["m2", "m1"])
    db.close()


def test_written_scopes_are_rebuilt_from_the_file_and_a_read_only_store_rules_nothing_out(
    tmp_path: Path,
) -> None:
    path = tmp_path / "d.duckdb"
    db = Database(path, recent=RecentIds(depth=4))
    _insert(db, [_memory(1, "a"), _memory(2, "gone")])
    with db.transaction() as cur:
        memory_repo.tombstone(cur, "t", ["m2"], 5)
    assert db.stored.scopes.may_hold(("t", "workspace", "a"))
    db.close()
    reopened = Database(path, recent=RecentIds(depth=4))
    assert reopened.stored.scopes.may_hold(("t", "workspace", "a"))
    assert reopened.stored.scopes.may_hold(("t", "workspace", "gone"))  # a tombstone may come back
    assert not reopened.stored.scopes.may_hold(("t", "session", "never"))
    assert _both(reopened, [Scope(ScopeKind.WORKSPACE, "a")], 2) == (["m1"], ["m1"])
    reopened.close()
    read_only = Database(path, read_only=True)
    assert read_only.stored.scopes.may_hold(("t", "session", "never"))
    read_only.close()


def test_fills_racing_writers_leave_no_stale_list(tmp_path: Path) -> None:
    """A reader fills lists while writers insert and tombstone in the same scopes; a fill
    whose read predates a write must not be kept. In each round the writers stop, and the
    lists as they stand (no new fill) must agree with DuckDB."""
    db = Database(tmp_path / "d.duckdb", rows=memory_repo.new_row_cache(1000), recent=RecentIds(depth=4))
    names = ["a", "b"]
    keys = [("t", "workspace", n) for n in names]
    _insert(db, [_memory(i, names[i % 2]) for i in range(1, 9)])
    next_seq = iter(range(9, 1_000_000))
    errors: list[BaseException] = []
    checked = 0

    def write(seed: int, stop: threading.Event) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                m = _memory(next(next_seq), rng.choice(names))
                _insert(db, [m])
                if rng.random() < 0.3:
                    with db.transaction() as cur:
                        memory_repo.tombstone(cur, "t", [m.id], 1)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def read(stop: threading.Event) -> None:
        cur = db.reader()
        scopes = [Scope(ScopeKind.WORKSPACE, n) for n in names]
        try:
            while not stop.is_set():
                db.recent.apply([RowsRevived("t")])  # drop the lists, so the next read fills
                memory_repo.newest_in_scopes(cur, db.recent, db.stored, db.rows, "t", scopes, 4)
        except BaseException as exc:
            errors.append(exc)

    for round_ in range(60):
        stop = threading.Event()
        threads = [threading.Thread(target=write, args=(round_ * 2 + s, stop)) for s in (0, 1)]
        threads.append(threading.Thread(target=read, args=(stop,)))
        for t in threads:
            t.start()
        time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert not errors
        for key in keys:
            ids, missing = db.recent.newest([key], 4)
            if missing:
                continue  # the last fill was skipped: nothing kept, nothing to check
            want = memory_repo.list_page(
                db.reader(),
                "t",
                MemoryFilter(scopes=(Scope(ScopeKind.WORKSPACE, key[2]),)),
                include_deleted=False,
                before_seq=None,
                limit=4,
            )
            assert ids == [m.id for m in want], (round_, key)
            checked += 1
    assert checked >= 10  # enough rounds end with a kept list (a fill that met a write is skipped)
    db.close()
