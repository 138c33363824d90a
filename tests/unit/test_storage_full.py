"""api.errors.storage_full: a call that failed because the disk is full is told apart from a
bug, whichever store said so and however deep in the exception's chain."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import duckdb
import pytest

from mnemo_server.api.errors import storage_full
from mnemo_server.errors import ResourceExhausted


def _oserror_of_a_full_device() -> OSError:
    """What writing to a full disk raises: /dev/full is one that is always full."""
    try:
        with Path("/dev/full").open("wb", buffering=0) as full:
            full.write(b"x")
    except OSError as exc:
        return exc
    raise AssertionError("/dev/full took a write")


def _sqlite_full(tmp_path: Path) -> sqlite3.Error:
    """SQLite's own "database or disk is full", reached by capping the file's pages."""
    db = sqlite3.connect(tmp_path / "pairs.sqlite")
    db.execute("CREATE TABLE t (x BLOB)")
    db.execute("PRAGMA max_page_count = 4")
    try:
        db.execute("INSERT INTO t VALUES (?)", [b"x" * 100_000])
    except sqlite3.Error as exc:
        return exc
    finally:
        db.close()
    raise AssertionError("the capped database took the row")


def _check(exc: BaseException) -> ResourceExhausted:
    found = storage_full(exc, "abc123")
    assert found is not None, exc
    assert found.reason == "STORAGE_FULL" and found.metadata == {"incident": "abc123"}
    assert "storage is full" in found.message and "abc123" in found.message
    return found


def test_the_os_error_of_a_full_disk(tmp_path: Path) -> None:
    _check(_oserror_of_a_full_device())


def test_sqlites_full_database(tmp_path: Path) -> None:
    _check(_sqlite_full(tmp_path))


def test_duckdb_and_lance_errors_carry_the_os_words() -> None:
    # DuckDB's COMMIT on a full disk, as it reads (no errno: the OS's words in the message).
    _check(
        duckdb.TransactionException(
            'TransactionContext Error: Failed to commit: Could not write file "mnemo.duckdb.wal": '
            "No space left on device"
        )
    )


def test_a_full_disk_behind_another_error_is_found_in_its_chain() -> None:
    try:
        try:
            raise _oserror_of_a_full_device()
        except OSError as inner:
            raise RuntimeError("index batch failed") from inner
    except RuntimeError as outer:
        _check(outer)


@pytest.mark.parametrize(
    "exc",
    [RuntimeError("a bug"), OSError(2, "No such file or directory"), duckdb.IOException("Permission denied")],
)
def test_other_failures_stay_internal(exc: BaseException) -> None:
    assert storage_full(exc, "abc123") is None


def test_duckdbs_memory_limit_reached_is_a_retryable_refusal_not_an_internal_error() -> None:
    """Concurrent exports of large memories passed storage.duckdb_memory_limit, and their
    calls, and another tenant's lists, failed INTERNAL (fairness probe)."""
    db = duckdb.connect()
    db.execute("SET memory_limit = '8MB'")
    db.execute("SET threads = 1")
    try:
        db.execute("SELECT i, repeat('x', 2000) AS t FROM range(200000) r(i) ORDER BY t, i").fetchall()
    except duckdb.OutOfMemoryException as exc:
        try:
            raise RuntimeError("while reading a page") from exc
        except RuntimeError as wrapped:
            found = storage_full(wrapped, "abc123")
    else:
        raise AssertionError("the query fit in 8 MB")
    finally:
        db.close()
    assert found is not None and found.reason == "STORE_MEMORY_LIMIT"
    assert "retry" in found.message and found.metadata == {"incident": "abc123"}
