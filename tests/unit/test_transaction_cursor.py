"""A write transaction's BEGIN rides on its first statement (TransactionCursor): that
statement must still be inside the transaction, whatever it is, and no way out of the
transaction may leave one open (a CHECKPOINT is refused while one is) or hide the error."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from mnemo_server.store.database import Database


@pytest.fixture
def db(tmp_path: Path) -> Database:
    d = Database(tmp_path / "d.duckdb")
    with d.transaction() as cur:
        cur.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v VARCHAR)")
        cur.execute("INSERT INTO t VALUES (1, 'one')")
    return d


def _rows(db: Database) -> list[tuple[object, ...]]:
    return db.reader().execute("SELECT k, v FROM t ORDER BY k").fetchall()


def _first_then_fail(db: Database, statement: str, params: object = None, many: bool = False) -> None:
    with db.transaction() as cur:
        if many:
            cur.executemany(statement, params)
        else:
            cur.execute(statement, params)
        raise RuntimeError("after the first statement")


def test_the_first_statement_is_inside_the_transaction(db: Database) -> None:
    # Were its BEGIN lost, each first statement would have committed by itself and survived.
    for statement, params, many in [
        ("INSERT INTO t VALUES (?, ?)", [2, "two"], False),
        ("UPDATE t SET v = ? WHERE k = 1", ["uno"], False),
        ("INSERT INTO t VALUES (?, ?)", [[3, "three"], [4, "four"]], True),
    ]:
        with pytest.raises(RuntimeError, match="after the first"):
            _first_then_fail(db, statement, params, many)
    assert _rows(db) == [(1, "one")]
    db.checkpoint()  # nothing left open
    db.close()


def test_statements_commit_together(db: Database) -> None:
    with db.transaction() as cur:
        found = cur.execute("SELECT count(*) FROM t WHERE k = ?", [1]).fetchall()
        cur.execute("INSERT INTO t VALUES (?, ?)", [2, "two"])
    assert found == [(1,)]
    assert _rows(db) == [(1, "one"), (2, "two")]
    db.close()


def test_a_body_without_statements_commits_nothing_and_fails_nothing(db: Database) -> None:
    with db.transaction():
        pass
    db.checkpoint()
    assert _rows(db) == [(1, "one")]
    db.close()


@pytest.mark.parametrize(
    ("statement", "error"),
    [
        ("INSERT INTO t VALUES (1, 'again')", duckdb.ConstraintException),  # BEGIN ran, the insert failed
        ("INSERT INTO nowhere VALUES (1)", duckdb.CatalogException),  # failed at binding
        ("INSERT INTO t VALUES (", duckdb.ParserException),  # does not parse
    ],
)
def test_a_failing_first_statement_keeps_its_error_and_leaves_nothing_open(
    db: Database, statement: str, error: type[Exception]
) -> None:
    with pytest.raises(error):
        _first_then_fail(db, statement)
    db.checkpoint()
    with db.transaction() as cur:
        cur.execute("INSERT INTO t VALUES (?, ?)", [2, "two"])
    assert _rows(db) == [(1, "one"), (2, "two")]
    db.close()
