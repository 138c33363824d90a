"""Which tenants' search indices the server keeps in memory.

Each tenant's index holds, once loaded, every row's vector twice (by scope and in the
vector graph), its full-text postings, its hit attributes and a Lance session. Measured: a
100k-row tenant ~400 MB (5-7 s to load), 1k-row tenants ~1.9 MB each (300 of them took a
process from 71 to 796 MB), 50-row tenants ~0.6 MB each. Kept for every tenant forever, a
server with many tenants grows without bound, and starting it loads them all before it
serves (those 300: 17 s). So the tenants kept are bounded, in count and in rows, to the
most recently used; the others are loaded again when a search asks for them (1k rows:
~55 ms; 100k: 5-7 s; on a thread of their own, the search waiting at most
index.load_wait_s), which is why a tenant used within the last `min_idle_s` is never
dropped, even past the bounds: that would trade memory for reloading it again and again.
Everything dropped is derived from the LanceDB table (and the saved vector graph, saved as
it is dropped), so nothing is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ResidencyBounds:
    max_tenants: int  # 0: no bound
    max_rows: int  # 0: no bound
    min_idle_s: float


@dataclass(frozen=True)
class Resident:
    """One kept tenant, as the choice of what to drop sees it."""

    name: str
    last_used: float  # monotonic seconds
    rows: int  # rows loaded in memory (0 for a table opened but not loaded)


@dataclass(frozen=True)
class ResidencyStats:
    """The whole server's kept tenants (GetStatus.index_residency)."""

    tenants: int
    rows: int
    max_tenants: int
    max_rows: int
    # Since the server started: tenants loaded into memory (at start-up and by searches
    # after they were dropped) and tenants dropped. Loads well above the tenants served
    # mean the bounds are below the tenants in use at once.
    loads: int
    drops: int


def over_bounds(tenants: int, rows: int, bounds: ResidencyBounds) -> bool:
    return (bounds.max_tenants > 0 and tenants > bounds.max_tenants) or (
        bounds.max_rows > 0 and rows > bounds.max_rows
    )


def to_drop(kept: Sequence[Resident], bounds: ResidencyBounds, now: float) -> list[str]:
    """The least recently used tenants to drop, oldest first, until the rest are within the
    bounds, skipping those used within `min_idle_s`."""
    tenants = len(kept)
    rows = sum(r.rows for r in kept)
    chosen: list[str] = []
    for r in sorted(kept, key=lambda r: r.last_used):
        if not over_bounds(tenants, rows, bounds):
            break
        if now - r.last_used < bounds.min_idle_s:
            break  # every later one was used more recently still
        chosen.append(r.name)
        tenants -= 1
        rows -= r.rows
    return chosen


def has_room(tenants: int, rows: int, bounds: ResidencyBounds) -> bool:
    """Whether one more tenant can be loaded at start-up (at least one always is)."""
    return tenants == 0 or not over_bounds(tenants + 1, rows, bounds)
