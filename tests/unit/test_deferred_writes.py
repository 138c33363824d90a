"""Writes a transaction defers (TransactionCursor.defer) on a real DuckDB file: values in the
text are stored as the same values given as parameters, a deferred write goes with the next
statement and with COMMIT, and one that fails leaves nothing written and no transaction open."""

from __future__ import annotations

import math
import random
import struct
from pathlib import Path

import duckdb
import pytest

from mnemo_server.config import CapsConfig
from mnemo_server.errors import InvalidArgument
from mnemo_server.memory.creates import CreateRequest, CreateWriter, CreateWritten
from mnemo_server.memory.live_counts import LiveCounts
from mnemo_server.memory.model import IdempotencyKey, MemoryDraft, Scope, now_ns
from mnemo_server.store import memory_repo
from mnemo_server.store.database import Database, WriteDomain, fetch_one
from mnemo_server.store.sql_literals import insert_text, literal

MEMORIES = WriteDomain.MEMORIES
COLUMNS = ["s", "f", "d", "b", "i"]


def _values(rng: random.Random) -> dict[str, object]:
    # Doubles whose float32 rounding a twice-rounded decimal could get wrong, extremes, and
    # texts that would break a naive quoting.
    bits = rng.getrandbits(64)
    d = struct.unpack("d", struct.pack("Q", bits))[0]
    if not math.isfinite(d):
        d = rng.uniform(-1e6, 1e6)
    texts = ["it's", "''", "a\\'b", "x\x00y", "é 😀 ∑", "'); DROP TABLE t; --", "", "\n\t"]
    return {
        "s": rng.choice(texts) + str(rng.random()),
        "f": rng.choice(
            [d if abs(d) < 3.4e38 else d * 1e-300, rng.random(), 0.1, 1 / 3, 3.4028234e38, 1e-45]
        ),
        "d": rng.choice([d, 5e-324, -0.0, 1.7976931348623157e308]),
        "b": rng.choice([True, False, None]),
        "i": rng.choice([0, -(2**63), 2**63 - 1, rng.getrandbits(40)]),
    }


def test_values_in_the_text_are_stored_as_the_same_values_as_parameters() -> None:
    con = duckdb.connect()
    for table in ("lit", "par"):
        con.execute(f"CREATE TABLE {table} (n INTEGER, s VARCHAR, f FLOAT, d DOUBLE, b BOOLEAN, i BIGINT)")
    rng = random.Random(7)
    for n in range(400):
        row = {"n": n, **_values(rng)}
        text = insert_text("lit", ["n", *COLUMNS], [row])
        assert text is not None
        con.execute(text)
        con.execute("INSERT INTO par VALUES (?, ?, ?, ?, ?, ?)", [row[c] for c in ["n", *COLUMNS]])
    lit = con.execute("SELECT * FROM lit ORDER BY n").fetchall()
    par = con.execute("SELECT * FROM par ORDER BY n").fetchall()
    assert len(lit) == 400 and lit == par
    assert con.execute("SELECT count(*) FROM lit WHERE s LIKE 'x' || chr(0) || 'y%'").fetchone() != (0,)


def test_only_plain_values_have_a_literal() -> None:
    assert literal(None) == "NULL" and literal(True) == "TRUE" and literal(3) == "3"
    assert literal(b"raw") is None and literal([1]) is None and literal(MEMORIES) is None
    assert insert_text("t", ["a"], [{"a": 1}, {"a": b"x"}]) is None  # then written with parameters


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database(tmp_path / "d.duckdb")
    database.reader().execute("CREATE TABLE kv (k VARCHAR PRIMARY KEY, v VARCHAR)")
    return database


def _kv(db: Database) -> list[tuple[str, str]]:
    return db.reader().execute("SELECT k, v FROM kv ORDER BY k").fetchall()


def test_a_deferred_write_goes_with_the_next_statement_and_with_commit(db: Database) -> None:
    with db.transaction(MEMORIES, defers=True) as cur:
        memory_repo.insert_rows(cur, "kv", [{"k": "a", "v": "it's"}])
        assert _kv(db) == []  # not sent: this thread's reader is the transaction's connection
        # The next statement carries it: this read, in the same transaction, sees it.
        assert fetch_one(cur, "SELECT count(*) FROM kv WHERE k = ?", ["a"]) == (1,)
        memory_repo.insert_rows(cur, "kv", [{"k": "b", "v": "x"}, {"k": "c", "v": "y"}])
    assert _kv(db) == [("a", "it's"), ("b", "x"), ("c", "y")]  # the last went with COMMIT


def test_a_transaction_that_does_not_defer_refuses_to(db: Database) -> None:
    with db.transaction(MEMORIES) as cur:
        memory_repo.insert_rows(cur, "kv", [{"k": "a", "v": "1"}])
        # Written at once: this thread's reader is the transaction's own connection.
        assert fetch_one(db.reader(), "SELECT count(*) FROM kv") == (1,)
        with pytest.raises(RuntimeError, match="defer"):
            cur.defer("INSERT INTO kv VALUES ('b', '2')")  # type: ignore[attr-defined]
    assert _kv(db) == [("a", "1")]


@pytest.mark.parametrize("fails_at", ["commit", "next statement"])
def test_a_deferred_write_that_fails_leaves_nothing_and_no_open_transaction(
    db: Database, fails_at: str
) -> None:
    with db.transaction(MEMORIES) as cur:
        cur.execute("INSERT INTO kv VALUES ('a', 'old')")

    def write() -> None:
        with db.transaction(MEMORIES, defers=True) as cur:
            cur.execute("INSERT INTO kv VALUES ('z', 'first')")
            memory_repo.insert_rows(cur, "kv", [{"k": "a", "v": "taken"}])
            if fails_at == "next statement":
                cur.execute("SELECT 1")

    with pytest.raises(duckdb.ConstraintException):
        write()
    assert _kv(db) == [("a", "old")]
    with db.transaction(MEMORIES, defers=True) as cur:  # the writer's cursor works as before
        memory_repo.insert_rows(cur, "kv", [{"k": "b", "v": "new"}])
    assert _kv(db) == [("a", "old"), ("b", "new")]
    db.checkpoint()  # refused while any transaction is open


def test_a_python_error_drops_the_deferred_writes_unsent(db: Database) -> None:

    def write() -> None:
        with db.transaction(MEMORIES, defers=True) as cur:
            memory_repo.insert_rows(cur, "kv", [{"k": "a", "v": "1"}])
            raise ValueError("the body failed")

    with pytest.raises(ValueError, match="the body failed"):
        write()
    assert _kv(db) == []
    db.checkpoint()


def test_a_request_id_taken_since_its_lookup_fails_the_create_with_nothing_written(tmp_path: Path) -> None:
    """The idempotency INSERT is deferred, so the key's violation is raised by COMMIT, naming
    no statement. The create is written again statement by statement; its lookup now finds
    the key (another method's request holds it), so the answer is the one the client's retry
    would get: REQUEST_ID_REUSED, and nothing written by either attempt."""
    db = Database(tmp_path / "d.duckdb")
    writer = CreateWriter(db, CapsConfig(), LiveCounts(), "m", now_ns, group_max_memories=500)
    # Committed by another domain's write, unseen by the lookup (not among the recorded keys).
    db.reader().execute(
        "INSERT INTO idempotency (tenant_id, request_id, method, fingerprint, result, create_time_ns) "
        "VALUES ('t', 'k1', 'Other', 'fp', '{}', 1)"
    )

    def create(key: IdempotencyKey | None) -> CreateWritten:
        return writer.write(
            CreateRequest("t", [MemoryDraft(content="hello", scope=Scope.workspace())], ["memory"], key)
        )

    with pytest.raises(InvalidArgument) as raised:
        create(IdempotencyKey("CreateMemory", "k1", "fp-hello"))
    assert raised.value.reason == "REQUEST_ID_REUSED"
    assert fetch_one(db.reader(), "SELECT count(*) FROM memories") == (0,)
    assert fetch_one(db.reader(), "SELECT count(*) FROM memory_history") == (0,)
    assert not create(None).results[0].deduplicated  # no attempt left a "hello" behind
    db.close()
