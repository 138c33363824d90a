"""The newest live memories of each scope, kept in memory for StartSession's "recent"
candidates and ListMemories' first page by scope.

Every StartSession asked DuckDB for the newest memories of its scopes: ~1.65 ms at 100k
rows even with no filter at all, because the cost is DuckDB's top-N over the table (neither
a window on `seq` nor an index on it shortened it). Here each scope read so far keeps the
ids and sequence numbers of its newest live rows, up to `depth`; a StartSession's scopes are
answered from those lists, and a scope that never held a row (a new session's own scope) is
known empty from the stored summary's scope filter without a query.

A list must never leave out a live row that belongs in it:
- The repositories record, inside the write transaction, the live rows they insert
  (`rows_added`), the rows they delete or tombstone (`rows_gone`) and any row that comes
  back to life (`rows_revived`); `Database.transaction` applies them after COMMIT, before
  the writer returns, so a read that starts after a write was acknowledged sees it. A
  rolled-back transaction's changes are not applied.
- Removing a row from a list leaves the others exact (they are still the newest live rows,
  one fewer); a list that holds fewer than asked and not the whole scope is filled again
  from DuckDB. A revived row may belong anywhere, so its tenant's lists are dropped.
- A reader that missed takes the tenant's `generation()` before its query and fills with
  it; if any change of that tenant was applied meanwhile the fill is skipped (its rows may
  predate the change), and the next reader queries again.
Rows are read through the row cache afterwards and checked once more (live, in the asked
scopes); the caller falls back to DuckDB's own query if one is not.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mnemo_server.memory.model import Memory, Scope
from mnemo_server.store.write_changes import record

ScopeKey = tuple[str, str, str]  # tenant, scope kind, scope id


def scope_key(tenant_id: str, scope: Scope) -> ScopeKey:
    return (tenant_id, scope.kind.value, scope.id)


@dataclass(frozen=True)
class RowsAdded:
    rows: tuple[tuple[ScopeKey, int, str], ...]  # (scope, seq, id) of live rows inserted


@dataclass(frozen=True)
class RowsGone:
    tenant_id: str
    ids: frozenset[str]


@dataclass(frozen=True)
class RowsRevived:
    tenant_id: str


def rows_added(memories: Iterable[Memory]) -> None:
    """Rows the open transaction inserts (deleted ones, as an import may carry, are skipped)."""
    rows = tuple((scope_key(m.tenant_id, m.scope), m.seq, m.id) for m in memories if not m.deleted)
    if rows:
        record(RowsAdded(rows))


def rows_gone(tenant_id: str, ids: Iterable[str]) -> None:
    """Rows the open transaction deletes or tombstones."""
    record(RowsGone(tenant_id, frozenset(ids)))


def rows_revived(tenant_id: str) -> None:
    """A deleted row of this tenant becomes live again in the open transaction."""
    record(RowsRevived(tenant_id))


@dataclass
class _Newest:
    entries: list[tuple[int, str]]  # (-seq, id): newest first, sorted for bisect
    complete: bool  # every live row of the scope is listed
    ids: set[str]  # the listed ids, so a delete finds the lists it touches without a scan

    @classmethod
    def of(cls, entries: list[tuple[int, str]], complete: bool) -> _Newest:
        return cls(entries, complete, {i for _, i in entries})

    def remove(self, gone: frozenset[str]) -> None:
        if not self.ids.isdisjoint(gone):
            self.entries = [e for e in self.entries if e[1] not in gone]
            self.ids -= gone


@dataclass(frozen=True)
class RecentIdsStats:
    scopes: int
    hits: int
    misses: int
    fills_skipped: int


class RecentIds:
    """Newest live ids by scope, at most `depth` a scope and `max_scopes` scopes (the oldest
    filled is dropped first; ~6 KB a scope at depth 32); depth 0 keeps none (every read goes
    to DuckDB)."""

    def __init__(self, depth: int, max_scopes: int = 1024):
        self.depth = depth
        self.max_scopes = max_scopes
        self._lists: dict[ScopeKey, _Newest] = {}
        self._generations: dict[str, int] = {}
        self._lock = threading.Lock()
        self._hits = self._misses = self._skipped = 0

    @property
    def enabled(self) -> bool:
        return self.depth > 0

    def generation(self, tenant_id: str) -> int:
        with self._lock:
            return self._generations.get(tenant_id, 0)

    def newest(self, keys: Sequence[ScopeKey], limit: int) -> tuple[list[str], list[ScopeKey]]:
        """The `limit` newest live ids across these scopes, newest first, and the scopes
        whose lists are missing or too short to say (then the ids are not the answer)."""
        found: list[tuple[int, str]] = []
        missing: list[ScopeKey] = []
        with self._lock:
            for key in keys:
                listed = self._lists.get(key)
                if listed is None or (len(listed.entries) < limit and not listed.complete):
                    missing.append(key)
                else:
                    found.extend(listed.entries[:limit])
        found.sort()
        return [i for _, i in found[:limit]], missing

    def count(self, *, answered: bool) -> None:
        """One read served: from the lists alone, or with a query of DuckDB."""
        with self._lock:
            if answered:
                self._hits += 1
            else:
                self._misses += 1

    def fill(self, key: ScopeKey, newest: Sequence[tuple[int, str]], since: int) -> None:
        """Keep a scope's newest (seq, id) rows, read from DuckDB (at most `depth`, newest
        first) by a read that began at generation `since` of the scope's tenant."""
        if not self.enabled:
            return
        entries = sorted((-seq, i) for seq, i in newest[: self.depth])
        with self._lock:
            if self._generations.get(key[0], 0) != since:
                self._skipped += 1
                return
            self._lists.pop(key, None)  # re-inserted last: the newest fill is evicted last
            self._lists[key] = _Newest.of(entries, complete=len(newest) < self.depth)
            while len(self._lists) > self.max_scopes:
                del self._lists[next(iter(self._lists))]

    def apply(self, changes: Sequence[object]) -> None:
        """Apply a transaction's changes; runs after it committed, before the writer returns."""
        mine = [c for c in changes if isinstance(c, RowsAdded | RowsGone | RowsRevived)]
        if not mine:
            return
        with self._lock:
            for change in mine:
                if isinstance(change, RowsAdded):
                    for key, seq, memory_id in change.rows:
                        self._bump(key[0])
                        self._add(key, seq, memory_id)
                elif isinstance(change, RowsGone):
                    self._bump(change.tenant_id)
                    for key, listed in self._lists.items():
                        if key[0] == change.tenant_id:
                            listed.remove(change.ids)
                else:
                    self._bump(change.tenant_id)
                    for key in [k for k in self._lists if k[0] == change.tenant_id]:
                        del self._lists[key]

    def _bump(self, tenant_id: str) -> None:
        self._generations[tenant_id] = self._generations.get(tenant_id, 0) + 1

    def _add(self, key: ScopeKey, seq: int, memory_id: str) -> None:
        listed = self._lists.get(key)
        if listed is None:
            return  # not read yet: its first reader fills it from DuckDB
        entry = (-seq, memory_id)
        at = bisect.bisect_left(listed.entries, entry)
        if at < len(listed.entries) and listed.entries[at] == entry:
            return  # a fill that raced this insert already read it
        if at == len(listed.entries) and not listed.complete:
            return  # older than every listed row, and what follows them is not known
        listed.entries.insert(at, entry)
        listed.ids.add(memory_id)
        if len(listed.entries) > self.depth:
            listed.ids.discard(listed.entries.pop()[1])
            listed.complete = False

    def stats(self) -> RecentIdsStats:
        with self._lock:
            return RecentIdsStats(len(self._lists), self._hits, self._misses, self._skipped)
