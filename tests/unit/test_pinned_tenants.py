"""StartSession skips the pinned query for tenants that have never stored a pinned memory;
the summary must therefore say "may hold" for every tenant that does: as soon as the write
that pins is inside its transaction, after a rolled-back write, after a restart, and always
for a read-only store."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mnemo_server.store import memory_repo
from mnemo_server.store.database import Database
from mnemo_server.store.stored_summary import PinnedTenants, StoredSummary
from tests.unit.stored import database_with_memories, stored_memory


def test_a_pinned_insert_marks_its_tenant_before_commit_and_no_other(tmp_path: Path) -> None:
    db = database_with_memories(tmp_path / "d.duckdb", count=3)  # tenant "t", none pinned
    assert not db.stored.pinned_tenants.may_hold("t")
    pinned = dataclasses.replace(stored_memory(7, 7), tenant_id="u", pinned=True)
    with db.transaction() as cur:
        memory_repo.insert_many(cur, [(pinned, "memory 7")], db.stored)
        assert db.stored.pinned_tenants.may_hold("u")  # before any reader can see the row
    assert not db.stored.pinned_tenants.may_hold("t")
    db.close()


def test_an_update_that_pins_marks_the_tenant_and_one_that_unpins_does_not(tmp_path: Path) -> None:
    db = database_with_memories(tmp_path / "d.duckdb", count=3)
    with db.transaction() as cur:
        memory_repo.update_columns(cur, db.stored, "t", "m1", {"pinned": False, "importance": 0.9}, 5)
    assert not db.stored.pinned_tenants.may_hold("t")
    with db.transaction() as cur:
        memory_repo.update_columns(cur, db.stored, "t", "m1", {"pinned": True}, 6)
    assert db.stored.pinned_tenants.may_hold("t")
    db.close()


def test_a_rolled_back_pin_still_says_may_hold(tmp_path: Path) -> None:
    db = database_with_memories(tmp_path / "d.duckdb", count=3)

    def pin_then_fail() -> None:
        with db.transaction() as cur:
            memory_repo.update_columns(cur, db.stored, "t", "m2", {"pinned": True}, 6)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        pin_then_fail()
    row = memory_repo.get(db.reader(), "t", "m2")
    assert row is not None and not row.pinned
    assert db.stored.pinned_tenants.may_hold("t")  # it only grows: a false "may" costs a query
    db.close()


def test_the_summary_is_rebuilt_from_the_file_deleted_pinned_rows_included(tmp_path: Path) -> None:
    path = tmp_path / "d.duckdb"
    db = database_with_memories(path, count=2)
    with db.transaction() as cur:
        memory_repo.insert_many(
            cur,
            [
                (dataclasses.replace(stored_memory(5, 5), tenant_id="live", pinned=True), "memory 5"),
                (dataclasses.replace(stored_memory(6, 6), tenant_id="gone", pinned=True), "memory 6"),
            ],
            db.stored,
        )
        memory_repo.tombstone(cur, "gone", ["m6"], 9)
    db.close()
    reopened = Database(path)
    assert reopened.stored.pinned_tenants.may_hold("live")
    assert reopened.stored.pinned_tenants.may_hold("gone")  # a deleted row may be restored
    assert not reopened.stored.pinned_tenants.may_hold("t")
    reopened.close()
    read_only = Database(path, read_only=True)
    assert read_only.stored.pinned_tenants.may_hold("t")  # keeps no summary, so rules nothing out
    read_only.close()


def test_an_empty_summary_rules_out_every_tenant_and_a_saturated_one_none() -> None:
    assert not StoredSummary().pinned_tenants.may_hold("t")
    assert StoredSummary.saturated().pinned_tenants.may_hold("t")
    assert PinnedTenants(saturated=True).may_hold("anyone")
