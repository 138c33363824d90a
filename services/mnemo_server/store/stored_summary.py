"""What the write path records about the stored memories (and request ids) so that reads
can skip DuckDB queries that would find nothing.

Every part only grows, and each is added to inside the write transaction, before COMMIT,
so a reader that sees a committed row also sees it summarised: a false "may" costs only the
query, a false "never" would lose a row, and is never given. Rebuilt from the table when the
store is opened (deleted rows included: cheaper than telling them apart, and harmless).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import duckdb

from mnemo_server.memory.model import Memory
from mnemo_server.store.hash_filter import ContentHashFilter, join_key
from mnemo_server.store.recent_ids import ScopeKey, scope_key


class PinnedTenants:
    """Tenants that may hold pinned memories. Every StartSession asks for the pinned
    memories of its scopes (~1.3 ms of DuckDB at 100k rows, whatever the answer), and most
    tenants never pin one; for those the query is skipped."""

    def __init__(self, *, saturated: bool = False):
        self._tenants: set[str] = set()
        # Saturated: "may hold" for every tenant (a read-only store keeps no summary).
        self._saturated = saturated

    @classmethod
    def of_table(cls, con: duckdb.DuckDBPyConnection) -> PinnedTenants:
        found = cls()
        cur = con.cursor()
        try:
            found.add(
                r[0] for r in cur.execute("SELECT DISTINCT tenant_id FROM memories WHERE pinned").fetchall()
            )
        finally:
            cur.close()
        return found

    def add(self, tenant_ids: Iterable[str]) -> None:
        # set.update under the GIL: a concurrent may_hold sees the set before or after.
        self._tenants.update(tenant_ids)

    def may_hold(self, tenant_id: str) -> bool:
        return self._saturated or tenant_id in self._tenants


class _KeyFilter:
    """A Bloom filter (the content hashes' kind, 2 MiB; a false "may" costs a query) of
    string tuples, filled at start-up from the rows `TABLE_SQL` reads."""

    TABLE_SQL: ClassVar[str]

    def __init__(self, *, saturated: bool = False, built: ContentHashFilter | None = None):
        self._filter = built if built is not None else ContentHashFilter(saturated=saturated)

    @classmethod
    def of_table(cls, con: duckdb.DuckDBPyConnection) -> Self:
        return cls(built=ContentHashFilter.of_query(con, cls.TABLE_SQL))

    def _add(self, keys: Iterable[Sequence[str]]) -> None:
        self._filter.add(join_key(k) for k in keys)

    def _may_hold(self, key: Sequence[str]) -> bool:
        return self._filter.may_contain(join_key(key))


class WrittenScopes(_KeyFilter):
    """Scopes that may hold rows. Every StartSession lists the newest memories of its
    scopes, one of which is the new session's own, almost always empty: with it known empty
    the others are answered from memory (`recent_ids`) without a query."""

    TABLE_SQL = "SELECT DISTINCT tenant_id, scope_kind, scope_id FROM memories"

    def add(self, keys: Iterable[ScopeKey]) -> None:
        self._add(keys)

    def may_hold(self, key: ScopeKey) -> bool:
        return self._may_hold(key)


class RecordedRequests(_KeyFilter):
    """(tenant, request_id) pairs that may have a record in `idempotency`. Every write with a
    request_id (the shipped clients send one with each write) looks its id up there first,
    under its domain's write lock, and almost every id is new: the filter answers those
    without the query. On settled 100k data, one minute of the bench's mix with its creates
    and ends keyed, two alternating pairs: the memories lock busy 75-77 % of the time
    instead of 81-82 %, CreateMemory p50/p99 51/125-129 ms instead of 62-65/148-154,
    EndSession p99 104-109 instead of 121-135, 173 operations/s instead of 165.

    Records purged after `retention.idempotency_hours` stay in the filter, so the share of
    false "may" answers (each one costs only the query) grows with the ids recorded since
    the store was opened: ~0.01 % at 100k, ~1.3 % at 1M, ~7 % at 2.6M (a day of 30 keyed
    writes a second)."""

    TABLE_SQL = "SELECT tenant_id, request_id FROM idempotency"

    def add(self, tenant_id: str, request_id: str) -> None:
        self._add([(tenant_id, request_id)])

    def may_hold(self, tenant_id: str, request_id: str) -> bool:
        return self._may_hold((tenant_id, request_id))


@dataclass(frozen=True)
class StoredSummary:
    hashes: ContentHashFilter = field(default_factory=ContentHashFilter)
    pinned_tenants: PinnedTenants = field(default_factory=PinnedTenants)
    scopes: WrittenScopes = field(default_factory=WrittenScopes)
    requests: RecordedRequests = field(default_factory=RecordedRequests)

    @classmethod
    def of_table(cls, con: duckdb.DuckDBPyConnection) -> StoredSummary:
        return cls(
            ContentHashFilter.of_table(con),
            PinnedTenants.of_table(con),
            WrittenScopes.of_table(con),
            RecordedRequests.of_table(con),
        )

    @classmethod
    def saturated(cls) -> StoredSummary:
        return cls(
            ContentHashFilter(saturated=True),
            PinnedTenants(saturated=True),
            WrittenScopes(saturated=True),
            RecordedRequests(saturated=True),
        )

    def inserting(self, memories: Iterable[Memory]) -> None:
        """Rows about to be inserted (call inside their transaction)."""
        rows = list(memories)
        self.hashes.add(m.content_hash for m in rows)
        self.pinned_tenants.add(m.tenant_id for m in rows if m.pinned)
        self.scopes.add(scope_key(m.tenant_id, m.scope) for m in rows)

    def updating(self, tenant_id: str, changes: Mapping[str, Any]) -> None:
        """A row of this tenant about to take these column values (inside the transaction)."""
        if "content_hash" in changes:
            self.hashes.add([changes["content_hash"]])
        if changes.get("pinned"):
            self.pinned_tenants.add([tenant_id])
