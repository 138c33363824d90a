"""Writers' SQL texts parsed once and run as DuckDB statements (store/database.py): the same
rows and errors as the texts, the same statement reused, texts with literals left as texts.
Real DuckDB files."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from mnemo_server.store.database import Database, ParsedStatements, WriteDomain


def test_a_text_is_parsed_once_and_its_statement_runs_again(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "p.duckdb"))
    con.execute("CREATE TABLE t (a INTEGER PRIMARY KEY, b VARCHAR)")
    parsed = ParsedStatements(capacity=2)
    insert = "INSERT INTO t VALUES (?, ?)"
    first = parsed.of(con, insert)
    assert isinstance(first, duckdb.Statement) and parsed.of(con, insert) is first
    con.execute(first, [1, "x"])
    con.execute(parsed.of(con, insert), [2, "y"])
    assert con.execute("SELECT a, b FROM t ORDER BY a").fetchall() == [(1, "x"), (2, "y")]
    with pytest.raises(duckdb.ConstraintException):  # the text's own error
        con.execute(first, [1, "again"])

    # Literal values (a quote) and several statements stay texts; a bad text fails as one.
    assert parsed.of(con, "SELECT * FROM t WHERE b = 'x'") == "SELECT * FROM t WHERE b = 'x'"
    assert parsed.of(con, "SELECT 1; SELECT 2") == "SELECT 1; SELECT 2"
    with pytest.raises(duckdb.ParserException):
        parsed.of(con, "INSERT INTO t VALUS (?)")

    # The least recently used goes past the capacity.
    select_a = parsed.of(con, "SELECT a FROM t WHERE a = ?")
    parsed.of(con, insert)  # used again: kept
    parsed.of(con, "SELECT b FROM t WHERE a = ?")  # the third: the oldest use goes
    assert parsed.of(con, insert) is first
    assert parsed.of(con, "SELECT a FROM t WHERE a = ?") is not select_a  # parsed anew
    con.close()


def test_transactions_commit_roll_back_and_stay_empty_with_parsed_statements(tmp_path: Path) -> None:
    db = Database(tmp_path / "d.duckdb")
    with db.transaction() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS n (a INTEGER PRIMARY KEY)")
    with db.transaction(WriteDomain.SESSIONS) as cur:
        cur.execute("INSERT INTO n VALUES (?)", [1])
        cur.execute("INSERT INTO n VALUES (?)", [2])

    def one_taken() -> None:
        with db.transaction(WriteDomain.SESSIONS) as cur:
            cur.execute("INSERT INTO n VALUES (?)", [3])
            cur.execute("INSERT INTO n VALUES (?)", [1])  # taken: the whole transaction rolls back

    def given_up() -> None:
        with db.transaction(WriteDomain.SESSIONS) as cur:
            cur.execute("INSERT INTO n VALUES (?)", [4])
            raise RuntimeError("the caller gives up")

    with pytest.raises(duckdb.ConstraintException):
        one_taken()
    with pytest.raises(RuntimeError):
        given_up()
    with db.transaction(WriteDomain.SESSIONS):
        pass  # no statement: nothing begun, nothing to commit
    with db.single_statement(WriteDomain.SESSIONS) as cur:
        cur.execute("INSERT INTO n VALUES (?)", [5])
    with pytest.raises(duckdb.ConstraintException), db.single_statement(WriteDomain.SESSIONS) as cur:
        cur.execute("INSERT INTO n VALUES (?)", [5])
    assert db.reader().execute("SELECT a FROM n ORDER BY a").fetchall() == [(1,), (2,), (5,)]
    # No transaction was left open: another one begins and commits.
    with db.transaction(WriteDomain.SESSIONS) as cur:
        cur.execute("INSERT INTO n VALUES (?)", [6])
    assert db.reader().execute("SELECT count(*) FROM n").fetchall() == [(4,)]
    db.close()
