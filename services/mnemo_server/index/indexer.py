"""Keeps LanceDB in step with DuckDB.

Writes commit to DuckDB first and are acknowledged; their ids are then submitted here. One
worker thread takes them in batches and embeds them outside any transaction (each text in a
run of its own, two runs at a time: see EmbeddingConfig.index_batch_size), upserts them into
LanceDB, and only then marks them indexed in DuckDB. A crash anywhere in between leaves the
row marked as behind, and reconcile() — at start-up and periodically — submits it again;
the LanceDB upsert is keyed on id, so doing it twice is harmless. A batch that fails (a
full disk, an I/O error) is queued again after the worker's backoff (0.5 s, doubling to
30 s), so its rows become searchable as soon as the cause is gone rather than at the next
reconciliation (a minute apart).

The same thread checks tables' rows against DuckDB's when start-up asks (check_rows: after a
crash, or for tables written since the last orderly shutdown, index/in_step.py), a slice of
tables between batches, once serving. On this thread no index write of its own runs beside
the check: a row it finds missing or stale is submitted, one it finds deleted is removed, and
the batches after it read DuckDB afresh.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import defaultdict, deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from mnemo_server.config import IndexConfig
from mnemo_server.embed.embedder import Embedder
from mnemo_server.errors import is_storage_full
from mnemo_server.index.fair_queue import FairQueue, Key
from mnemo_server.index.lance_index import IndexRow, LanceIndex
from mnemo_server.index.maintenance import MaintenanceSchedule
from mnemo_server.store import index_marks, memory_repo
from mnemo_server.store.database import Database, WriteDomain

log = logging.getLogger(__name__)

# The rows check compares tables a slice at a time, between two index batches: a create
# waits for the slice under way. Slices of 64 small tables made creates (one after another,
# on 2,000 such tenants) take 587 ms (p50) to be searchable during the check, against 52
# after it. So a slice reads tables for up to this long (at least one), then asks DuckDB
# for their live rows in one query: its cost is per query (a scan of the memories), so
# slices of 8 tables took the check from 7 to 14-21 s.
_CHECK_SLICE_S = 0.05
_CHECK_SLICE_MAX_TENANTS = 256
# Tables opened by the check are dropped past the residency bounds every this many tables
# (a trim walks every kept table: ~12 ms at 2,000).
_CHECK_TRIM_EVERY = 64


@dataclass
class IndexerStats:
    indexed: int = 0
    removed: int = 0
    failed_batches: int = 0
    batches: int = 0
    last_error: str = ""
    # For GetStatus, which any tenant may call: a class of failure, never the error's text
    # (it names files, other tenants' tables among them).
    last_failure_reason: str = ""  # STORAGE_FULL or INTERNAL
    last_failure_ns: int = 0
    # Tables whose rows are still to be checked against DuckDB's (check_rows).
    tables_to_check: int = 0


def _by_tenant(batch: Sequence[Key]) -> dict[str, list[str]]:
    """A batch's ids by tenant, the tenants with fewest first: a tenant's one write is not
    kept waiting while a bulk load's share of the batch is embedded."""
    by_tenant: dict[str, list[str]] = defaultdict(list)
    for tenant_id, mid in dict.fromkeys(batch):
        by_tenant[tenant_id].append(mid)
    return dict(sorted(by_tenant.items(), key=lambda item: len(item[1])))


class IndexWorker:
    def __init__(self, db: Database, index: LanceIndex, embedder: Embedder, cfg: IndexConfig):
        self.db = db
        self.index = index
        self.embedder = embedder
        self.cfg = cfg
        self.stats = IndexerStats()
        self._queue = FairQueue()  # tenants take turns (fair_queue.py)
        self._queued: set[Key] = set()
        self._queued_lock = threading.Lock()
        self._waiters: dict[Key, list[threading.Event]] = defaultdict(list)
        self._waiters_lock = threading.Lock()
        self._released = threading.Event()  # see release_waiters
        self._wait_slots = threading.Semaphore(cfg.max_index_waits)
        self._idle = threading.Condition()
        self._busy = 0
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._to_check: deque[str] = deque()
        self._check_started = 0.0
        self._checked_rows = 0
        self._since_trim = 0
        self.maintenance = MaintenanceSchedule(cfg)

    # --- producer side -----------------------------------------------------------------

    def submit(self, tenant_id: str, ids: Iterable[str]) -> None:
        with self._queued_lock:
            fresh = [(tenant_id, i) for i in ids if (tenant_id, i) not in self._queued]
            self._queued.update(fresh)
        for key in fresh:
            self._queue.put(key)

    def pending(self) -> int:
        with self._queued_lock:
            return len(self._queued)

    def wait_indexed(self, tenant_id: str, ids: Sequence[str], timeout_s: float) -> bool:
        """Block until every id is searchable (or deleted), at most timeout_s; False at once
        when index.max_index_waits calls already wait (each holds a gRPC worker)."""
        if not self._wait_slots.acquire(blocking=False):
            return False
        try:
            return self._wait_indexed(tenant_id, ids, timeout_s)
        finally:
            self._wait_slots.release()

    def _wait_indexed(self, tenant_id: str, ids: Sequence[str], timeout_s: float) -> bool:
        """A batch notifies every id it took, whatever revision it indexed: one read before
        a later write indexes the older revision, so a notified id is read again and waited
        for again until its current revision is the one indexed."""
        deadline = time.monotonic() + timeout_s
        waiting = list(dict.fromkeys(ids))
        while True:
            events = self._register(tenant_id, waiting)
            try:
                # Read after registering, so a completion in between is not missed.
                current = memory_repo.get_many(self.db.reader(), tenant_id, waiting)
                waiting = [
                    i
                    for i in waiting
                    if (m := current.get(i)) is not None and not m.deleted and not m.indexed
                ]
                if not waiting:
                    return True
                if self._released.is_set():  # the server stops: answered as not yet indexed
                    return False
                if not all(events[i].wait(max(0.0, deadline - time.monotonic())) for i in waiting):
                    return False
            finally:
                self._unregister(tenant_id, events)

    def release_waiters(self) -> None:
        """Let every call waiting for its memories to be indexed go at once, now and from
        now on (the server is stopping: they answer PENDING)."""
        self._released.set()
        with self._waiters_lock:
            waiting = [ev for events in self._waiters.values() for ev in events]
        for ev in waiting:
            ev.set()

    def _register(self, tenant_id: str, ids: Sequence[str]) -> dict[str, threading.Event]:
        events = {i: threading.Event() for i in ids}
        with self._waiters_lock:
            for i, ev in events.items():
                self._waiters[(tenant_id, i)].append(ev)
        return events

    def _unregister(self, tenant_id: str, events: dict[str, threading.Event]) -> None:
        with self._waiters_lock:
            for i, ev in events.items():
                lst = self._waiters.get((tenant_id, i))
                if lst and ev in lst:
                    lst.remove(ev)
                    if not lst:
                        del self._waiters[(tenant_id, i)]

    def _notify(self, keys: Iterable[Key]) -> None:
        with self._waiters_lock:
            for key in keys:
                for ev in self._waiters.pop(key, []):
                    ev.set()

    # --- worker ----------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="mnemo-indexer", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Stop the worker; False if it was still busy after timeout_s (it is abandoned: a
        daemon thread, and what it wrote is put right by the next start's reconcile)."""
        if self._thread is None:
            return True
        self._stopping.set()
        self._queue.wake()
        self._thread.join(timeout_s)
        ended = not self._thread.is_alive()
        self._thread = None
        return ended

    def wait_idle(self, timeout_s: float) -> bool:
        """True once nothing is queued or in flight (used by commands and tests)."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self.pending() or self._busy or self._to_check:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(min(remaining, 0.05))
        return True

    def _take_batch(self, *, wait: bool) -> list[Key]:
        """The next batch; with nothing queued, an empty one at once unless `wait`."""
        try:
            first = self._queue.get(block=wait)
        except queue.Empty:
            return []
        if first is None:
            return []
        batch = [first]
        deadline = time.monotonic() + self.cfg.batch_wait_ms / 1000.0
        while len(batch) < self.cfg.max_batch:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item is None:
                self._stopping.set()
                break
            batch.append(item)
        return batch

    def _run(self) -> None:
        backoff = 0.0
        while not self._stopping.is_set():
            if self._to_check:
                backoff = 0.0 if self._check_slice() else self._back_off(backoff)
            batch = self._take_batch(wait=not self._to_check)
            if not batch:
                continue
            with self._idle:
                self._busy += 1
            with self._queued_lock:
                self._queued.difference_update(batch)
            try:
                self.process(batch)
                backoff = 0.0
            except Exception as exc:  # keep serving; the rows are tried again after the backoff
                self._failed(exc)
                log.exception("index batch of %d failed", len(batch))
                backoff = self._back_off(backoff)
                # Queued again, also when stopping: work left queued keeps the close from
                # sealing the index (app.Core.close), so the next start checks its rows.
                for tenant_id, ids in _by_tenant(batch).items():
                    self.submit(tenant_id, ids)
            finally:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()

    def _failed(self, exc: Exception) -> None:
        self.stats.failed_batches += 1
        self.stats.last_error = f"{type(exc).__name__}: {exc}"
        self.stats.last_failure_reason = "STORAGE_FULL" if is_storage_full(exc) else "INTERNAL"
        self.stats.last_failure_ns = time.time_ns()

    def _back_off(self, backoff: float) -> float:
        """Wait after a failure (0.5 s, doubling to 30 s; a stop ends the wait)."""
        backoff = min(max(backoff * 2, 0.5), 30.0)
        self._stopping.wait(backoff)
        return backoff

    def process(self, batch: Sequence[Key]) -> None:
        for tenant_id, ids in _by_tenant(batch).items():
            self._process_tenant(tenant_id, ids)

    def _process_tenant(self, tenant_id: str, ids: list[str]) -> None:
        # Through the row cache, which holds rows created one by one from their insert on;
        # not filled from here, or a bulk load would push the rows read most out of it.
        current = memory_repo.read_many(self.db.reader(), self.db.rows, tenant_id, ids, fill=False)
        live = [m for m in current.values() if not m.deleted and not m.indexed]
        gone = [i for i in ids if i not in current or current[i].deleted]
        if live:
            vectors = self.embedder.embed([m.content for m in live])
            rows = [
                IndexRow(
                    id=m.id,
                    scope=m.scope.key,
                    type=m.type.value,
                    category=m.category,
                    session=m.source.session_id,
                    pinned=m.pinned,
                    event_time_ns=m.event_time_ns,
                    create_time_ns=m.create_time_ns,
                    revision=m.revision,
                    text=m.content,
                    vector=vectors[n],
                    importance=m.importance,
                    seq=m.seq,
                )
                for n, m in enumerate(live)
            ]
            self.index.upsert(tenant_id, rows)
        if gone:
            self.index.delete(tenant_id, gone)
        with self.db.transaction(WriteDomain.MEMORIES) as cur:
            index_marks.mark_indexed(
                cur, [(tenant_id, m.id, m.revision) for m in live], self.embedder.model_id
            )
            index_marks.mark_unindexed(cur, [(tenant_id, i) for i in gone])
        self.stats.indexed += len(live)
        self.stats.removed += len(gone)
        self.stats.batches += 1
        self.maintenance.wrote(tenant_id, len(live) + len(gone))
        self._notify([(tenant_id, i) for i in ids])

    # --- reconciliation ----------------------------------------------------------------

    def reconcile(self) -> int:
        """Submit every row DuckDB says is behind (at start-up and periodically). Returns how
        many rows were submitted."""
        n = 0
        after = ("", "")
        while True:
            tasks = index_marks.needing_index(self.db.reader(), self.embedder.model_id, 5000, after)
            if not tasks:
                break
            by_tenant: dict[str, list[str]] = defaultdict(list)
            for t in tasks:
                by_tenant[t.tenant_id].append(t.id)
            for tenant_id, ids in by_tenant.items():
                self.submit(tenant_id, ids)
            n += len(tasks)
            after = (tasks[-1].tenant_id, tasks[-1].id)
        return n

    def check_rows(self, tenants: Collection[str] | None = None) -> int:
        """Have the worker thread compare tables' rows with DuckDB's (after a crash or a
        restored data directory), a slice between batches once it runs: LanceDB rows DuckDB
        does not hold as live are removed, rows LanceDB lacks or holds at another revision
        are indexed again. The tables of `tenants` (None: every table; the others are known
        to be in step, index/in_step.py). Returns how many tables are to be compared."""
        tables = self.index.tenants() if tenants is None else sorted(tenants)
        with self._idle:
            self._to_check.extend(tables)
            self._check_started = 0.0  # clocked from the worker's first slice
            self._checked_rows = 0
            self.stats.tables_to_check = len(self._to_check)
        return len(tables)

    @property
    def rows_checked(self) -> bool:
        """Whether every table check_rows was asked for has been compared."""
        return not self._to_check

    def _check_slice(self) -> bool:
        """Compare the next slice of tables. False if a table failed: it is compared again
        after the backoff, at the end of the queue."""
        self._check_started = self._check_started or time.monotonic()
        deadline = time.monotonic() + _CHECK_SLICE_S
        read: list[tuple[str, dict[str, int]]] = []
        failed: list[str] = []
        with self._idle:
            self._busy += 1
        try:
            for tenant_id in list(itertools.islice(self._to_check, _CHECK_SLICE_MAX_TENANTS)):
                try:
                    read.append((tenant_id, self.index.revisions(tenant_id)))
                except Exception as exc:  # a table that does not read holds back no other
                    self._failed(exc)
                    log.exception("index check of tenant %s's table failed", tenant_id)
                    failed.append(tenant_id)
                if time.monotonic() >= deadline:
                    break
            try:
                self._checked_rows += self._put_right(read)
            except Exception as exc:
                self._failed(exc)
                log.exception("index check of %d table(s) failed", len(read))
                failed.extend(t for t, _ in read)
            # Tables opened only to be compared are not kept past the residency bounds.
            self._since_trim += len(read)
            if self._since_trim >= _CHECK_TRIM_EVERY or len(self._to_check) <= len(read) + len(failed):
                self._since_trim = 0
                self.index.trim()
        except Exception as exc:
            self._failed(exc)
            log.exception("index trim after a check failed")
        finally:
            with self._idle:
                for _ in range(len(read) + len(failed)):
                    self._to_check.popleft()
                self._to_check.extend(failed)
                if not self._to_check:
                    log.info(
                        "index rows checked against the store in %.1f s: %d memories (re)indexed or removed",
                        time.monotonic() - self._check_started,
                        self._checked_rows,
                    )
                self.stats.tables_to_check = len(self._to_check)
                self._busy -= 1
                self._idle.notify_all()
        return not failed

    def forget_missing_tables(self) -> None:
        """Rows DuckDB marks as indexed in a table that does not exist (deleted, or a LanceDB
        directory put back from before the tenant's first write) are marked unindexed."""
        marked = set(index_marks.tenants_with_index_marks(self.db.reader()))
        missing = sorted(marked - set(self.index.tenants()))
        for tenant_id in missing:
            log.warning("tenant %s has no index table: its memories are indexed again", tenant_id)
            with self.db.transaction() as cur:
                index_marks.reset_index_marks(cur, tenant_id)

    def _put_right(self, tables: list[tuple[str, dict[str, int]]]) -> int:
        """tables: (tenant, id -> revision LanceDB holds). Rows DuckDB does not hold as live
        are removed from LanceDB; rows DuckDB marks as indexed that LanceDB lacks or holds at
        another revision are indexed again."""
        if not tables:
            return 0
        marks = index_marks.live_index_marks(self.db.reader(), [t for t, _ in tables])
        removed = 0
        for tenant_id, indexed in tables:
            live = marks.get(tenant_id, {})
            orphans = [i for i in indexed if i not in live]
            if orphans:
                self.index.delete(tenant_id, orphans)
                removed += len(orphans)
            stale = [
                i for i, (rev, idx_rev) in live.items() if idx_rev is not None and indexed.get(i) != idx_rev
            ]
            if stale:
                with self.db.transaction() as cur:
                    index_marks.forget_index_marks(cur, tenant_id, stale)
                self.submit(tenant_id, stale)
                removed += len(stale)
        return removed
