"""One tenant's LanceDB table as this process holds it (`TableHandle`: the table, the Lance
dataset its searches read, the Lance session whose caches they share, and what is kept in
memory beside it), and the facts about its indices that searches and maintenance both read.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mnemo_server.config import IndexConfig
from mnemo_server.index.attrs import AttrsCache
from mnemo_server.index.pending import PendingRows
from mnemo_server.index.row_addresses import IdsByAddress
from mnemo_server.index.scope_vectors import ScopeVectors
from mnemo_server.index.text_postings import TextPostings
from mnemo_server.index.vector_graph import VectorGraph
from mnemo_server.memory.model import MemoryFilter


@dataclass
class TableHandle:
    """One tenant's table: written through LanceDB, read through a Lance dataset snapshot
    that every write replaces (LanceDB's query builder costs ~2 ms more per query)."""

    table: Any
    uri: str
    reader: Any
    session: Any
    # Hit attributes by id, kept by this process's writes: searches read only ids and
    # scores from LanceDB; what is missing is read from the table.
    attrs: AttrsCache
    # Every row's vector by scope, once loaded (then kept by this process's writes).
    vectors: ScopeVectors
    # Every row's full-text postings, once loaded (then kept by this process's writes).
    texts: TextPostings
    # Ids by row address: a vector search reads no column (row_addresses.py).
    ids: IdsByAddress = field(default_factory=IdsByAddress)
    lock: threading.Lock = field(default_factory=threading.Lock)
    has_text_index: bool = False
    # Every row outside the ANN index (see pending.py), or None while that is not known:
    # no ANN index yet, or rows left outside it by an earlier process. Then searches take
    # LanceDB's flat scan of them instead.
    pending: PendingRows | None = None
    # What the Lance session held right after it was last renewed and warmed (0: never).
    warm_session_bytes: int = 0
    # What it held when last measured, when (monotonic; None: not yet) and how long measuring
    # took: session_bytes().
    session_bytes: int = 0
    session_measured_at: float | None = None
    session_measure_s: float = 0.0
    # Every row's vector in an HNSW graph for unfiltered searches (None: not kept).
    graph: VectorGraph | None = None
    # The last filter's matching ids, with the snapshot they were read from (_ids_matching).
    last_matching: tuple[Any, MemoryFilter, frozenset[str]] | None = None
    # Residency (index/residency.py): when a search or write last used it; whether it was
    # dropped (under the table lock: a writer holding a dropped handle opens the table
    # again); set once its in-memory indices are loaded (a new table's at once: it is
    # empty) or it was dropped, which wakes the searches waiting for its load.
    last_used: float = 0.0
    closed: bool = False
    load_lock: threading.Lock = field(default_factory=threading.Lock)
    settled: threading.Event = field(default_factory=threading.Event)

    @property
    def ready(self) -> bool:
        """Its in-memory indices are loaded."""
        return self.settled.is_set() and not self.closed

    def refresh(self) -> None:
        """Read the newest version. Through the same Lance session: its index cache is what
        makes a search take ~2 ms; a dataset opened afresh pays ~85 ms (100k rows) to load
        the ANN index again, and writes arrive many times a second."""
        import lance

        self.reader = lance.dataset(self.uri, session=self.session)

    def for_maintenance(self) -> Any:
        """A dataset object of its own for compaction and index merges: they borrow the
        object they run on mutably (for seconds), and a search on that same object then fails
        ("Already mutably borrowed"). Same session, so the caches stay shared."""
        import lance

        return lance.dataset(self.uri, session=self.session)


def session_bytes(h: TableHandle, max_share: float) -> int:
    """What the handle's Lance session holds. Session.size_bytes walks every cached entry
    and keeps the GIL while it does, stalling every thread of the server for as long
    (config.py, `index.session_measure_max_share`), so it is measured again only once the
    time since the last measurement is 1/max_share times what that one took (0: always);
    until then the last figure stands. A small session is cheap to measure and so is
    always near fresh; a large one's figure may be seconds old."""
    now = time.monotonic()
    at = h.session_measured_at
    if at is not None and max_share > 0 and (now - at) * max_share < h.session_measure_s:
        return h.session_bytes
    held, took_s = measure_session(h.session)
    record_session_bytes(h, held, took_s)
    return held


def measure_session(session: Any) -> tuple[int, float]:
    """What a Lance session holds, and how long Session.size_bytes took to say so."""
    started = time.monotonic()
    held = int(session.size_bytes())
    return held, time.monotonic() - started


def record_session_bytes(h: TableHandle, held: int, took_s: float) -> None:
    """A measure taken now (session_bytes, or a renewal's of its warm session) and what it
    took, which sets how long the next one waits."""
    h.session_bytes, h.session_measured_at, h.session_measure_s = held, time.monotonic(), took_s


def new_session(cfg: IndexConfig) -> Any:
    import lance

    # pylance re-exports Session without listing it in __all__.
    return lance.Session(  # type: ignore[attr-defined]
        index_cache_size_bytes=cfg.index_cache_mb << 20,
        metadata_cache_size_bytes=cfg.metadata_cache_mb << 20,
    )


def read_whole_ann_index(reader: Any, dimension: int) -> None:
    """A search probing every partition: loads the whole ANN index into the session."""
    nearest = {
        "column": "vector",
        "q": np.ones(dimension, dtype=np.float32),
        "k": 1,
        "metric": "cosine",
        "nprobes": 1 << 20,
    }
    reader.to_table(columns=["id", "_distance"], nearest=nearest, fast_search=True)


def index_names(table: Any) -> dict[str, Any]:
    return {ix.name: ix for ix in table.list_indices()}


def reader_index_names(h: TableHandle) -> set[str]:
    """The indices of the version the handle reads: from the open dataset, ~0.02 ms,
    where LanceDB's table.list_indices takes ~0.5 ms (through its event loop)."""
    return {ix.name for ix in h.reader.describe_indices()}


def rows_outside(h: TableHandle, index_name: str) -> int | None:
    """Rows the named index does not cover yet, None if the table has no such index."""
    stats = h.table.index_stats(index_name)
    return None if stats is None else int(stats.num_unindexed_rows)


def settle_pending(h: TableHandle) -> None:
    """Once the ANN index holds every row, start keeping the rows written after it
    (caller holds the table lock or owns the handle alone)."""
    h.pending = PendingRows() if rows_outside(h, "vector_idx") == 0 else None


def vector_segments(h: TableHandle) -> list[Any]:
    """The ANN index's deltas (each optimize that adds rows adds one)."""
    return next((list(d.segments) for d in h.reader.describe_indices() if d.name == "vector_idx"), [])
