"""Forced purges, written in batches of memories rather than in one transaction.

Why batches: a purge holds the memories write lock, which every tenant's creates, updates
and deletes share. In one transaction, purging a tenant's 76,882 memories (a copy of the
bench's 20k store) held it 0.6-0.9 s even after its ids went to DuckDB as a relation
(store/memory_repo.py, id_set), and a purge of a million would hold it for seconds, past
the deadlines of other tenants' writes. A batch is `storage.purge_batch` memories; other
writers take the lock between batches. The same purge, with a create every 20 ms beside it
(machine busy with a test run): in batches of 5,000, 2.15 s in all and the creates during
it p50 127 ms, max 157 ms; in batches of 1,000 (the default), 3.64 s and p50 29 ms, max
86 ms; in one transaction a create waited 600-900 ms.

What a purge deletes is fixed when it starts: the memories matching its filter that are
stored by then (the tenant's largest sequence number, or the dry run's snapshot token when
one is given). Each batch reads the next of them still live and matching, so memories
stored while it runs are kept, as they were when the purge was one transaction.

A keyed purge (request_id) records its progress with each batch: the count so far and its
bound. A retry after a crash resumes from there and answers the whole count, as the purge
would have; a retry of a finished purge is answered from its record. A retry that arrives
while the purge still runs in this process (a client that timed out) waits for it and is
then answered from the record, rather than purging beside it and recording a count of its
own over the first one's. It waits no longer than its own deadline, and not at all once its
caller has gone: a purge of a million memories outlasts a client's retries, and each retry
waiting for it to the end held one of the server's gRPC workers, all of them in time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from mnemo_server.errors import Cancelled, DeadlineExceeded
from mnemo_server.index.indexer import IndexWorker
from mnemo_server.memory.live_counts import LiveCounts
from mnemo_server.memory.model import IdempotencyKey, MemoryFilter
from mnemo_server.store import idempotency_repo, memory_repo
from mnemo_server.store.database import Cursor, Database


@dataclass(frozen=True)
class PurgeCount:
    """Memories a purge deleted, or a dry run would; a dry run's token bounds a forced purge
    to what it counted (memory/purge_snapshot.py)."""

    count: int
    snapshot_token: str = ""


@dataclass(frozen=True)
class Patience:
    """How long a copy of a running purge may wait for it: the caller's deadline, and
    whether the caller is still there (asked between waits of poll_s)."""

    wait_s: float = float("inf")
    still_wanted: Callable[[], bool] = lambda: True
    poll_s: float = 1.0


# Waits for the running copy to end, however long it takes (in-process callers, tests).
UNTIL_DONE = Patience()


class _Running:
    """Keyed purges running in this process: a copy of one waits for it to end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ends: dict[tuple[str, str], threading.Event] = {}

    @contextmanager
    def claim(self, tenant_id: str, key: IdempotencyKey | None, patience: Patience) -> Iterator[None]:
        if key is None:
            yield
            return
        name = (tenant_id, key.request_id)
        give_up = time.monotonic() + patience.wait_s
        while True:
            with self._lock:
                running = self._ends.get(name)
                if running is None:
                    mine = self._ends[name] = threading.Event()
                    break
            left = give_up - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(
                    f"the purge with request_id {key.request_id!r} is still running; "
                    "send it again for its count",
                    reason="PURGE_IN_PROGRESS",
                )
            if not running.wait(min(left, patience.poll_s)) and not patience.still_wanted():
                raise Cancelled("the caller went away while its purge's first copy ran")
        try:
            yield
        finally:
            with self._lock:
                del self._ends[name]
            mine.set()


class Purger:
    def __init__(
        self,
        db: Database,
        indexer: IndexWorker,
        live_counts: LiveCounts,
        write: Callable[[str], AbstractContextManager[Cursor]],
        clock: Callable[[], int],
        batch: int,
    ):
        """write(tenant_id): a memories write transaction (MemoryService._write)."""
        self.db = db
        self.indexer = indexer
        self.live_counts = live_counts
        self._write = write
        self.clock = clock
        self.batch = batch
        self._running = _Running()

    def purge(
        self,
        tenant_id: str,
        f: MemoryFilter,
        through: int | None,
        key: IdempotencyKey | None,
        patience: Patience = UNTIL_DONE,
    ) -> int:
        """Tombstone the live memories matching f stored by now (numbered up to through, if
        given), a batch a transaction; how many were deleted."""
        with self._running.claim(tenant_id, key, patience):
            deleted, recorded = 0, False
            while True:
                with self._write(tenant_id) as cur:
                    now = self.clock()  # under the write lock (see MemoryService.update)
                    if not recorded:
                        replay = idempotency_repo.lookup(cur, self.db.stored.requests, tenant_id, key)
                        if replay is not None and replay.get("done", True):
                            return int(replay["count"])
                        if replay is not None:  # cut short by a crash: resumed
                            deleted, through, recorded = (
                                int(replay["count"]),
                                int(replay["through_seq"]),
                                True,
                            )
                        elif through is None:
                            through = memory_repo.largest_seq(cur, tenant_id)
                    ids = memory_repo.live_ids_matching(
                        cur, tenant_id, f, through_seq=through, limit=self.batch
                    )
                    memory_repo.tombstone(cur, tenant_id, ids, now)
                    memory_repo.record_history(
                        cur, [(tenant_id, i, "delete", "api", "purge", {}) for i in ids], now
                    )
                    deleted += len(ids)
                    finished = len(ids) < self.batch
                    progress: dict[str, Any] = {"count": deleted}
                    if not finished:
                        progress |= {"done": False, "through_seq": through}
                    if recorded:
                        idempotency_repo.rerecord(cur, tenant_id, key, progress)
                    else:
                        idempotency_repo.record(cur, self.db.stored.requests, tenant_id, key, progress, now)
                        recorded = key is not None
                self.live_counts.forget(tenant_id)
                self.indexer.submit(tenant_id, ids)
                if finished:
                    return deleted
