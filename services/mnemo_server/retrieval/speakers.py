"""The speakers of a tenant's memories, for Recall's speaker and entity signals: names with
at least `min_count` live memories among those a filter's scopes cover.

Counts are cached per scope, not per filter. StartSession's recall is filtered by the
workspace, the session's own scope and its project or persona, and the session scope is new
every time, so a cache keyed by the whole filter missed on every StartSession and paid a
DuckDB query (~1.9 ms of its ~34 ms of CPU at 100k rows). A scope the index holds no row of
is not asked about: a memory written there in the last moments, before it is indexed, counts
from the next call on, which for a ranking signal is soon enough.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from mnemo_server.index.lance_index import LanceIndex
from mnemo_server.memory.model import Scope
from mnemo_server.store import memory_repo
from mnemo_server.store.database import Database

_MAX_ENTRIES = 10_000


class ScopeSpeakers:
    def __init__(
        self,
        db: Database,
        index: LanceIndex,
        min_count: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.db = db
        self.index = index
        self.min_count = min_count
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        # (tenant, scope or None for the whole tenant) -> (when read, speaker -> memories)
        self._counts: dict[tuple[str, Scope | None], tuple[float, dict[str, int]]] = {}

    def names(self, tenant_id: str, scopes: Sequence[Scope]) -> list[str]:
        """Sorted names; over the whole tenant when no scope is given."""
        if not scopes:
            counts = self._cached(tenant_id, None)
            if counts is None:
                counts = memory_repo.speaker_counts(self.db.reader(), tenant_id)
                self._remember(tenant_id, None, counts)
            return self._enough([counts])
        found: list[dict[str, int]] = []
        asked: list[Scope] = []
        for scope in dict.fromkeys(scopes):
            counts = self._cached(tenant_id, scope)
            if counts is not None:
                found.append(counts)
            elif self.index.scope_rows(tenant_id, scope.key) != 0:
                # A never-indexed scope (a new session's) needs no query; not cached, so
                # rows indexed there later count at once.
                asked.append(scope)
        if asked:
            for scope, counts in memory_repo.speaker_counts_by_scope(
                self.db.reader(), tenant_id, asked
            ).items():
                self._remember(tenant_id, scope, counts)
                found.append(counts)
        return self._enough(found)

    def _cached(self, tenant_id: str, scope: Scope | None) -> dict[str, int] | None:
        with self._lock:
            hit = self._counts.get((tenant_id, scope))
        return hit[1] if hit is not None and self.clock() - hit[0] < self.ttl_s else None

    def _remember(self, tenant_id: str, scope: Scope | None, counts: dict[str, int]) -> None:
        with self._lock:
            if len(self._counts) > _MAX_ENTRIES:
                self._counts.clear()
            self._counts[(tenant_id, scope)] = (self.clock(), counts)

    def _enough(self, counts: Sequence[dict[str, int]]) -> list[str]:
        total: dict[str, int] = {}
        for c in counts:
            for name, n in c.items():
                total[name] = total.get(name, 0) + n
        return sorted(name for name, n in total.items() if n >= self.min_count)
