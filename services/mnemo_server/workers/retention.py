"""Retention: hard-purges tombstones past their window (only once their index row is
gone), old idempotency records and audit history, sessions past theirs (never one whose
feedback the sidecar has not taken yet), and training pairs the sidecar has acknowledged.
Short transactions, bounded batches. Without the last two, every session a server ever
served stayed on its disk (~6 KB each under the bench's mix)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mnemo_server.config import RetentionConfig
from mnemo_server.memory.model import now_ns
from mnemo_server.store import idempotency_repo, memory_repo, session_repo
from mnemo_server.store.database import Database, WriteDomain

_NS_PER_HOUR = 3600 * 1_000_000_000
_BATCH = 500


@dataclass
class RetentionReport:
    purged_memories: int = 0
    purged_sessions: int = 0


class RetentionWorker:
    def __init__(self, db: Database, cfg: RetentionConfig, clock: Callable[[], int] = now_ns):
        self.db = db
        self.cfg = cfg
        self.clock = clock

    def sweep(self) -> RetentionReport:
        report = RetentionReport()
        now = self.clock()
        tombstone_cutoff = now - int(self.cfg.tombstone_days * 24 * _NS_PER_HOUR)
        # Memory rows and their history are the memories domain's alone: purging them leaves
        # session writes (every StartSession and EndSession) free to commit meanwhile.
        while True:
            with self.db.transaction(WriteDomain.MEMORIES) as cur:
                purged = memory_repo.purge_tombstones(cur, tombstone_cutoff, _BATCH)
            report.purged_memories += len(purged)
            if len(purged) < _BATCH:
                break
        # Idempotency records are written under several domains' locks (creates, EndSession,
        # tenant and skill writes): their purge holds every lock.
        with self.db.transaction() as cur:
            idempotency_repo.purge(cur, now - int(self.cfg.idempotency_hours * _NS_PER_HOUR))
        with self.db.transaction(WriteDomain.MEMORIES) as cur:
            memory_repo.purge_history(cur, now - int(self.cfg.history_days * 24 * _NS_PER_HOUR))
        with self.db.transaction(WriteDomain.SESSIONS) as cur:
            session_repo.purge_delivered_feedback(
                cur, now - int(self.cfg.delivered_feedback_hours * _NS_PER_HOUR)
            )
        if self.cfg.session_days > 0:
            session_cutoff = now - int(self.cfg.session_days * 24 * _NS_PER_HOUR)
            while True:
                # A purged session's id may be started again: not while its row is going.
                with self.db.transaction(WriteDomain.SESSIONS, WriteDomain.SESSION_STARTS) as cur:
                    ended = session_repo.purge_sessions(cur, session_cutoff, _BATCH)
                report.purged_sessions += ended
                if ended < _BATCH:
                    break
        return report
