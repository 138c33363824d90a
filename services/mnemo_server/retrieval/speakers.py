"""The speakers of a tenant's memories, for Recall's speaker and entity signals: names with
at least `min_count` live memories among those a filter's scopes cover.

Counts are cached per scope, not per filter. StartSession's recall is filtered by the
workspace, the session's own scope and its project or persona, and the session scope is new
every time, so a cache keyed by the whole filter missed on every StartSession and paid a
DuckDB query (~1.9 ms of its ~34 ms of CPU at 100k rows). A scope the index holds no row of
is not asked about: a memory written there in the last moments, before it is indexed, counts
from the next call on, which for a ranking signal is soon enough.

Counts older than `ttl_s` are served while one background thread reads them again; only
counts never read, or older than `stale_s`, are read in the call. The read costs ~1.4 ms
alone at 100k rows, but a DuckDB call takes the GIL back 4-6 times, each a wait behind the
busy threads, and in the bench's mix the calls that paid it took ~20 ms more: in one mixed
minute 23 of the 66 StartSessions slower than 100 ms had spent 15-45 ms in recall.analysis,
which otherwise takes under 1 ms (stop 50's note).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence

from mnemo_server.index.lance_index import LanceIndex
from mnemo_server.memory.model import Scope
from mnemo_server.one_thread import OneThreadQueue
from mnemo_server.store import memory_repo
from mnemo_server.store.database import Database

log = logging.getLogger(__name__)

_MAX_ENTRIES = 10_000

# A scope, or None for the whole tenant.
_Of = Scope | None


class ScopeSpeakers:
    def __init__(
        self,
        db: Database,
        index: LanceIndex,
        min_count: int,
        ttl_s: float,
        stale_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        """stale_s <= ttl_s: counts are never served past ttl_s, every read is in the call."""
        self.db = db
        self.index = index
        self.min_count = min_count
        self.ttl_s = ttl_s
        self.stale_s = max(stale_s, ttl_s)
        self.clock = clock
        self._lock = threading.Lock()
        # (tenant, scope or None) -> (when read, speaker -> memories)
        self._counts: dict[tuple[str, _Of], tuple[float, dict[str, int]]] = {}
        # One read at a time, each (tenant, scope) queued at most once until it has run.
        self._refreshes = OneThreadQueue("mnemo-speakers")
        # Counts whose last refresh failed (touched only by the refresh thread).
        self._failing: set[tuple[str, _Of]] = set()

    def names(self, tenant_id: str, scopes: Sequence[Scope]) -> list[str]:
        """Sorted names; over the whole tenant when no scope is given."""
        wanted: list[_Of] = list(dict.fromkeys(scopes)) if scopes else [None]
        now = self.clock()
        found: list[dict[str, int]] = []
        missing: list[_Of] = []
        stale: list[_Of] = []
        with self._lock:
            for of in wanted:
                hit = self._counts.get((tenant_id, of))
                age = math.inf if hit is None else now - hit[0]
                if hit is None or age >= self.stale_s:
                    missing.append(of)
                    continue
                found.append(hit[1])
                if age >= self.ttl_s:
                    stale.append(of)
        # A scope already queued or being read is not queued again; after close(), none is.
        for of in stale:
            self._refreshes.submit((tenant_id, of), functools.partial(self._refresh, tenant_id, of))
        # A never-indexed scope (a new session's) needs no query; not cached, so rows
        # indexed there later count at once.
        asked = [of for of in missing if of is None or self.index.scope_rows(tenant_id, of.key) != 0]
        if asked:
            for of, counts in self._read(tenant_id, asked).items():
                self._remember(tenant_id, of, counts)
                found.append(counts)
        return self._enough(found)

    def settle(self, timeout_s: float) -> bool:
        """Wait until no refresh is under way; False if one still is after timeout_s."""
        return self._refreshes.wait_idle(timeout_s)

    def close(self) -> None:
        """Stop the refresh thread (refreshes queued so far run first); stale counts are
        served as they are from then on."""
        self._refreshes.stop()

    def _refresh(self, tenant_id: str, of: _Of) -> None:
        key = (tenant_id, of)
        try:
            for read, counts in self._read(tenant_id, [of]).items():
                self._remember(tenant_id, read, counts)
        except Exception:  # the counts stay stale; the next call past ttl_s tries again
            # A cause that lasts (a store gone read-only) fails every retry, one per call
            # past ttl_s: a warning with its traceback each time buried the log.
            if key in self._failing:
                log.debug("speaker counts of tenant %r still not refreshed", tenant_id, exc_info=True)
            else:
                if len(self._failing) > _MAX_ENTRIES:
                    self._failing.clear()
                self._failing.add(key)
                log.warning(
                    "speaker counts of tenant %r not refreshed (until they are, retries that fail "
                    "are logged at debug level)",
                    tenant_id,
                    exc_info=True,
                )
            return
        if key in self._failing:
            self._failing.discard(key)
            log.info("speaker counts of tenant %r refreshed again", tenant_id)

    def _read(self, tenant_id: str, wanted: Sequence[_Of]) -> dict[_Of, dict[str, int]]:
        """Counts from DuckDB: the whole tenant's for None, each scope's for a scope."""
        cur = self.db.reader()
        out: dict[_Of, dict[str, int]] = {}
        if None in wanted:
            out[None] = memory_repo.speaker_counts(cur, tenant_id)
        scopes = [of for of in wanted if of is not None]
        if scopes:
            for scope, counts in memory_repo.speaker_counts_by_scope(cur, tenant_id, scopes).items():
                out[scope] = counts
        return out

    def _remember(self, tenant_id: str, of: _Of, counts: dict[str, int]) -> None:
        with self._lock:
            if len(self._counts) > _MAX_ENTRIES:
                self._counts.clear()
            self._counts[(tenant_id, of)] = (self.clock(), counts)

    def _enough(self, counts: Sequence[dict[str, int]]) -> list[str]:
        total: dict[str, int] = {}
        for c in counts:
            for name, n in c.items():
                total[name] = total.get(name, 0) + n
        return sorted(name for name, n in total.items() if n >= self.min_count)
