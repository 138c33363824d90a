"""What the write path records about the stored memories so that reads can skip DuckDB
queries that would find nothing.

Both parts only grow, and both are added to inside the write transaction, before COMMIT,
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


@dataclass(frozen=True)
class StoredSummary:
    hashes: ContentHashFilter = field(default_factory=ContentHashFilter)
    pinned_tenants: PinnedTenants = field(default_factory=PinnedTenants)

    @classmethod
    def of_table(cls, con: duckdb.DuckDBPyConnection) -> StoredSummary:
        return cls(ContentHashFilter.of_table(con), PinnedTenants.of_table(con))

    @classmethod
    def saturated(cls) -> StoredSummary:
        return cls(ContentHashFilter(saturated=True), PinnedTenants(saturated=True))

    def inserting(self, memories: Iterable[Memory]) -> None:
        """Rows about to be inserted (call inside their transaction)."""
        rows = list(memories)
        self.hashes.add(m.content_hash for m in rows)
        self.pinned_tenants.add(m.tenant_id for m in rows if m.pinned)

    def updating(self, tenant_id: str, changes: Mapping[str, Any]) -> None:
        """A row of this tenant about to take these column values (inside the transaction)."""
        if "content_hash" in changes:
            self.hashes.add([changes["content_hash"]])
        if changes.get("pinned"):
            self.pinned_tenants.add([tenant_id])
