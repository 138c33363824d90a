"""Memory rows kept in memory for the hot read paths (Recall's hydration, StartSession's
pool).

Reading a few memories by id from DuckDB costs ~0.4 ms a row at 100k (each row touched
decompresses a vector of every one of its 29 columns) plus ~1 ms a query: 5 of a Recall's
~16 ms of CPU and ~19 of a StartSession's ~43. The rows are cached as DuckDB returned
them, packed into bytes (a caller may change the Memory it decodes from one; 100k bench
rows take ~60 MB, where 50k took ~48 as tuples).

DuckDB stays the source of truth, and a cached row must never outlive a change to it:
- Every statement that changes memory rows says which (`rows_changed`, called by the
  repositories inside the transaction, collected by `write_changes`); `Database.transaction`
  drops those rows from the cache after COMMIT (or ROLLBACK), before the writer returns.
  A read that starts after a write was acknowledged therefore never sees the old row.
- A reader that missed takes `generation()` before it reads DuckDB and fills with it: rows
  dropped after that point are not put back (the read may have seen them before the
  change). Drops are logged by generation; when the log no longer reaches back that far,
  the fill is skipped.
Writes outside `Database.transaction` (schema migrations, before any read) bypass it; a
change recorded outside a transaction is a bug and raises.

Some writes change a row by a rule the cache can apply itself (`rows_patched`: the access
counts StartSession adds, the index worker's marks). Dropping those rows cost the hot rows:
under the bench's mix on settled 100k data the access counts caused ~80 % of the cache's
misses and the index marks ~14 % (5 % of the row reads missed; patched, 1 %), and the
server spent ~7 % more CPU per operation. So their cached rows are patched instead. That
keeps the guarantee as long as no fill can slip between the commit and the patch, or put
in a row that already holds the change:
- `announce` (before COMMIT) marks the rows as changing: fills of them are skipped until
  `apply` (after COMMIT) has patched the cached rows, so a row read after the commit is
  never patched a second time; `apply` then logs the change like a drop, so a fill of a
  read that began before it is skipped too;
- a patch runs under the memories write lock (`Database.transaction` checks), so patches and
  drops of one row are applied in commit order, each to the row as the previous left it;
- after a ROLLBACK the cached rows are left as they were (DuckDB's are too).
"""

from __future__ import annotations

import marshal
import operator
import sys
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mnemo_server.store import write_changes

Row = tuple[Any, ...]


@dataclass(frozen=True)
class RowChange:
    tenant_id: str | None  # None: every tenant (then ids is None too)
    ids: frozenset[str] | None  # None: every row of the tenant(s)


def rows_changed(tenant_id: str, ids: Iterable[str] | None) -> None:
    """Record that the open transaction on this thread changes these memory rows of a
    tenant (`ids` None: any of its rows)."""
    write_changes.record(RowChange(tenant_id, None if ids is None else frozenset(ids)))


@dataclass(frozen=True)
class RowPatch:
    """These rows of a tenant change by `apply` (a pure function of the row as DuckDB
    returns it, doing what the statement does to it): cached rows are patched, not dropped."""

    tenant_id: str
    ids: frozenset[str]
    apply: Callable[[Row], Row]


def rows_patched(tenant_id: str, ids: Iterable[str], apply: Callable[[Row], Row]) -> None:
    """Record that the open transaction changes these rows of a tenant by `apply`."""
    write_changes.record(RowPatch(tenant_id, frozenset(ids), apply))


@dataclass(frozen=True)
class RowsWritten:
    """New rows of a tenant as the transaction wrote them (as DuckDB reads them back):
    cached once it commits; with `only_into_room`, only if the cache holds them all without
    evicting a row."""

    tenant_id: str
    rows: tuple[Row, ...]
    only_into_room: bool = False


def rows_written(tenant_id: str, rows: Sequence[Row], *, only_into_room: bool = False) -> None:
    """Record that the open transaction inserts these rows (as DuckDB reads them back)."""
    write_changes.record(RowsWritten(tenant_id, tuple(rows), only_into_room))


def all_rows_changed() -> None:
    """Record that the open transaction changes rows of every tenant."""
    write_changes.record(RowChange(None, None))


@dataclass(frozen=True)
class RowCacheStats:
    rows: int
    hits: int
    misses: int
    fills_skipped: int


class RowCache:
    """Rows by (tenant, the row's `id_column`), at most `max_rows` (oldest fill evicted
    first; 0 keeps none). `shared_columns` have few distinct values across rows.

    A row is kept packed (see `_Packing`): ~0.6 KB a bench row where the tuple DuckDB
    returns, its strings interned, took ~0.95 KB; unpacking one costs ~1.7 us, where a miss
    of a few rows costs ~2-3 ms of CPU at 100k."""

    LOG_LENGTH = 1024  # drops remembered for racing fills (a fill older than them is skipped)
    LOG_IDS = 64  # a larger drop is remembered as the whole tenant's (bulk marks stay cheap)

    def __init__(self, max_rows: int, id_column: int = 0, shared_columns: frozenset[int] = frozenset()):
        self.max_rows = max_rows
        self.id_column = id_column
        self._packing: _Packing | None = None  # made with the first row (its width)
        self._shared = shared_columns
        self._rows: dict[str, bytes] = {}  # _key(tenant, id) -> packed row
        self._lock = threading.Lock()
        self._generation = 0
        self._log: deque[tuple[int, RowChange]] = deque(maxlen=self.LOG_LENGTH)
        # Keys of rows a committing transaction patches: not filled until it has (announce).
        self._patching: Counter[str] = Counter()
        self._hits = self._misses = self._skipped = 0

    @property
    def enabled(self) -> bool:
        return self.max_rows > 0

    def generation(self) -> int:
        with self._lock:
            return self._generation

    def lookup(self, tenant_id: str, ids: Sequence[str]) -> tuple[list[Row], list[str]]:
        """The cached rows of these ids, and the ids not cached."""
        hits: list[tuple[str, bytes]] = []
        missing: list[str] = []
        with self._lock:
            for i in ids:
                packed = self._rows.get(_key(tenant_id, i))
                if packed is None:
                    missing.append(i)
                else:
                    hits.append((i, packed))
            self._hits += len(hits)
            self._misses += len(missing)
            packing = self._packing
        found = [] if packing is None else [packing.unpack(i, packed) for i, packed in hits]
        return found, missing

    def fill(self, tenant_id: str, rows: Sequence[Row], since: int) -> None:
        """Cache rows read from DuckDB by a read that began at generation `since`."""
        if not self.enabled or not rows:
            return
        with self._lock:
            packing = self._packing_for(rows[0])
        packed = [(row[self.id_column], packing.pack(row)) for row in rows]  # outside the lock
        with self._lock:
            banned = self._dropped_since(tenant_id, since)
            if banned is None:
                self._skipped += len(rows)
                return
            patching = self._patching
            for mid, value in packed:
                if value is None or mid in banned or (patching and _key(tenant_id, mid) in patching):
                    self._skipped += 1
                    continue
                self._rows[_key(tenant_id, mid)] = value
            self._evict()

    def _packing_for(self, row: Row) -> _Packing:
        """The packing of this cache's rows, made from the first row cached. Under the lock."""
        if self._packing is None:
            self._packing = _Packing(len(row), self.id_column, self._shared)
        return self._packing

    def _evict(self) -> None:
        """Past max_rows, the oldest fills go first (dicts keep insertion order); a tenth at
        once keeps eviction off the per-fill path. Under the lock."""
        excess = len(self._rows) - self.max_rows
        if excess > 0:
            doomed = [k for k, _ in zip(self._rows, range(excess + self.max_rows // 10), strict=False)]
            for k in doomed:
                del self._rows[k]

    def _dropped_since(self, tenant_id: str, since: int) -> set[str] | None:
        """Ids of the tenant dropped after generation `since`; None when that is unknown
        (the log does not reach back) or when the whole tenant was dropped."""
        if self._generation == since:
            return set()
        if not self._log or self._log[0][0] > since + 1:
            return None
        banned: set[str] = set()
        for gen, change in self._log:
            if gen <= since or change.tenant_id not in (None, tenant_id):
                continue
            if change.ids is None:
                return None
            banned |= change.ids
        return banned

    def _logged(self, change: RowChange) -> None:
        """A change from here on: fills of reads that began before it skip its rows."""
        self._generation += 1
        big = change.ids is not None and len(change.ids) > self.LOG_IDS
        self._log.append((self._generation, RowChange(change.tenant_id, None) if big else change))

    def announce(self, changes: Sequence[object]) -> None:
        """Before COMMIT: the patched rows are changing, so nothing fills them until `apply`."""
        with self._lock:
            for change in changes:
                if isinstance(change, RowPatch):
                    self._patching.update(_key(change.tenant_id, i) for i in change.ids)

    def apply(self, changes: Sequence[object], *, committed: bool, announced: bool) -> None:
        """After the transaction ended: forget changed rows and, if it committed, patch the
        patched ones (`announced`: `announce` saw these changes)."""
        if not any(isinstance(c, RowChange | RowPatch | RowsWritten) for c in changes):
            return
        with self._lock:
            for change in changes:
                if isinstance(change, RowChange):
                    self._forget(change)
                elif isinstance(change, RowsWritten):
                    if (
                        committed
                        and self.enabled
                        and (not change.only_into_room or self._room_for(change.rows))
                    ):
                        self._put(change.tenant_id, change.rows)
                elif isinstance(change, RowPatch):
                    if committed:
                        self._patch(change)
                    self._logged(RowChange(change.tenant_id, change.ids))
                    if announced:
                        keys = [_key(change.tenant_id, i) for i in change.ids]
                        self._patching.subtract(keys)
                        for k in keys:
                            if self._patching[k] <= 0:
                                del self._patching[k]

    def _room_for(self, rows: Sequence[Row]) -> bool:
        """Whether the rows fit without evicting any (under the lock)."""
        return len(self._rows) + len(rows) <= self.max_rows

    def _put(self, tenant_id: str, rows: Sequence[Row]) -> None:
        """Rows just committed, under the memories write lock: nothing that changed them
        since can have been applied yet, and a fill racing this one brings the same rows."""
        if not rows:
            return
        packing = self._packing_for(rows[0])
        for row in rows:
            packed = packing.pack(row)
            if packed is not None:
                self._rows[_key(tenant_id, row[self.id_column])] = packed
        self._evict()

    def _patch(self, change: RowPatch) -> None:
        packing = self._packing
        for mid in change.ids:
            key = _key(change.tenant_id, mid)
            packed = self._rows.get(key)
            if packed is None or packing is None:
                continue
            try:
                repacked = packing.pack(change.apply(packing.unpack(mid, packed)))
            except Exception:  # a rule that cannot be applied: the row is read again instead
                repacked = None
            if repacked is None:
                del self._rows[key]
            else:
                self._rows[key] = repacked

    def drop(self, changes: Sequence[RowChange]) -> None:
        """Forget changed rows (a transaction's are handled by `announce` and `apply`)."""
        with self._lock:
            for change in changes:
                self._forget(change)

    def _forget(self, change: RowChange) -> None:
        self._logged(change)
        tenant, ids = change.tenant_id, change.ids
        if tenant is None:
            self._rows.clear()
        elif ids is None:
            prefix = _key(tenant, "")
            for key in [k for k in self._rows if k.startswith(prefix)]:
                del self._rows[key]
        else:
            for i in ids:
                self._rows.pop(_key(tenant, i), None)

    def stats(self) -> RowCacheStats:
        with self._lock:
            return RowCacheStats(len(self._rows), self._hits, self._misses, self._skipped)


def _key(tenant_id: str, mid: str) -> str:
    # One string, not a (tenant, id) tuple: ~60 bytes a row less. Tenant ids hold no NUL.
    return f"{tenant_id}\0{mid}"


class _Packing:
    """How a row is packed: `marshal` of its columns but the id (the key has it) and the
    shared ones, which are replaced by the number of their combination (a bench row's eight
    repeat across all rows). Combinations are numbered up to MAX_COMBINATIONS; a row with a
    new one past that carries its shared values itself, so numbers are never reused and a
    packed row never changes meaning. A row marshal cannot write (no such column type today),
    or one packed past MAX_PACKED_BYTES, is not cached."""

    MAX_COMBINATIONS = 4096
    # A row packed larger is not cached (read from DuckDB each time): the cache is bounded by
    # rows, and a tenant's memories of 20,000 characters took it, and the server, ~1.6 GB
    # past its size for 4,000 rows (fairness probe); this keeps it under ~470 MiB at the
    # default 120,000 rows, where typical rows pack to ~0.6 KB.
    MAX_PACKED_BYTES = 4096

    def __init__(self, width: int, id_column: int, shared: frozenset[int]):
        self.width = width
        self._shared = [i for i in sorted(shared) if i < width]
        self._own = [i for i in range(width) if i != id_column and i not in shared]
        # Where each column of a row is in (id, *shared values, *own values).
        at = {id_column: 0}
        at.update({c: 1 + n for n, c in enumerate(self._shared)})
        at.update({c: 1 + len(self._shared) + n for n, c in enumerate(self._own)})
        order = [at[c] for c in range(width)]
        self._assemble: Callable[[Row], Row] = operator.itemgetter(*order) if width > 1 else lambda t: (t[0],)
        self._combinations: list[tuple[Any, ...]] = []
        self._numbers: dict[tuple[Any, ...], int] = {}
        self._lock = threading.Lock()  # numbers new combinations (rare)

    def pack(self, row: Row) -> bytes | None:
        if len(row) != self.width:
            return None
        shared = tuple(row[i] for i in self._shared)
        number = self._numbers.get(shared)
        if number is None and len(self._combinations) < self.MAX_COMBINATIONS:
            with self._lock:
                number = self._numbers.get(shared)
                if number is None and len(self._combinations) < self.MAX_COMBINATIONS:
                    # Listed before it is numbered: an unpack never meets a number not listed.
                    self._combinations.append(tuple(sys.intern(v) if type(v) is str else v for v in shared))
                    number = self._numbers[shared] = len(self._combinations) - 1
        own = tuple(row[i] for i in self._own)
        try:
            packed = marshal.dumps((own, shared if number is None else number))
        except ValueError:
            return None
        return packed if len(packed) <= self.MAX_PACKED_BYTES else None

    def unpack(self, mid: str, packed: bytes) -> Row:
        own, shared = marshal.loads(packed)
        if type(shared) is int:
            shared = self._combinations[shared]
        row: Row = self._assemble((mid, *shared, *own))
        return row
