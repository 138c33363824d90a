"""The DuckDB file: the source of truth.

One process owns the file. Reads run concurrently on per-thread cursors; writes run in a
short explicit transaction (a lone statement may commit by itself: `single_statement`),
never around a model or network call (Signet's rule: fetch and embed outside, then
commit). Writes are serialised per domain (`WriteDomain`): the memories' writes and the
sessions' writes touch different rows, so DuckDB's optimistic concurrency commits them
side by side. Under the bench's mix one lock for all was busy two thirds of the time and
CreateMemory queued behind session writes; with two, CreateMemory's p50 and p99 fell ~20 %.
"""

from __future__ import annotations

import contextlib
import enum
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import duckdb

from mnemo_server.call_trace import mark
from mnemo_server.errors import Aborted, FailedPrecondition
from mnemo_server.store import write_changes
from mnemo_server.store.recent_ids import RecentIds
from mnemo_server.store.row_cache import RowCache, RowPatch
from mnemo_server.store.schema import MIGRATIONS
from mnemo_server.store.stored_summary import StoredSummary


class Cursor(Protocol):
    """What the repositories use of a DuckDB cursor: a reader's (a DuckDBPyConnection) or
    a write transaction's (`TransactionCursor`)."""

    def execute(self, query: str, parameters: object = None) -> duckdb.DuckDBPyConnection: ...

    def executemany(self, query: str, parameters: object = None) -> duckdb.DuckDBPyConnection: ...

    def register(self, view_name: str, python_object: object) -> duckdb.DuckDBPyConnection: ...

    def unregister(self, view_name: str) -> duckdb.DuckDBPyConnection: ...


class ParsedStatements:
    """The SQL texts writers run, parsed once and then executed as DuckDB statements.

    Given a text, DuckDB's Python client lets go of the GIL to parse it and must then wait
    to take it back, behind every busy thread, while the writer holds its domain's lock.
    Counted with a 50 ms switch interval beside one spinning thread (each take-back then
    waits one interval; stop 50's note): an INSERT takes the GIL back 4 times from a text, 3
    from a parsed statement; a COMMIT 3 and 2; BEGIN and an INSERT sent as one text 6, as
    two parsed statements 5. A text with a quote holds literal values (an IN list of ids)
    and differs from call to call: it runs as a text, unparsed and uncached."""

    def __init__(self, capacity: int = 256):
        self._capacity = capacity
        self._parsed: OrderedDict[str, duckdb.Statement] = OrderedDict()
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._parsed.clear()

    def of(self, cur: duckdb.DuckDBPyConnection, query: str) -> duckdb.Statement | str:
        """The parsed statement of a one-statement text, else the text itself."""
        if "'" in query:
            return query
        with self._lock:
            statement = self._parsed.get(query)
            if statement is not None:
                self._parsed.move_to_end(query)
                return statement
        parsed = cur.extract_statements(query)  # a bad text raises here, as executing it would
        if len(parsed) != 1:
            return query
        with self._lock:
            self._parsed[query] = parsed[0]
            while len(self._parsed) > self._capacity:
                self._parsed.popitem(last=False)
        return parsed[0]


_PARSED = ParsedStatements()


class _CursorWrapper:
    """A writer's DuckDB cursor with rules on its statements (subclasses); views pass through."""

    def __init__(self, cur: duckdb.DuckDBPyConnection):
        self._cur = cur

    def register(self, view_name: str, python_object: object) -> duckdb.DuckDBPyConnection:
        return self._cur.register(view_name, python_object)

    def unregister(self, view_name: str) -> duckdb.DuckDBPyConnection:
        return self._cur.unregister(view_name)


_SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_SIZE_UNITS |= {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
# Below this DuckDB cannot even open the store (1MB fails with OutOfMemory, as a traceback).
MIN_MEMORY_LIMIT_BYTES = 16 * 2**20


def _memory_limit_problem(limit: str) -> str:
    """What is wrong with a DuckDB memory_limit setting, or "" (units as DuckDB reads them)."""
    size = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", limit)
    if size is None:
        return "is not a size like '512MB'"
    if float(size.group(1)) * _SIZE_UNITS[size.group(2)] < MIN_MEMORY_LIMIT_BYTES:
        return "is too small for the store: it must be at least 16MiB"
    return ""


def _in_use(path: Path) -> FailedPrecondition:
    return FailedPrecondition(
        f"{path} is in use by another process (is a Mnemo server running on this data directory?)",
        reason="DATA_DIR_LOCKED",
    )


def refuse_if_in_use(path: Path) -> None:
    """DATA_DIR_LOCKED if another process holds the store at `path`, checked before starting
    what runs beside it (`mnemo up` started a second sidecar on a running instance's sidecar
    data, overwriting its log, before its server found the store locked). A read-only open
    is refused while a writer holds the file; any other trouble is the server's to report."""
    if not path.is_file():
        return
    try:
        duckdb.connect(str(path), read_only=True).close()
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            raise _in_use(path) from None


def make_data_dir(path: Path) -> None:
    """Create a data directory (and its parents); a path that cannot be one (a file in the
    way, no permission) is a one-line start-up error naming it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FailedPrecondition(
            f"data directory {path}: {exc.strerror or exc}", reason="BAD_DATA_DIR"
        ) from None


class TransactionCursor(_CursorWrapper):
    """A write transaction's cursor: BEGIN waits for its first statement, so a body that
    runs none makes no call. A text's BEGIN goes in the same call as the statement; a parsed
    statement's just before it, which takes the GIL back once fewer than the text of both
    (ParsedStatements). Under load each call waits for the GIL again when DuckDB gives it
    back: with one thread spinning in Python beside it, BEGIN + ROLLBACK on a DuckDB file
    took 33 ms, and BEGIN, INSERT, COMMIT as three text calls 56 ms against 50 as two (200
    of each, this machine). Settled 100k data, one minute of the mix, three alternating
    pairs, texts, BEGIN with the first statement against an eager BEGIN: 181.4 / 183.4 /
    178.4 operations/s against 179.1 / 173.3 / 175.6, CreateMemory p50 47 / 46 / 46 ms
    against 49 / 51 / 50, the memories lock busy 74-75 % against 75-76 %."""

    def __init__(self, cur: duckdb.DuckDBPyConnection, defers: bool = False):
        super().__init__(cur)
        self.begun = False
        # Writes held back to go in the same call as the next statement (see `defer`).
        self.defers = defers
        self._deferred: list[str] = []

    def defer(self, text: str) -> None:
        """Run the write `text` (its values in the text: sql_literals) in one call with the
        statement after it, or with COMMIT. Under load every call waits for the GIL again,
        several times, while the writer holds its domain's lock: a create's BEGIN + INSERT,
        two more INSERTs and COMMIT took ~35 ms of a ~37 ms hold in four calls at 20k under
        the bench's mix, for ~3 ms of work. An error of a deferred write is raised by the call
        that runs it, so it names no statement: a caller that must tell errors apart writes
        again without deferring (CreateWriter does)."""
        if not self.defers:
            raise RuntimeError("defer: this transaction runs each statement on its own")
        self._deferred.append(text)

    def _with_deferred(self, text: str | None) -> str:
        """`text` behind the deferred writes (and BEGIN, first), as one text to send now."""
        head = [] if self.begun else ["BEGIN TRANSACTION"]
        self.begun = True
        joined = "; ".join([*head, *self._deferred, *([text] if text else [])])
        self._deferred.clear()
        return joined

    def execute(self, query: str, parameters: object = None) -> duckdb.DuckDBPyConnection:
        if self._deferred:
            # Parameters bind to the last statement, the caller's.
            return self._cur.execute(self._with_deferred(query), parameters)
        statement = _PARSED.of(self._cur, query)
        if self.begun:
            return self._cur.execute(statement, parameters)
        self.begun = True
        if isinstance(statement, str):
            # Parameters bind to the last statement, the caller's; DuckDB runs the BEGIN first.
            return self._cur.execute("BEGIN TRANSACTION; " + query, parameters)
        # Parsed, the two take the GIL back fewer times as two calls (ParsedStatements).
        self._cur.execute(_PARSED.of(self._cur, "BEGIN TRANSACTION"))
        return self._cur.execute(statement, parameters)

    def executemany(self, query: str, parameters: object = None) -> duckdb.DuckDBPyConnection:
        if self._deferred:
            self._cur.execute(self._with_deferred(None))
        if not self.begun:
            self._cur.execute("BEGIN TRANSACTION")
            self.begun = True
        return self._cur.executemany(query, parameters)

    def commit(self) -> None:
        if self._deferred:
            try:
                self._cur.execute(self._with_deferred("COMMIT"))
            except BaseException:
                # A deferred write failed, so COMMIT did not run: the transaction is open.
                self.rollback()
                raise
        elif self.begun:  # a body that ran no statement has nothing to commit
            self._cur.execute(_PARSED.of(self._cur, "COMMIT"))

    def rollback(self) -> None:
        self._deferred.clear()  # never sent
        if self.begun:
            # Should the first call have failed before its BEGIN ran, there is nothing to
            # undo. (DuckDB 2.0 runs it even when the statement after it does not parse.)
            with contextlib.suppress(duckdb.TransactionException):
                self._cur.execute(_PARSED.of(self._cur, "ROLLBACK"))


class SingleStatementCursor(_CursorWrapper):
    """The cursor of `Database.single_statement`: it runs one statement and refuses a second,
    which would commit on its own (autocommit), apart from the first."""

    def __init__(self, cur: duckdb.DuckDBPyConnection):
        super().__init__(cur)
        self._ran = False

    def _statement(self) -> duckdb.DuckDBPyConnection:
        if self._ran:
            raise RuntimeError("single_statement: a second statement would commit apart from the first")
        self._ran = True
        return self._cur

    def execute(self, query: str, parameters: object = None) -> duckdb.DuckDBPyConnection:
        cur = self._statement()
        return cur.execute(_PARSED.of(cur, query), parameters)

    def executemany(self, query: str, parameters: object = None) -> duckdb.DuckDBPyConnection:
        return self._statement().executemany(query, parameters)


def deferring(cur: Cursor) -> TransactionCursor | None:
    """`cur` when it is a transaction's that defers writes (TransactionCursor.defer)."""
    return cur if isinstance(cur, TransactionCursor) and cur.defers else None


def fetch_one(cur: Cursor, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
    """The first row of a query, or None. Always reads the whole result: a DuckDB result
    left unread (what fetchone() does, even to a one-row result) keeps its transaction open
    until the cursor runs its next query. On an idle thread's cursor that is forever, and
    one open transaction stops both the WAL checkpoint and the clean-up of old row versions
    for everybody: updates and reads then slow down without bound (the bench's StartSession
    p50 went 0.3 -> 2 s over three minutes)."""
    rows = cur.execute(sql, params).fetchall()
    return rows[0] if rows else None


class WriteDomain(enum.Enum):
    """Which write lock a transaction takes. Writes of different domains touch different
    rows, so DuckDB's optimistic concurrency commits them side by side; writes of one
    domain are serialised, which keeps their read-then-write checks race-free."""

    MEMORIES = "memories"  # memories, their history and index marks, access counts
    SESSIONS = "sessions"  # sessions' ends and deliveries, transcripts, the sidecar outbox
    # New sessions (StartSession's record). Inserting a row no other write can touch before
    # it commits conflicts with none of the above, so it need not queue behind their
    # transactions: under the bench's mix a slow StartSession spent ~19 ms waiting for the
    # sessions lock. Only the retention sweep, which may delete a session id a StartSession
    # is about to take again, holds both.
    SESSION_STARTS = "session_starts"


ALL_DOMAINS = tuple(WriteDomain)


class WriteConflict(Aborted):
    """DuckDB refused a write because a transaction of another domain changed the same row
    or key first (two requests with one request_id for different operations, say). The
    transaction was rolled back whole."""

    default_reason = "WRITE_CONFLICT"


def _is_conflict(exc: duckdb.TransactionException) -> bool:
    # "Conflict on update!", "Conflict on tuple deletion!", and at COMMIT "Failed to commit:
    # PRIMARY KEY or UNIQUE constraint violation" for a key another transaction committed.
    text = str(exc).lower()
    return "conflict" in text or "constraint violation" in text


@dataclass(frozen=True)
class WriteLockStats:
    """How much one domain's write lock is used: writes queue for it, so its busy share and
    the time spent waiting for it explain slow writes under load."""

    transactions: int
    held_s: float
    waited_s: float


class StoredSequence:
    """Numbers past the largest stored in `table.column`, handed out in memory.

    A DuckDB sequence costs a statement of its own in every transaction that takes a number:
    in a lone CreateMemory at 100k rows ~10 % of the transaction (nextval 0.66 ms median
    beside the INSERT's ~1 ms), paid under the memories write lock. Numbers only order rows
    (gaps from rolled-back transactions are harmless) and one process owns the file, so the
    largest stored is read once, when the file is opened, and counted on from there. Callers
    take numbers inside the write transaction that stores them, holding the write lock for
    `table`, so numbers come out in commit order, as with the sequence.
    """

    def __init__(self, first: int):
        self._next = first
        self._lock = threading.Lock()

    @classmethod
    def after_largest(cls, con: Cursor, table: str, column: str) -> StoredSequence:
        row = fetch_one(con, f"SELECT coalesce(max({column}), 0) FROM {table}")
        return cls(int(row[0]) + 1 if row else 1)

    def take(self, n: int) -> list[int]:
        with self._lock:
            first = self._next
            self._next += n
        return list(range(first, first + n))


class Database:
    def __init__(
        self,
        path: Path,
        *,
        read_only: bool = False,
        memory_limit: str = "",
        rows: RowCache | None = None,
        recent: RecentIds | None = None,
    ):
        self.path = path
        # Memory rows and each scope's newest ids for the hot read paths, kept exact by
        # `transaction` (see row_cache, recent_ids).
        self.rows = rows or RowCache(0)
        self.recent = recent or RecentIds(0)
        # Set once DuckDB invalidated the database after a fatal error (seen once in a
        # probe: a checkpoint inside a COMMIT failed). Every statement fails from then on,
        # in this process; `mnemo serve` exits so that a restart replays the WAL.
        self.failed = threading.Event()
        self.failure: BaseException | None = None
        make_data_dir(path.parent)
        try:
            self._conn = duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as exc:
            if "lock" in str(exc).lower():
                raise _in_use(path) from None
            # Not a database (a stray file, a folder of that name), or unreadable.
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise FailedPrecondition(
                f"{path} cannot be opened: {first_line}", reason="BAD_DATA_DIR"
            ) from None
        if memory_limit:
            problem = _memory_limit_problem(memory_limit)
            if problem:
                self._conn.close()
                raise FailedPrecondition(
                    f"storage.duckdb_memory_limit {memory_limit!r} {problem}", reason="BAD_CONFIG"
                )
            self._conn.execute(f"SET memory_limit = '{memory_limit}'")
        self._locks = {d: threading.Lock() for d in WriteDomain}
        self._lock_stats = {d: WriteLockStats(0, 0.0, 0.0) for d in WriteDomain}
        self._stats_lock = threading.Lock()
        self._local = threading.local()
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self._cursors_lock = threading.Lock()
        self._closed = False
        try:
            if not read_only:
                self._migrate()
            # Read-only: nothing takes numbers or stores hashes (the file may predate the table).
            self.memory_seqs = (
                StoredSequence(1)
                if read_only
                else StoredSequence.after_largest(self._conn, "memories", "seq")
            )
            self.stored = StoredSummary.saturated() if read_only else StoredSummary.of_table(self._conn)
        except duckdb.Error as exc:
            # A file cut short past its header opens, then fails its first reads (probe: a
            # traceback from serve, reindex and reembed).
            self._conn.close()
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise FailedPrecondition(f"{path} cannot be read: {first_line}", reason="BAD_DATA_DIR") from None
        except BaseException:  # a failed migration leaves the file at its version, unlocked
            self._conn.close()
            raise

    def _migrate(self) -> None:
        con = self._conn
        has_meta = fetch_one(
            con, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'store_meta'"
        )
        version = 0
        if has_meta and has_meta[0]:
            row = fetch_one(con, "SELECT value FROM store_meta WHERE key = 'schema_version'")
            version = int(row[0]) if row else 0
        if version > len(MIGRATIONS):
            raise FailedPrecondition(
                f"{self.path} has schema version {version}, newer than this server ({len(MIGRATIONS)})",
                reason="SCHEMA_TOO_NEW",
            )
        for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
            con.execute("BEGIN")
            try:
                if isinstance(step, str):
                    con.execute(step)
                else:
                    step(con)
                con.execute("INSERT OR REPLACE INTO store_meta VALUES ('schema_version', ?)", [str(number)])
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise

    def reader(self) -> duckdb.DuckDBPyConnection:
        """This thread's cursor. Reads see the latest committed state."""
        cur: duckdb.DuckDBPyConnection | None = getattr(self._local, "cursor", None)
        if cur is None:
            if self._closed:
                raise FailedPrecondition("the store is closed", reason="STORE_CLOSED")
            cur = self._conn.cursor()
            self._local.cursor = cur
            with self._cursors_lock:
                self._cursors.append(cur)
        return cur

    @contextmanager
    def snapshot(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """This thread's cursor inside one read transaction: every statement of the block
        reads the store as of the same moment (each statement of `reader` is a moment of
        its own). Ended however the block ends: an open transaction would hold back the WAL
        checkpoint and the clean-up of old row versions."""
        cur = self.reader()
        cur.execute("BEGIN TRANSACTION")
        try:
            yield cur
        finally:
            cur.execute("ROLLBACK")  # it read only

    @contextmanager
    def _holding(self, domains: Sequence[WriteDomain]) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for d in ALL_DOMAINS:  # one fixed order, so two callers never deadlock
                if d in domains:
                    stack.enter_context(self._locks[d])
            yield

    @contextmanager
    def _write_locked(self, domains: Sequence[WriteDomain]) -> Iterator[duckdb.DuckDBPyConnection]:
        """The writer's cursor under the domains' locks, with their use counted; a DuckDB
        write conflict in the body becomes WriteConflict."""
        asked = time.perf_counter()
        mark("before_transaction")
        with self._holding(domains):
            got = time.perf_counter()
            mark("write_lock_wait")
            try:
                if self._closed:  # checked under the locks close() takes, so no race with it
                    raise FailedPrecondition("the store is closed", reason="STORE_CLOSED")
                yield self.reader()
            except duckdb.FatalException as exc:
                self.failure = self.failure or exc
                self.failed.set()
                raise
            except duckdb.TransactionException as exc:
                if not _is_conflict(exc):
                    raise
                raise WriteConflict(
                    "a concurrent write changed the same record first; nothing was written, "
                    "so the request can be retried"
                ) from exc
            finally:
                held, waited = time.perf_counter() - got, got - asked
                with self._stats_lock:
                    for d in domains:
                        old = self._lock_stats[d]
                        self._lock_stats[d] = WriteLockStats(
                            old.transactions + 1, old.held_s + held, old.waited_s + waited
                        )

    @contextmanager
    def transaction(self, *domains: WriteDomain, defers: bool = False) -> Iterator[Cursor]:
        """One short write transaction; commits on success, rolls back on any exception.
        It holds the locks of the given domains, all of them when none is named. With
        `defers`, small inserts go in one call with the statement after them
        (TransactionCursor.defer, insert_rows)."""
        held_domains = domains or ALL_DOMAINS
        with self._write_locked(held_domains) as reader:
            cur = TransactionCursor(reader, defers)
            write_changes.begin()
            committed = announced = False
            try:
                try:
                    yield cur
                    self._announce(write_changes.collected(), held_domains)
                    announced = True
                except BaseException:
                    cur.rollback()
                    raise
                cur.commit()  # a COMMIT that fails has ended the transaction itself
                committed = True
                mark("transaction")
            finally:
                # After the transaction ended, before the writer returns (write_changes).
                changes = write_changes.end()
                self.rows.apply(changes, committed=committed, announced=announced)
                if committed:
                    self.recent.apply(changes)

    @contextmanager
    def single_statement(self, domain: WriteDomain) -> Iterator[Cursor]:
        """A write of exactly one statement, under `domain`'s lock: DuckDB commits it by
        itself (autocommit), all or nothing, as a transaction of that statement would, but
        without the BEGIN and COMMIT round trips. For a StartSession's record that is ~0.4 of
        ~2.3 ms of CPU, and two fewer waits for the GIL under load. Only for statements that
        change no memory rows: a repository that records such changes raises here (outside
        `transaction` nothing would keep the row cache in step)."""
        with self._write_locked((domain,)) as cur:
            yield SingleStatementCursor(cur)
            mark("transaction")

    def _announce(self, changes: Sequence[object], held: Sequence[WriteDomain]) -> None:
        """Before COMMIT: rows the row cache patches (row_cache says why only under the
        memories write lock)."""
        if WriteDomain.MEMORIES not in held and any(isinstance(c, RowPatch) for c in changes):
            raise RuntimeError("memory rows patched outside the memories write lock")
        self.rows.announce(changes)

    @property
    def write_lock_stats(self) -> dict[WriteDomain, WriteLockStats]:
        """Totals per domain since this Database was opened; a transaction that holds
        several domains counts in each."""
        with self._stats_lock:
            return dict(self._lock_stats)

    def get_meta(self, key: str) -> str | None:
        row = fetch_one(self.reader(), "SELECT value FROM store_meta WHERE key = ?", [key])
        return None if row is None else str(row[0])

    def set_meta(self, cur: Cursor, key: str, value: str) -> None:
        cur.execute("INSERT OR REPLACE INTO store_meta VALUES (?, ?)", [key, value])

    def delete_meta(self, cur: Cursor, key: str) -> None:
        cur.execute("DELETE FROM store_meta WHERE key = ?", [key])

    def checkpoint(self) -> None:
        with self._holding(ALL_DOMAINS):
            self._conn.execute("CHECKPOINT")

    def close(self) -> None:
        if self._closed:
            return
        with self._holding(ALL_DOMAINS):
            self._closed = True
            # The parsed statements too: kept in a module global, they could outlive DuckDB's
            # bindings at the interpreter's exit, which then report them as leaked (nanobind).
            _PARSED.clear()
            with self._cursors_lock:
                for cur in self._cursors:
                    with contextlib.suppress(duckdb.Error):
                        cur.close()
                self._cursors.clear()
            # A reader on another thread may still be finishing a query: retry briefly.
            for _ in range(100):
                try:
                    self._conn.close()
                    return
                except duckdb.Error:
                    time.sleep(0.05)
            self._conn.close()
