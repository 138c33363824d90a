"""Speakers for Recall's signals: counted per scope across the scopes a filter names, cached
per scope for a while, and a scope the index holds no row of costs no query. Real DuckDB
and LanceDB files."""

from __future__ import annotations

import dataclasses
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
    clock.now = 5.0
    assert speakers.names("t", [PROJECT, Scope(ScopeKind.PROJECT, "other")]) == []
    assert asked[-1] == [PROJECT]  # expired; the other project has no indexed row
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
