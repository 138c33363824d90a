"""Memory sequence numbers come from memory, not a DuckDB sequence: they go on past the
largest stored (also after a restart, and on a store an older server wrote with the
sequence), never repeat across threads, and a rolled-back transaction leaves only a gap."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mnemo_server.config import CapsConfig
from mnemo_server.memory.creates import CreateRequest, CreateWriter
from mnemo_server.memory.live_counts import LiveCounts
from mnemo_server.memory.model import MemoryDraft, Scope, now_ns
from mnemo_server.store import memory_repo
from mnemo_server.store.database import Database, WriteDomain
from tests.unit.stored import database_with_memories, stored_memory

MEMORIES = WriteDomain.MEMORIES


def _writer(db: Database) -> CreateWriter:
    return CreateWriter(db, CapsConfig(), LiveCounts(), "m", now_ns, group_max_memories=500)


def _create(writer: CreateWriter, content: str) -> int:
    written = writer.write(CreateRequest("t", [MemoryDraft(content=content)], ["memory"], None))
    return written.results[0].memory.seq


def test_numbers_go_on_past_the_largest_stored_when_the_file_is_opened(tmp_path: Path) -> None:
    db = database_with_memories(tmp_path / "d.duckdb", count=3)  # seqs 0, 1, 2
    with db.transaction(MEMORIES) as cur:  # one stored out of order (an older server, a restore)
        memory_repo.insert_many(cur, [(stored_memory(40, 40), "memory 40")], db.stored)
    db.close()

    reopened = Database(tmp_path / "d.duckdb")
    writer = _writer(reopened)
    assert [_create(writer, f"new {i}") for i in range(3)] == [41, 42, 43]
    reopened.close()
    assert _create(_writer(Database(tmp_path / "d.duckdb")), "after a restart") == 44


def test_an_empty_store_starts_at_one(tmp_path: Path) -> None:
    assert _create(_writer(Database(tmp_path / "d.duckdb")), "first") == 1


def test_a_rolled_back_transaction_leaves_a_gap_and_order_holds(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    writer = _writer(db)
    first = _create(writer, "first")
    taken: list[int] = []

    def roll_back() -> None:
        with db.transaction(MEMORIES):
            taken.extend(db.memory_seqs.take(5))
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        roll_back()
    assert taken == list(range(first + 1, first + 6))
    assert _create(writer, "second") == first + 6


def test_threads_taking_numbers_at_once_never_get_the_same(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    taken: list[list[int]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def take(i: int) -> None:
        start.wait()
        for _ in range(200):
            taken[i].extend(db.memory_seqs.take(3))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [n for numbers in taken for n in numbers]
    assert sorted(every) == list(range(1, 8 * 200 * 3 + 1))
    assert all(numbers == sorted(numbers) for numbers in taken)


def test_scope_does_not_matter_numbers_are_store_wide(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    writer = _writer(db)
    a = writer.write(CreateRequest("t", [MemoryDraft(content="a")], ["memory"], None))
    b = writer.write(
        CreateRequest("u", [MemoryDraft(content="b", scope=Scope.workspace())], ["memory"], None)
    )
    assert b.results[0].memory.seq == a.results[0].memory.seq + 1
