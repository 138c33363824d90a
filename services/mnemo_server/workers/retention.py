"""Retention: hard-purges tombstones past their window (only once their index row is
gone), and old idempotency records and audit history. Short transactions, bounded batches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mnemo_server.config import RetentionConfig
from mnemo_server.memory.model import now_ns
from mnemo_server.store import idempotency_repo, memory_repo
from mnemo_server.store.database import Database

_NS_PER_HOUR = 3600 * 1_000_000_000
_BATCH = 500


@dataclass
class RetentionReport:
    purged_memories: int = 0


class RetentionWorker:
    def __init__(self, db: Database, cfg: RetentionConfig, clock: Callable[[], int] = now_ns):
        self.db = db
        self.cfg = cfg
        self.clock = clock

    def sweep(self) -> RetentionReport:
        report = RetentionReport()
        now = self.clock()
        tombstone_cutoff = now - int(self.cfg.tombstone_days * 24 * _NS_PER_HOUR)
        while True:
            with self.db.transaction() as cur:
                purged = memory_repo.purge_tombstones(cur, tombstone_cutoff, _BATCH)
            report.purged_memories += len(purged)
            if len(purged) < _BATCH:
                break
        with self.db.transaction() as cur:
            idempotency_repo.purge(cur, now - int(self.cfg.idempotency_hours * _NS_PER_HOUR))
        with self.db.transaction() as cur:
            memory_repo.purge_history(cur, now - int(self.cfg.history_days * 24 * _NS_PER_HOUR))
        return report
