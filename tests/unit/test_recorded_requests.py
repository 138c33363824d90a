"""Keyed writes skip the idempotency query for request ids never recorded; the summary must
therefore say "may hold" for every recorded one: inside the recording transaction, after a
restart (rebuilt from the table), and always for a read-only store."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from mnemo_server.errors import InvalidArgument
from mnemo_server.memory.model import IdempotencyKey
from mnemo_server.store import idempotency_repo
from mnemo_server.store.database import Database, WriteConflict, fetch_one

KEY = IdempotencyKey("CreateMemory", "r1", "fp")


def _record(db: Database, tenant_id: str, key: IdempotencyKey) -> None:
    with db.transaction() as cur:
        idempotency_repo.record(cur, db.stored.requests, tenant_id, key, {"ids": ["m1"]}, 1)
        assert db.stored.requests.may_hold(tenant_id, key.request_id)  # before COMMIT


def test_a_recorded_key_is_found_and_only_for_its_tenant(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    assert not db.stored.requests.may_hold("t", "r1")
    _record(db, "t", KEY)
    assert idempotency_repo.lookup(db.reader(), db.stored.requests, "t", KEY) == {"ids": ["m1"]}
    assert not db.stored.requests.may_hold("u", "r1")
    assert idempotency_repo.lookup(db.reader(), db.stored.requests, "u", KEY) is None
    db.close()


def test_a_new_key_is_answered_without_a_query(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    _record(db, "t", KEY)
    # With the table gone a query would fail: the new key's lookup makes none, the recorded
    # key's still asks DuckDB.
    db.reader().execute("DROP TABLE idempotency")
    fresh = IdempotencyKey("CreateMemory", "r2", "fp")
    assert idempotency_repo.lookup(db.reader(), db.stored.requests, "t", fresh) is None
    with pytest.raises(duckdb.CatalogException):
        idempotency_repo.lookup(db.reader(), db.stored.requests, "t", KEY)
    db.close()


def _recorded_file(tmp_path: Path) -> Path:
    """A closed store holding KEY's record."""
    path = tmp_path / "d.duckdb"
    db = Database(path)
    _record(db, "t", KEY)
    db.close()
    return path


def test_keys_recorded_before_a_restart_are_found_after_it(tmp_path: Path) -> None:
    reopened = Database(_recorded_file(tmp_path))
    assert reopened.stored.requests.may_hold("t", "r1")
    assert idempotency_repo.lookup(reopened.reader(), reopened.stored.requests, "t", KEY) == {"ids": ["m1"]}
    other = IdempotencyKey("CreateMemory", "r1", "another request")
    with pytest.raises(InvalidArgument, match="different request"):
        idempotency_repo.lookup(reopened.reader(), reopened.stored.requests, "t", other)
    reopened.close()


def test_a_read_only_store_always_asks(tmp_path: Path) -> None:
    read_only = Database(_recorded_file(tmp_path), read_only=True)
    assert read_only.stored.requests.may_hold("t", "never-recorded")
    assert idempotency_repo.lookup(read_only.reader(), read_only.stored.requests, "t", KEY) == {"ids": ["m1"]}
    read_only.close()


def _keys(n: int) -> list[IdempotencyKey]:
    return [IdempotencyKey("CreateMemory", f"g{i}", f"fp{i}") for i in range(n)]


@pytest.mark.parametrize("n", [3, 8])  # VALUES up to 5 rows, an Arrow view beyond
def test_a_group_records_each_keyed_result_and_skips_unkeyed_ones(tmp_path: Path, n: int) -> None:
    db = Database(tmp_path / "d.duckdb")
    keys = _keys(n)
    with db.transaction() as cur:
        results = [(k, {"ids": [f"m{i}"]}) for i, k in enumerate(keys)]
        idempotency_repo.record_many(cur, db.stored.requests, "t", [*results, (None, {"ids": ["x"]})], 1)
    for i, k in enumerate(keys):
        assert idempotency_repo.lookup(db.reader(), db.stored.requests, "t", k) == {"ids": [f"m{i}"]}
    assert fetch_one(db.reader(), "SELECT count(*) FROM idempotency") == (n,)
    db.close()


def test_a_group_with_a_key_taken_since_records_none_of_its_keys(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    keys = _keys(3)
    _record(db, "t", keys[1])
    with pytest.raises(WriteConflict), db.transaction() as cur:
        idempotency_repo.record_many(cur, db.stored.requests, "t", [(k, {"ids": []}) for k in keys], 2)
    assert fetch_one(db.reader(), "SELECT list(request_id) FROM idempotency") == (["g1"],)
    db.close()
