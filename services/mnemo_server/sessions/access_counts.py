"""StartSession's injections counted as accesses, written in batches.

Why batches: written by every StartSession, the counts were a second transaction under the
memories domain's lock per call, about a third of that lock's transactions under the bench
mix, where a hold lasts ~20 ms at C = 8 and CreateMemory waits behind it; each one also
dropped the injected rows from the row cache just before the next session read them. One
transaction per interval now carries every session's counts.

The cost, stated: a count reaches the table up to one interval late (it is a ranker feature,
read at the next StartSession), and a kill -9 loses the counts not yet written. The session
itself, what it injected and at which rank, is committed before StartSession answers."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from mnemo_server.store import session_repo
from mnemo_server.store.database import Database, WriteDomain


class AccessCounts:
    def __init__(self, db: Database):
        self.db = db
        self._lock = threading.Lock()
        # (tenant_id, memory id) -> [injections, time of the latest]
        self._pending: dict[tuple[str, str], list[int]] = {}
        self.written = 0

    def record(self, tenant_id: str, ids: Iterable[str], now_ns: int) -> None:
        with self._lock:
            for memory_id in ids:
                self._add((tenant_id, memory_id), 1, now_ns)

    def _add(self, key: tuple[str, str], n: int, last_ns: int) -> None:
        seen = self._pending.get(key)
        if seen is None:
            self._pending[key] = [n, last_ns]
        else:
            seen[0] += n
            seen[1] = max(seen[1], last_ns)

    def pending(self) -> int:
        """Memories whose counts are not written yet."""
        with self._lock:
            return len(self._pending)

    def flush(self) -> int:
        """Write what was recorded in one transaction; returns the memories written. On
        failure the counts are kept for the next flush and the error is raised."""
        with self._lock:
            taken, self._pending = self._pending, {}
        if not taken:
            return 0
        try:
            with self.db.transaction(WriteDomain.MEMORIES) as cur:
                session_repo.add_accesses(cur, [(t, i, n, last) for (t, i), (n, last) in taken.items()])
        except BaseException:
            with self._lock:
                for key, (n, last) in taken.items():
                    self._add(key, n, last)
            raise
        self.written += len(taken)
        return len(taken)
