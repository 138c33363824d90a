"""Loading what a tenant's searches keep in memory from its LanceDB table: the hit
attributes, every row's vector by scope, the full-text postings and the vector graph (read
from its saved file and put right, or built). LanceIndex decides when (index/residency.py).
Vectors and texts are read under the table lock, so no write between the read and the ones
after it is missed; the graph is built from a snapshot of the vectors taken under it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from mnemo_server.config import IndexConfig
from mnemo_server.index import graph_files
from mnemo_server.index.attrs import ATTR_COLUMNS, read_attrs
from mnemo_server.index.lance_table import TableHandle
from mnemo_server.index.vector_graph import GraphParams, HnswGraph

log = logging.getLogger(__name__)


class TableLoader:
    def __init__(self, cfg: IndexConfig, dimension: int, graph_dir: Path | None, graph_params: GraphParams):
        self.cfg = cfg
        self.dimension = dimension
        self.graph_dir = graph_dir
        self.graph_params = graph_params

    @property
    def keeps_scope_vectors(self) -> bool:
        return self.cfg.exact_scope_search_max_rows > 0

    def load(self, table_name: str, h: TableHandle) -> int:
        """Every in-memory index of the table (the caller holds its load lock). Returns the
        rows the largest holds."""
        self._load_attrs(h, self.cfg.attrs_cache_rows)
        rows = self._load_scope_vectors(h)
        rows = max(rows, self._load_text_postings(h))
        self._load_vector_graph(table_name, h)
        return rows

    @staticmethod
    def _load_attrs(h: TableHandle, most: int) -> int:
        """Fill the attribute cache from the table (~0.7 s per 100k rows, paid by the load
        instead of by the first searches). Returns the entries cached."""
        data = h.reader.to_table(columns=["id", *ATTR_COLUMNS], limit=most)
        h.attrs.remember(read_attrs(data), overwrite=False)
        return len(h.attrs)

    def _load_scope_vectors(self, h: TableHandle) -> int:
        """Read every row's vector into the scope vectors (0.5–0.9 s per 100k rows, in
        batches to bound the memory it takes). Under the table lock, so no write is missed
        between the read and the writes that follow. Returns the rows loaded."""
        if not self.keeps_scope_vectors:
            return 0
        with h.lock:
            batches = h.reader.to_batches(columns=["id", "scope", "vector"], batch_size=8192)
            h.vectors.load(
                (
                    b.column("id").to_pylist(),
                    b.column("scope").to_pylist(),
                    b.column("vector").flatten().to_numpy(zero_copy_only=False).reshape(-1, self.dimension),
                )
                for b in batches
            )
            return h.vectors.rows()

    def _load_text_postings(self, h: TableHandle) -> int:
        """Read every row's text into the in-memory full-text postings. Under the table
        lock, like _load_scope_vectors. Returns the rows loaded."""
        if not self.cfg.memory_text_search:
            return 0
        with h.lock:
            batches = h.reader.to_batches(columns=["id", "scope", "text"], batch_size=8192)
            h.texts.load(
                row
                for b in batches
                for row in zip(
                    b.column("id").to_pylist(),
                    b.column("scope").to_pylist(),
                    b.column("text").to_pylist(),
                    strict=True,
                )
            )
            return h.texts.rows()

    def _load_vector_graph(self, table_name: str, h: TableHandle) -> int:
        """Read the tenant's saved vector graph and put right what changed since it was saved,
        or build it from its scope vectors (after the scope vectors: a build takes ~40 s per
        100k rows, a saved graph's read ~0.1 s). Returns the rows in the graph."""
        if h.graph is None:
            return 0
        saved = None
        if self.graph_dir is not None:
            saved = graph_files.load(self.graph_dir, table_name, self.dimension, self.graph_params)
        if saved is None or not self._adopt_graph(h, saved):
            self.build_graph(h)
        return h.graph.rows()

    @staticmethod
    def _adopt_graph(h: TableHandle, saved: HnswGraph) -> bool:
        """Make a saved graph hold exactly the rows of a snapshot of the scope vectors taken
        under the table lock (later writes are queued for it); False if it differs from them
        too much to be worth repairing (graph_files.MAX_STALE_SHARE)."""
        graph = h.graph
        with h.lock:
            if graph is None or not h.vectors.loaded:
                return False
            chunks = list(h.vectors.snapshot())
            started = graph.begin_build(saved)
        began = time.monotonic()
        rows = sum(len(ids) for ids, _ in chunks)
        stale, adds = saved.differences(chunks)
        added = sum(len(ids) for ids, _ in adds)
        if len(stale) + added > graph_files.MAX_STALE_SHARE * max(rows, 1):
            log.info(
                "saved vector graph of %s: %d removals and %d additions for %d rows; built afresh",
                h.uri,
                len(stale),
                added,
                rows,
            )
            return False
        saved.remove(stale)
        graph.unsaved += len(stale)  # (fill counts the additions)
        if not graph.fill(started, adds):
            return False
        log.info(
            "vector graph of %s loaded: %d rows, %d removed and %d added to it in %.2f s",
            h.uri,
            rows,
            len(stale),
            added,
            time.monotonic() - began,
        )
        return True

    @staticmethod
    def build_graph(h: TableHandle) -> None:
        """Build the graph from a snapshot of the scope vectors taken under the table lock:
        the writes after it are queued for the new graph, so it misses none."""
        graph = h.graph
        if graph is None:
            return
        with h.lock:
            if not h.vectors.loaded:
                graph.needs_build = False  # warm-up builds it, once the scope vectors are loaded
                return
            chunks = h.vectors.snapshot()
            started = graph.begin_build()
        began = time.monotonic()
        if graph.fill(started, chunks):
            log.info(
                "vector graph of %s built: %d rows in %.1f s", h.uri, graph.rows(), time.monotonic() - began
            )
