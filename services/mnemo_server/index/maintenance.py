"""When each tenant's LanceDB table gets its background maintenance.

Every index write appends a small fragment and leaves its rows outside LanceDB's indices.
With the in-memory indices (the vector graph, scope vectors and full-text postings: the
default) no search reads a LanceDB ANN or full-text index, the tables have none, and an
optimize only folds rows into the scope and id indices and drops old versions; without them
the rows outside are searched flat until folded in (~11 us per row and full-text query).
Compaction merges fragments and is cheap, so it runs every few writes. An optimize costs
time in proportion to the whole table (with the ANN and full-text indices ~0.8 s of CPU at
100k rows; without them 0.04 s in-process after 40 small writes), so it runs when writes
settle, when some rows wait, or when they have waited long, and never so often that it
takes more than a set share of the time: under steady writes it would otherwise run every
second and eat a core. Only a large backlog of rows outside the indices overrides that share.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mnemo_server.config import IndexConfig

# A tenant whose optimize failed is tried again after this long, whatever its backlog, so a
# failure that persists is logged twice a minute rather than every tick.
RETRY_AFTER_FAILURE_S = 30.0


@dataclass
class Dirty:
    """A tenant's index writes since its last optimize."""

    first_write: float
    last_write: float
    rows: int = 0
    writes_since_compaction: int = 0


@dataclass(frozen=True)
class Maintenance:
    compact: list[str]
    optimize: list[str]
    # Of those, the ones optimized only because a backlog forced it: no expensive extras
    # (merging ANN deltas) for them, the next regular optimize does those.
    backlog_only: frozenset[str] = frozenset()
    # The rows each optimized tenant had waiting: handed back if its optimize fails.
    rows: dict[str, int] = field(default_factory=dict)


class MaintenanceSchedule:
    def __init__(self, cfg: IndexConfig, clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self.clock = clock
        self._dirty: dict[str, Dirty] = {}
        self._optimize_not_before: dict[str, float] = {}
        self._retry_not_before: dict[str, float] = {}
        self._lock = threading.Lock()

    def wrote(self, tenant_id: str, rows: int) -> None:
        now = self.clock()
        with self._lock:
            d = self._dirty.setdefault(tenant_id, Dirty(now, now))
            d.last_write = now
            d.rows += rows
            d.writes_since_compaction += 1

    def dirty(self) -> dict[str, int]:
        """Rows written since the last optimize, per tenant."""
        with self._lock:
            return {t: d.rows for t, d in self._dirty.items()}

    def take(self, force: bool = False) -> Maintenance:
        """The tenants to compact and those to optimize now (force: every dirty tenant, at
        once, e.g. before shutdown)."""
        cfg, now = self.cfg, self.clock()
        compact: list[str] = []
        optimize: list[str] = []
        backlog_only: set[str] = set()
        rows: dict[str, int] = {}
        with self._lock:
            for tenant_id, d in list(self._dirty.items()):
                if not force and now < self._retry_not_before.get(tenant_id, 0.0):
                    continue  # its optimize failed lately: no maintenance of it until the retry
                # Many rows outside the indices make every search pay more than an optimize
                # costs, so that trigger does not wait for the time share.
                behind = d.rows >= cfg.optimize_max_lag_rows
                due = (
                    now - d.last_write >= cfg.optimize_quiet_s
                    or d.rows >= cfg.optimize_lag_rows
                    or now - d.first_write >= cfg.optimize_max_interval_s
                )
                allowed = due and now >= self._optimize_not_before.get(tenant_id, 0.0)
                if force or behind or allowed:
                    optimize.append(tenant_id)
                    rows[tenant_id] = d.rows
                    del self._dirty[tenant_id]
                    if not (force or allowed):
                        backlog_only.add(tenant_id)
                elif d.writes_since_compaction >= cfg.compact_after_writes:
                    compact.append(tenant_id)
                    d.writes_since_compaction = 0
        return Maintenance(compact, optimize, frozenset(backlog_only), rows)

    def failed(self, tenant_id: str, rows: int) -> None:
        """A tenant's optimize failed: its rows wait again (with any written since), and it
        is taken again after RETRY_AFTER_FAILURE_S. Without this a tenant that is not written
        to would keep its rows outside the indices, searched flat, until its next write."""
        now = self.clock()
        with self._lock:
            d = self._dirty.setdefault(tenant_id, Dirty(now, now))
            d.rows += rows
            self._retry_not_before[tenant_id] = now + RETRY_AFTER_FAILURE_S

    def optimized(self, tenant_id: str, seconds: float) -> None:
        """Record how long a tenant's optimize took; the next one waits in proportion."""
        share = min(1.0, max(1e-3, self.cfg.optimize_time_share))
        with self._lock:
            self._retry_not_before.pop(tenant_id, None)
            self._optimize_not_before[tenant_id] = self.clock() + seconds * (1.0 / share - 1.0)
