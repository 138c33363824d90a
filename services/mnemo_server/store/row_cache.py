"""Memory rows kept in memory for the hot read paths (Recall's hydration, StartSession's
pool).

Reading a few memories by id from DuckDB costs ~0.4 ms a row at 100k (each row touched
decompresses a vector of every one of its 29 columns) plus ~1 ms a query: 5 of a Recall's
~16 ms of CPU and ~19 of a StartSession's ~43. The rows are cached exactly as DuckDB
returned them (immutable tuples: a caller may change the Memory it decodes from one).

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
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Iterable, Sequence
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
    first; 0 keeps none). `shared_columns` hold strings that repeat across rows."""

    LOG_LENGTH = 1024  # drops remembered for racing fills (a fill older than them is skipped)
    LOG_IDS = 64  # a larger drop is remembered as the whole tenant's (bulk marks stay cheap)

    def __init__(self, max_rows: int, id_column: int = 0, shared_columns: frozenset[int] = frozenset()):
        self.max_rows = max_rows
        self.id_column = id_column
        self._shared = sorted(shared_columns)
        self._rows: dict[tuple[str, str], Row] = {}
        self._lock = threading.Lock()
        self._generation = 0
        self._log: deque[tuple[int, RowChange]] = deque(maxlen=self.LOG_LENGTH)
        self._hits = self._misses = self._skipped = 0

    @property
    def enabled(self) -> bool:
        return self.max_rows > 0

    def generation(self) -> int:
        with self._lock:
            return self._generation

    def lookup(self, tenant_id: str, ids: Sequence[str]) -> tuple[list[Row], list[str]]:
        """The cached rows of these ids, and the ids not cached."""
        found: list[Row] = []
        missing: list[str] = []
        with self._lock:
            for i in ids:
                row = self._rows.get((tenant_id, i))
                if row is None:
                    missing.append(i)
                else:
                    found.append(row)
            self._hits += len(found)
            self._misses += len(missing)
        return found, missing

    def fill(self, tenant_id: str, rows: Sequence[Row], since: int) -> None:
        """Cache rows read from DuckDB by a read that began at generation `since`."""
        if not self.enabled or not rows:
            return
        rows = [self._compact(r) for r in rows]
        with self._lock:
            banned = self._dropped_since(tenant_id, since)
            if banned is None:
                self._skipped += len(rows)
                return
            for row in rows:
                mid = row[self.id_column]
                if mid in banned:
                    self._skipped += 1
                    continue
                self._rows[(tenant_id, mid)] = row
            excess = len(self._rows) - self.max_rows
            if excess > 0:
                # Oldest fills first (dicts keep insertion order); a tenth at once keeps
                # eviction off the per-fill path.
                doomed = [k for k, _ in zip(self._rows, range(excess + self.max_rows // 10), strict=False)]
                for k in doomed:
                    del self._rows[k]

    def _compact(self, row: Row) -> Row:
        # DuckDB returns new string objects per row; tenant, scope, type, category, model
        # names and empty fields repeat across rows (~1.5 KB a bench row, ~1.1 KB interned).
        if not self._shared:
            return row
        values = list(row)
        for i in self._shared:
            if isinstance(values[i], str):
                values[i] = sys.intern(values[i])
        return tuple(values)

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

    def drop(self, changes: Sequence[object]) -> None:
        """Forget changed rows; runs after the transaction that changed them ended."""
        row_changes = [c for c in changes if isinstance(c, RowChange)]
        if not row_changes:
            return
        with self._lock:
            for change in row_changes:
                self._generation += 1
                tenant, ids = change.tenant_id, change.ids
                big = ids is not None and len(ids) > self.LOG_IDS
                self._log.append((self._generation, RowChange(tenant, None) if big else change))
                if tenant is None or ids is None:
                    for key in [k for k in self._rows if tenant in (None, k[0])]:
                        del self._rows[key]
                else:
                    for i in ids:
                        self._rows.pop((tenant, i), None)

    def stats(self) -> RowCacheStats:
        with self._lock:
            return RowCacheStats(len(self._rows), self._hits, self._misses, self._skipped)
