"""Live memories per (tenant, scope, type), for the per-type caps.

Counting on every insert costs a scan (about 1 ms at 100k memories) inside the write lock.
All writes of memories run in this process under the memories domain's lock (store-wide
writes hold it too), so a cache kept in step by the writers is exact; it is changed only
inside write transactions and dropped for a tenant if one fails."""

from __future__ import annotations

from collections.abc import Callable

from mnemo_server.memory.model import MemoryType, Scope

Key = tuple[str, str, MemoryType]


class LiveCounts:
    def __init__(self) -> None:
        self._counts: dict[Key, int] = {}

    @staticmethod
    def key(tenant_id: str, scope: Scope, mtype: MemoryType) -> Key:
        return (tenant_id, scope.key, mtype)

    def after_insert(self, key: Key, inserted: int, count_now: Callable[[], int]) -> int:
        """The count including `inserted` rows just written in this transaction."""
        if key in self._counts:
            self._counts[key] += inserted
        else:
            self._counts[key] = count_now()
        return self._counts[key]

    def removed(self, key: Key, n: int) -> None:
        if key in self._counts:
            self._counts[key] -= n

    def forget(self, tenant_id: str) -> None:
        for key in [k for k in self._counts if k[0] == tenant_id]:
            del self._counts[key]
