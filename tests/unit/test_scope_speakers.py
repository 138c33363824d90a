"""Speakers for Recall's signals: counted per scope across the scopes a filter names, cached
per scope for a while and renewed in the background, and a scope the index holds no row of
costs no query. Real DuckDB and LanceDB files."""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from mnemo_server.config import IndexConfig
from mnemo_server.index.lance_index import IndexRow, LanceIndex
from mnemo_server.memory.model import Memory, Scope, ScopeKind
from mnemo_server.retrieval.speakers import ScopeSpeakers
from mnemo_server.store import memory_repo
from mnemo_server.store.database import Database
from tests.unit.stored import stored_memory

DIM = 8
PROJECT = Scope(ScopeKind.PROJECT, "p")
SESSION = Scope(ScopeKind.SESSION, "s1")
WORKSPACE = Scope.workspace()


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _memory(i: int, scope: Scope, content: str) -> Memory:
    return dataclasses.replace(stored_memory(i, i), scope=scope, content=content, content_hash=f"h{i}")


def _store(db: Database, index: LanceIndex, memories: list[Memory]) -> None:
    with db.transaction() as cur:
        memory_repo.insert_many(cur, [(m, m.content) for m in memories], db.stored)
    index.upsert(
        "t",
        [
            IndexRow(
                id=m.id,
                scope=m.scope.key,
                type="semantic",
                category="general",
                session="",
                pinned=False,
                event_time_ns=m.event_time_ns,
                create_time_ns=m.create_time_ns,
                revision=1,
                text=m.content,
                vector=np.ones(DIM, np.float32),
                seq=m.seq,
            )
            for m in memories
        ],
    )


def test_counts_add_up_across_scopes_are_cached_and_skip_unindexed_scopes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = Database(tmp_path / "d.duckdb")
    index = LanceIndex(tmp_path / "lance", DIM, IndexConfig())
    clock = _Clock()
    speakers = ScopeSpeakers(db, index, min_count=3, ttl_s=5.0, clock=clock)
    _store(
        db,
        index,
        [
            _memory(0, WORKSPACE, "Alice: the deploy is on Friday"),
            _memory(1, WORKSPACE, "Alice: I moved it"),
            _memory(2, PROJECT, "Alice: the budget is fixed"),
            _memory(3, PROJECT, "Bob: fine"),
            _memory(4, PROJECT, "Bob: agreed"),
            _memory(5, WORKSPACE, "no speaker here"),
        ],
    )
    index.warm("t")
    asked: list[list[Scope]] = []
    real = memory_repo.speaker_counts_by_scope

    def counting(cur: object, tenant_id: str, scopes: list[Scope]) -> dict[Scope, dict[str, int]]:
        asked.append(list(scopes))
        return real(cur, tenant_id, scopes)  # type: ignore[arg-type]

    monkeypatch.setattr(memory_repo, "speaker_counts_by_scope", counting)  # counts the real queries
    # Alice has 2 + 1 across workspace and project: 3, enough; Bob 2 in the project alone.
    assert speakers.names("t", [WORKSPACE, PROJECT, SESSION]) == ["Alice"]
    assert asked == [[WORKSPACE, PROJECT]]  # the session scope has no indexed row: not asked
    assert speakers.names("t", [PROJECT]) == []  # Alice 1, Bob 2
    assert speakers.names("t", [WORKSPACE, PROJECT]) == ["Alice"]
    assert len(asked) == 1  # both from the cache
    assert speakers.names("t", []) == ["Alice"]  # the whole tenant: its own query

    _store(db, index, [_memory(6, SESSION, "Bob: one more"), _memory(7, PROJECT, "Carol: hi")])
    # The session scope is indexed now: asked at once (it was never cached); the
    # project's cached counts stand until they expire.
    assert speakers.names("t", [WORKSPACE, PROJECT, SESSION]) == ["Alice", "Bob"]
    assert asked[-1] == [SESSION]
    clock.now = 60.0  # past stale_s: read in the call
    assert speakers.names("t", [PROJECT, Scope(ScopeKind.PROJECT, "other")]) == []
    assert asked[-1] == [PROJECT]  # the other project has no indexed row
    speakers.close()
    db.close()


def test_counts_by_scope_are_live_memories_of_each_scope(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    with db.transaction() as cur:
        memory_repo.insert_many(
            cur,
            [
                (m, m.content)
                for m in [
                    _memory(0, PROJECT, "Bob: a"),
                    _memory(1, WORKSPACE, "Bob: b"),
                    dataclasses.replace(_memory(2, PROJECT, "Bob: gone"), delete_time_ns=5),
                ]
            ],
            db.stored,
        )
    got = memory_repo.speaker_counts_by_scope(db.reader(), "t", [PROJECT, SESSION])  # not the deleted one
    assert got == {PROJECT: {"Bob": 1}, SESSION: {}}
    assert memory_repo.speaker_counts(db.reader(), "t") == {"Bob": 2}
    db.close()


def test_stale_counts_are_served_while_one_background_read_renews_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    db = Database(tmp_path / "d.duckdb")
    index = LanceIndex(tmp_path / "lance", DIM, IndexConfig())
    clock = _Clock()
    speakers = ScopeSpeakers(db, index, min_count=2, ttl_s=5.0, stale_s=60.0, clock=clock)
    _store(db, index, [_memory(0, PROJECT, "Alice: one"), _memory(1, PROJECT, "Alice: two")])
    index.warm("t")
    reads: list[str] = []  # the thread of each read
    hold = threading.Event()
    hold.set()
    fail = [False]
    real = memory_repo.speaker_counts_by_scope

    def counting(cur: object, tenant_id: str, scopes: list[Scope]) -> dict[Scope, dict[str, int]]:
        reads.append(threading.current_thread().name)
        assert hold.wait(10)
        if fail[0]:
            fail[0] = False
            raise RuntimeError("the store is away")
        return real(cur, tenant_id, scopes)  # type: ignore[arg-type]

    monkeypatch.setattr(memory_repo, "speaker_counts_by_scope", counting)  # counts the real queries
    caller = threading.current_thread().name
    assert speakers.names("t", [PROJECT]) == ["Alice"]
    assert reads == [caller]  # never read: read in the call
    _store(db, index, [_memory(2, PROJECT, "Bob: three"), _memory(3, PROJECT, "Bob: four")])

    clock.now = 4.9
    assert speakers.names("t", [PROJECT]) == ["Alice"]  # fresh: cached
    assert len(reads) == 1

    # Past ttl_s: the stale counts answer at once, and one read runs on the refresh thread,
    # however many calls come while it runs.
    clock.now = 5.0
    hold.clear()
    for _ in range(5):
        assert speakers.names("t", [PROJECT]) == ["Alice"]
    assert not speakers.settle(0.05)  # held in the read
    hold.set()
    assert speakers.settle(10)
    assert len(reads) == 2 and reads[1].startswith("mnemo-speakers")
    assert speakers.names("t", [PROJECT]) == ["Alice", "Bob"]  # renewed at 5.0: fresh
    assert len(reads) == 2

    # A refresh that fails leaves the counts stale; the next call past ttl_s tries again.
    # The first failure is a warning; later ones, until a refresh succeeds, are not.
    _store(db, index, [_memory(4, PROJECT, "Carol: five"), _memory(5, PROJECT, "Carol: six")])
    clock.now = 10.0
    with caplog.at_level(logging.INFO, logger="mnemo_server.retrieval.speakers"):
        for failing in range(2):
            fail[0] = True
            assert speakers.names("t", [PROJECT]) == ["Alice", "Bob"]
            assert speakers.settle(10) and len(reads) == 3 + failing
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1 and "not refreshed" in warned[0]
        assert speakers.names("t", [PROJECT]) == ["Alice", "Bob"]  # stale, and a third refresh
        assert speakers.settle(10) and len(reads) == 5
        assert speakers.names("t", [PROJECT]) == ["Alice", "Bob", "Carol"]
        assert "refreshed again" in caplog.records[-1].getMessage()
        # Failing again after a success is news again.
        clock.now = 16.0
        fail[0] = True
        speakers.names("t", [PROJECT])
        assert speakers.settle(10) and "not refreshed" in caplog.records[-1].getMessage()
        assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO, logging.WARNING]

    # Past stale_s the counts are read in the call, not served.
    _store(db, index, [_memory(6, PROJECT, "Dan: seven"), _memory(7, PROJECT, "Dan: eight")])
    clock.now = 100.0
    assert speakers.names("t", [PROJECT]) == ["Alice", "Bob", "Carol", "Dan"]
    assert reads[-1] == caller and len(reads) == 7

    # Closed: stale counts are served as they are, nothing reads them again.
    speakers.close()
    clock.now = 106.0
    assert speakers.names("t", [PROJECT]) == ["Alice", "Bob", "Carol", "Dan"]
    assert speakers.settle(1) and len(reads) == 7
    db.close()
