"""What the write path records about the stored memories so that reads can skip DuckDB
queries that would find nothing.

Every part only grows, and each is added to inside the write transaction, before COMMIT,
so a reader that sees a committed row also sees it summarised: a false "may" costs only the
query, a false "never" would lose a row, and is never given. Rebuilt from the table when the
store is opened (deleted rows included: cheaper than telling them apart, and harmless).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import duckdb

from mnemo_server.memory.model import Memory
from mnemo_server.store.hash_filter import ContentHashFilter
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


class WrittenScopes:
    """Scopes that may hold rows. Every StartSession lists the newest memories of its
    scopes, one of which is the new session's own, almost always empty: with it known empty
    the others are answered from memory (`recent_ids`) without a query. A Bloom filter like
    the content hashes' (2 MiB; a false "may" costs a query)."""

    def __init__(self, *, saturated: bool = False):
        self._filter = ContentHashFilter(saturated=saturated)

    @classmethod
    def of_table(cls, con: duckdb.DuckDBPyConnection) -> WrittenScopes:
        found = cls()
        cur = con.cursor()
        try:
            cur.execute("SELECT DISTINCT tenant_id, scope_kind, scope_id FROM memories")
            while batch := cur.fetchmany(20_000):
                found.add((t, k, i) for t, k, i in batch)
        finally:
            cur.close()
        return found

    def add(self, keys: Iterable[ScopeKey]) -> None:
        self._filter.add("\x1f".join(k) for k in keys)

    def may_hold(self, key: ScopeKey) -> bool:
        return self._filter.may_contain("\x1f".join(key))


@dataclass(frozen=True)
class StoredSummary:
    hashes: ContentHashFilter = field(default_factory=ContentHashFilter)
    pinned_tenants: PinnedTenants = field(default_factory=PinnedTenants)
    scopes: WrittenScopes = field(default_factory=WrittenScopes)

    @classmethod
    def of_table(cls, con: duckdb.DuckDBPyConnection) -> StoredSummary:
        return cls(ContentHashFilter.of_table(con), PinnedTenants.of_table(con), WrittenScopes.of_table(con))

    @classmethod
    def saturated(cls) -> StoredSummary:
        return cls(
            ContentHashFilter(saturated=True), PinnedTenants(saturated=True), WrittenScopes(saturated=True)
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
