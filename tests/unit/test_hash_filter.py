"""The stored-hash filter lets a create skip the duplicate query only for content never
stored: a stored hash is always "may be stored" (after a restart too, after a rolled-back
insert, after an update that changed content), and duplicates are still found."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mnemo_server.config import CapsConfig
from mnemo_server.memory.creates import CreateRequest, CreateWriter
from mnemo_server.memory.live_counts import LiveCounts
from mnemo_server.memory.model import MemoryDraft, MemoryFilter, now_ns
from mnemo_server.memory.normalize import normalize_content
from mnemo_server.store import memory_repo
from mnemo_server.store.database import Database, WriteDomain
from mnemo_server.store.hash_filter import ContentHashFilter
from tests.unit.stored import database_with_memories

MEMORIES = WriteDomain.MEMORIES


def _sha(i: int) -> str:
    return hashlib.sha256(f"content {i}".encode()).hexdigest()


def _create(db: Database, content: str) -> tuple[str, bool]:
    writer = CreateWriter(db, CapsConfig(), LiveCounts(), "m", now_ns, group_max_memories=0)
    r = writer.write(CreateRequest("t", [MemoryDraft(content=content)], ["memory"], None)).results[0]
    return r.memory.id, r.deduplicated


def test_every_added_hash_may_be_stored_and_few_others_seem_so() -> None:
    f = ContentHashFilter()
    f.add(_sha(i) for i in range(20_000))
    assert all(f.may_contain(_sha(i)) for i in range(20_000))
    false_positives = sum(f.may_contain(_sha(i)) for i in range(20_000, 120_000))
    assert false_positives < 10  # ~0.0006 % expected at 20k hashes in 2^24 bits (~1 in 176,000)


def test_a_saturated_filter_never_rules_out() -> None:
    assert ContentHashFilter(saturated=True).may_contain(_sha(1))


def test_a_hash_the_filter_never_saw_is_not_looked_up(tmp_path: Path) -> None:
    db = database_with_memories(tmp_path / "d.duckdb", count=3)  # hashes h0, h1, h2
    cur = db.reader()
    found = memory_repo.find_live_duplicates(cur, db.stored.hashes, "t", ["h1", "never stored"])
    assert [m.id for m in found.values()] == ["m1"]
    # An empty filter says nothing was stored, so the stored row is not even read.
    assert memory_repo.find_live_duplicates(cur, ContentHashFilter(), "t", ["h1"]) == {}
    db.close()


def test_the_filter_is_rebuilt_from_the_file_when_it_is_opened(tmp_path: Path) -> None:
    path = tmp_path / "d.duckdb"
    first_id, dedup = _create(Database(path), "The user prefers dark mode.")
    assert not dedup
    reopened = Database(path)
    assert reopened.stored.hashes.may_contain(normalize_content("The user prefers dark mode.").hash)
    assert _create(reopened, "the user prefers dark mode") == (first_id, True)


def test_a_rolled_back_insert_leaves_no_row_and_its_content_is_written_later(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    writer = CreateWriter(db, CapsConfig(), LiveCounts(), "m", now_ns, group_max_memories=0)

    def insert_then_fail() -> None:
        with db.transaction(MEMORIES) as cur:
            writer._write_in(
                cur, [CreateRequest("t", [MemoryDraft(content="rolled back")], ["memory"], None)], 1
            )
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        insert_then_fail()
    assert memory_repo.count_through(db.reader(), "t", MemoryFilter(), include_deleted=True)[0] == 0
    # The filter still has the hash (it only grows); the query then finds no live row.
    assert db.stored.hashes.may_contain(normalize_content("rolled back").hash)
    new_id, dedup = _create(db, "rolled back")
    assert not dedup and memory_repo.get(db.reader(), "t", new_id) is not None


def test_content_changed_by_an_update_is_found_as_a_duplicate(tmp_path: Path) -> None:
    db = database_with_memories(tmp_path / "d.duckdb", count=1)  # m0, not created through a writer
    changed = normalize_content("Moved the standup to 10am.")
    with db.transaction(MEMORIES) as cur:
        memory_repo.update_columns(
            cur,
            db.stored,
            "t",
            "m0",
            {
                "content": changed.storage,
                "normalized_content": changed.normalized,
                "content_hash": changed.hash,
            },
            5,
        )
    assert _create(db, "moved the standup to 10am") == ("m0", True)
