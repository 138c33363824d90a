"""The derived search index: one LanceDB table per tenant holding each live memory's
vector and text, with a BM25 full-text index and, past a size threshold, an ANN index.

Everything here can be rebuilt from DuckDB. Filter columns are copied in so filters run
inside LanceDB (prefilter); results are still re-checked against DuckDB by the caller, so a
stale copy here can cost a hit but never show a wrong one. Rows written since the ANN index
last took in every row are also kept in memory and searched there (pending.py), and every
row's vector is kept in memory by scope for exact searches within a few small scopes
(scope_vectors.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from mnemo_server.config import IndexConfig
from mnemo_server.errors import FailedPrecondition, Unavailable
from mnemo_server.index import graph_files
from mnemo_server.index.attrs import ATTR_COLUMNS, Attrs, AttrsCache, read_attrs
from mnemo_server.index.lance_loading import TableLoader
from mnemo_server.index.lance_maintenance import TableMaintenance
from mnemo_server.index.lance_table import (
    TableHandle,
    index_names,
    new_session,
    read_whole_ann_index,
    reader_index_names,
    rows_outside,
    session_bytes,
    settle_pending,
    vector_segments,
)
from mnemo_server.index.residency import ResidencyBounds, ResidencyStats, Resident, has_room, to_drop
from mnemo_server.index.scope_vectors import ScopeVectors
from mnemo_server.index.text_postings import TextPostings
from mnemo_server.index.vector_graph import GraphFeeder, GraphParams, VectorGraph
from mnemo_server.memory.model import MemoryFilter
from mnemo_server.one_thread import OneThreadQueue

log = logging.getLogger(__name__)

_TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")

# What opening or reading a table whose files are damaged (truncated data files, a manifest
# overwritten) raises: LanceDB's open a RuntimeError ("lance error: ..."), Lance's reads an
# OSError or pyarrow's ArrowInvalid (a ValueError). Caught only around those opens and reads.
_DAMAGE_ERRORS = (OSError, ValueError, RuntimeError)


class TableUnreadable(Exception):
    """A tenant's table does not open or read. It is derived from DuckDB: start-up drops it
    and indexes the tenant's memories again."""

    def __init__(self, tenant_id: str, cause: Exception):
        super().__init__(f"the index table of tenant {tenant_id} does not read ({cause})")
        self.tenant_id = tenant_id


@contextmanager
def _reading(tenant_id: str) -> Iterator[None]:
    """Opens and reads of the tenant's table, their failures as TableUnreadable."""
    try:
        yield
    except _DAMAGE_ERRORS as exc:
        raise TableUnreadable(tenant_id, exc) from exc


def _refuse_unwritable(path: Path) -> None:
    """The index writes its tables, its seal and its graphs here. A directory it cannot
    write failed start-up with a traceback (taking the seal) or, once serving, every write."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise FailedPrecondition(
            f"index directory {path} is not writable: {exc.strerror or exc}", reason="BAD_DATA_DIR"
        ) from None


@dataclass(frozen=True)
class IndexRow:
    id: str
    scope: str
    type: str
    category: str
    session: str
    pinned: bool
    event_time_ns: int
    create_time_ns: int
    revision: int
    text: str
    vector: npt.NDArray[np.float32]
    importance: float = 0.5
    seq: int = 0


@dataclass(frozen=True)
class LegHit:
    id: str
    score: float  # higher is better: cosine similarity or BM25
    attrs: Attrs


@dataclass(frozen=True)
class CacheUse:
    """Bytes one tenant's searches keep in memory (GetStatus)."""

    index_session_bytes: int
    scope_vector_bytes: int
    text_posting_bytes: int
    index_row_id_bytes: int
    vector_graph_bytes: int = 0
    vector_graph_rows: int = 0


NO_CACHE_USE = CacheUse(0, 0, 0, 0)


def _row_attrs(r: IndexRow) -> Attrs:
    # float32 round trip: the same value a read from the table gives.
    return Attrs(
        r.text,
        sys.intern(r.scope),
        sys.intern(r.session),
        r.event_time_ns,
        float(np.float32(r.importance)),
        r.seq,
        sys.intern(r.type),
        sys.intern(r.category),
        r.pinned,
        r.create_time_ns,
    )


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(_quote(v) for v in values)})"


def filter_sql(f: MemoryFilter) -> str | None:
    """The filter as a LanceDB (DataFusion SQL) predicate."""
    parts: list[str] = []
    if f.scopes:
        parts.append(_in("scope", [s.key for s in f.scopes]))
    if f.types:
        parts.append(_in("type", [t.value for t in f.types]))
    if f.categories:
        parts.append(_in("category", list(f.categories)))
    if f.source_session_ids:
        parts.append(_in("session", list(f.source_session_ids)))
    if f.pinned_only:
        parts.append("pinned = true")
    for column, tr in (("create_time_ns", f.create_time), ("event_time_ns", f.event_time)):
        if tr.start_ns is not None:
            parts.append(f"{column} >= {_int64(tr.start_ns)}")
        if tr.end_ns is not None:
            parts.append(f"{column} < {_int64(tr.end_ns)}")
    return " AND ".join(parts) if parts else None


def _int64(value: int) -> str:
    """An Int64 literal. DataFusion reads -9223372036854775808 as minus a number too large
    for Int64, then as a float it refuses to compare with the column: so the smallest
    time (-2**63 ns, which the API accepts) is written as an expression."""
    value = int(value)
    return f"({value + 1} - 1)" if value == -(2**63) else str(value)


def size_lance_cpu_pool(threads: int) -> str:
    """Set Lance's CPU pool size for this process unless the environment already does
    (see IndexConfig.lance_cpu_threads); it takes effect if Lance has not made its pool yet,
    i.e. before this process's first Lance operation. Returns the size in force."""
    wanted = threads if threads > 0 else (os.cpu_count() or 1) + 2
    return os.environ.setdefault("LANCE_CPU_THREADS", str(wanted))


class LanceIndex:
    def __init__(self, path: Path, dimension: int, cfg: IndexConfig, graph_dir: Path | None = None):
        """`graph_dir`: where the vector graphs are saved at close and read at warm-up
        (index/graph_files.py); None: built at every start."""
        size_lance_cpu_pool(cfg.lance_cpu_threads)
        import lancedb

        self.path = path
        self.graph_dir = graph_dir
        self.dimension = dimension
        self.cfg = cfg
        _refuse_unwritable(path)
        self._db = lancedb.connect(
            str(path),
            session=lancedb.Session(
                index_cache_size_bytes=cfg.writer_index_cache_mb << 20,
                metadata_cache_size_bytes=cfg.writer_metadata_cache_mb << 20,
            ),
        )
        self._handles: dict[str, TableHandle] = {}
        self._lock = threading.Lock()
        # Tables found absent: a search of a tenant with none (no memory indexed yet) asks
        # on every call, and a failed open costs ~0.6 ms under the lock. Tables are created
        # only by _open, which forgets the name then.
        self._absent: set[str] = set()
        self.bounds = ResidencyBounds(
            cfg.max_resident_tenants, cfg.max_resident_rows, cfg.resident_min_idle_s
        )
        self._loads = 0
        self._drops = 0
        # Loads asked for by searches run on one thread of their own (_await_load).
        self._background_loads = OneThreadQueue("index-loader")
        # Called with a tenant's id once its in-memory indices are loaded (Core: the rows the
        # last run left outside LanceDB's indices are scheduled for folding in).
        self.on_load: Callable[[str], None] | None = None
        # Called after a table whose files did not read was dropped by the loading thread.
        self.on_unreadable: Callable[[str], None] | None = None
        self._graph_params = GraphParams(
            dtype=cfg.graph_dtype,
            expansion_search=cfg.graph_expansion_search,
            max_queued=cfg.graph_max_queued,
        )
        self._loader = TableLoader(cfg, dimension, graph_dir, self._graph_params)
        self._feeder = GraphFeeder(
            save_quiet_s=cfg.graph_save_quiet_s,
            save_changes=cfg.graph_save_changes,
            save_max_wait_s=cfg.graph_save_max_wait_s,
        )
        self._maintenance = TableMaintenance(
            cfg, dimension, wants_ann_index=self._wants_ann_index, wants_text_index=self._wants_text_index
        )
        self.schema = pa.schema(
            [
                pa.field("id", pa.string(), nullable=False),
                pa.field("scope", pa.string()),
                pa.field("type", pa.string()),
                pa.field("category", pa.string()),
                pa.field("session", pa.string()),
                pa.field("pinned", pa.bool_()),
                pa.field("event_time_ns", pa.int64()),
                pa.field("create_time_ns", pa.int64()),
                pa.field("revision", pa.int64()),
                pa.field("text", pa.string()),
                pa.field("importance", pa.float32()),
                pa.field("seq", pa.int64()),
                pa.field("vector", pa.list_(pa.float32(), dimension)),
            ]
        )

    # --- tables ----------------------------------------------------------------------

    @staticmethod
    def table_name(tenant_id: str) -> str:
        if not _TENANT_RE.fullmatch(tenant_id):
            raise ValueError(f"bad tenant id {tenant_id!r}")
        return f"t_{tenant_id}"

    def _handle(self, tenant_id: str, *, create: bool = False, load: bool = True) -> TableHandle | None:
        """The tenant's table, opened if it is not kept (None if it has none and not
        `create`). `load`: a search's, its in-memory indices loaded first if they are not
        (by this call, or by another one it waits for). A search or a write marks it used;
        maintenance and status reads do not."""
        while True:
            h = self._open(tenant_id, create=create)
            if h is None:
                return None
            if load or create:
                h.last_used = time.monotonic()
            if load and not h.ready:
                self._await_load(tenant_id, h)
            if not h.closed:
                return h
            # Dropped between the open and the load (index/residency.py): open it again.

    def _open(self, tenant_id: str, *, create: bool) -> TableHandle | None:
        name = self.table_name(tenant_id)
        with self._lock:
            handle = self._handles.get(name)
            if handle is not None:
                return handle
            if name in self._absent and not create:
                return None
            table = self._existing_table(tenant_id, name)
            existed = table is not None
            if table is None:
                if not create:
                    self._absent.add(name)
                    return None
                table = self._db.create_table(name, schema=self.schema)
            self._absent.discard(name)
            import lance

            session = new_session(self.cfg)
            # The table's folder, as LanceDB names it: asking the table (to_lance) opens the
            # dataset once more, ~1 ms of a ~5 ms open.
            uri = str(self.path / f"{name}.lance")
            with _reading(tenant_id):
                handle = TableHandle(
                    table,
                    uri,
                    lance.dataset(uri, session=session),
                    session,
                    AttrsCache(self.cfg.attrs_cache_rows),
                    ScopeVectors(self.dimension),
                    TextPostings(),
                )
                indices = reader_index_names(handle)
            # A new table is empty: its vectors and texts are all known. An existing one's are
            # loaded at warm-up (load_scope_vectors, load_text_postings); until then LanceDB
            # answers every search.
            handle.vectors.loaded = self._loader.keeps_scope_vectors and not existed
            handle.texts.loaded = self.cfg.memory_text_search and not existed
            if not existed:
                handle.settled.set()
            if self._keeps_graph:
                handle.graph = VectorGraph(self.dimension, self._graph_params)
                if not existed:
                    handle.graph.build([])
                self._feeder.watch(
                    handle.graph,
                    lambda: self._loader.build_graph(handle),
                    (lambda: self._save_graph(name, handle)) if self.graph_dir is not None else None,
                )
            handle.has_text_index = "text_idx" in indices
            if "vector_idx" in indices:
                settle_pending(handle)
            self._handles[name] = handle
            return handle

    def _existing_table(self, tenant_id: str, name: str) -> Any | None:
        """The tenant's table, None if it has none. Opened by name, not looked up in the list
        of tables: listing costs 5-8 us per table (1.6-2.5 ms at 300), at every open and under
        the index's lock, so start-up, which opens every tenant's table, took time in the
        square of the tenants."""
        with _reading(tenant_id):
            try:
                return self._db.open_table(name)
            except ValueError as exc:
                if "was not found" in str(exc):
                    return None
                raise

    def tenants(self) -> list[str]:
        return [n[2:] for n in self._db.list_tables().tables if n.startswith("t_")]

    def layout(self) -> str:
        """The tables this configuration writes: their columns and which LanceDB indices
        they carry (index/in_step.py: a table sealed under another layout is checked)."""
        layout = {"schema": str(self.schema), "ann": self._wants_ann_index, "text": self._wants_text_index}
        return json.dumps(layout, sort_keys=True)

    def table_versions(self) -> dict[str, str]:
        """Per tenant with a table, a digest of its version manifests' names. Every LanceDB
        commit adds a manifest, so any write since (or a copy of the table put back) changes
        it; read from the directory, no table opened (~30 us a table, 2,000 in 62 ms)."""
        versions: dict[str, str] = {}
        for tenant_id in self.tenants():
            folder = self.path / f"{self.table_name(tenant_id)}.lance" / "_versions"
            try:
                with os.scandir(folder) as entries:
                    names = sorted(e.name for e in entries if e.name.endswith(".manifest"))
            except OSError:
                names = []
            versions[tenant_id] = hashlib.blake2b("\n".join(names).encode(), digest_size=16).hexdigest()
        return versions

    @property
    def _keeps_graph(self) -> bool:
        """Whether each tenant has a vector graph: built from the scope vectors, so only
        with them."""
        return self.cfg.vector_graph and self._loader.keeps_scope_vectors

    @property
    def _wants_ann_index(self) -> bool:
        """Whether tables get LanceDB's ANN index. Not with the vector graph: then every
        vector search is answered in memory (_search_in_memory), and the index would only
        cost: each optimize folded the new rows into a delta of it, merging deltas took
        1-2.6 s of CPU at 100k rows (22 s for 23 of them) and, in the bench's mixed phase,
        pushed the server's RSS ~100 MiB past its bound."""
        return not self._keeps_graph

    @property
    def _wants_text_index(self) -> bool:
        """Whether tables get LanceDB's full-text index. Not with the in-memory postings
        (index/text_postings.py), which then answer every full-text search: the index only
        cost each optimize its fold (~0.45 s at 100k rows) and each compaction its remap
        (~0.35 s and ~40 MB more of the compaction's transient memory)."""
        return not self.cfg.memory_text_search

    def drop_outdated(self, tenants: Iterable[str] | None = None) -> list[str]:
        """Drop tables written with another schema (an older server), that do not open, or
        whose ANN index no longer reads; returns their tenants, whose memories must be
        indexed again. The index is derived, so nothing is lost. An ANN or full-text index
        this configuration does not use is dropped from its table. `tenants`: the tables to
        look at (None: every one)."""
        dropped = []
        for tenant_id in self.tenants() if tenants is None else sorted(tenants):
            try:
                h = self._handle(tenant_id, load=False)
            except TableUnreadable as exc:
                log.warning("%s; it will be rebuilt", exc)
                outdated = True
            else:
                if h is None:
                    continue
                self._fit_indices(tenant_id, h)
                outdated = h.reader.schema.names != self.schema.names or not self._ann_reads(tenant_id, h)
            if outdated:
                self.drop(tenant_id)
                dropped.append(tenant_id)
        return dropped

    def drop(self, tenant_id: str) -> None:
        """Drop the tenant's table and its saved vector graph (its memories are to be indexed
        again). LanceDB drops a table whose files do not read as well."""
        name = self.table_name(tenant_id)
        with self._lock:
            self._forget(self._handles.pop(name, None))
            self._db.drop_table(name)
        if self.graph_dir is not None:
            graph_files.discard(self.graph_dir, name)

    def _fit_indices(self, tenant_id: str, h: TableHandle) -> None:
        """Drop the indices this configuration does not use, and make the full-text index it
        needs and the table lacks (index.memory_text_search switched off since the table was
        written): left to the first optimize, the full-text leg found nothing until then,
        and Recalls failed INTERNAL while it was being made (probe)."""
        present = reader_index_names(h)
        wanted = {"vector_idx": self._wants_ann_index, "text_idx": self._wants_text_index}
        unused = [name for name, wants in wanted.items() if name in present and not wants]
        missing_text = self._wants_text_index and "text_idx" not in present and h.table.count_rows() > 0
        if not unused and not missing_text:
            return
        with h.lock:
            for name in unused:
                h.table.drop_index(name)
            if missing_text:
                from lancedb.index import FTS

                h.table.create_index("text", config=FTS(with_position=False), name="text_idx")
            h.table.checkout_latest()
            h.refresh()
            h.pending = None if "vector_idx" in unused else h.pending
            h.has_text_index = (h.has_text_index and "text_idx" not in unused) or missing_text
        if unused:
            log.info("tenant %s: unused LanceDB indices dropped: %s", tenant_id, ", ".join(unused))
        if missing_text:
            log.info("tenant %s: full-text index made for index.memory_text_search = false", tenant_id)

    def _ann_reads(self, tenant_id: str, h: TableHandle) -> bool:
        """Whether a search probing every partition of the ANN index succeeds. Compaction
        with a deferred remap (servers before this check) could leave a delta that fails
        every search that reaches it ("HNSW graph has N nodes but its vector storage has
        M rows"). Once at start-up: ~1 s at 100k rows, nearly all of it loading the index
        into the session cache, which the first searches would pay otherwise."""
        if "vector_idx" not in reader_index_names(h):
            return True
        try:
            read_whole_ann_index(h.reader, self.dimension)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            log.warning("tenant %s: the ANN index does not read (%s); it will be rebuilt", tenant_id, exc)
            return False
        return True

    # --- writes ----------------------------------------------------------------------

    def upsert(self, tenant_id: str, rows: Sequence[IndexRow]) -> None:
        if not rows:
            return
        data = pa.table(
            {
                "id": [r.id for r in rows],
                "scope": [r.scope for r in rows],
                "type": [r.type for r in rows],
                "category": [r.category for r in rows],
                "session": [r.session for r in rows],
                "pinned": [r.pinned for r in rows],
                "event_time_ns": [r.event_time_ns for r in rows],
                "create_time_ns": [r.create_time_ns for r in rows],
                "revision": [r.revision for r in rows],
                "text": [r.text for r in rows],
                "importance": [r.importance for r in rows],
                "seq": [r.seq for r in rows],
                "vector": pa.FixedSizeListArray.from_arrays(
                    pa.array(np.concatenate([r.vector for r in rows]).astype(np.float32)), self.dimension
                ),
            },
            schema=self.schema,
        )
        with self._writable(tenant_id, create=True) as h:
            assert h is not None
            if h.pending is not None:
                h.pending = h.pending.with_rows(rows)
            # A merge on id costs twice an append's CPU and keeps ~1.5 KB of native memory
            # per row (measured at 100k rows), and most rows are new: those are appended.
            # This worker is the only writer and holds the lock, so the check stays true.
            present = self._scopes_of(h, [r.id for r in rows])
            fresh = pa.array([r.id not in present for r in rows])
            if present:
                h.table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
                    data.filter(pc.invert(fresh))
                )
            if len(present) < len(rows):
                h.table.add(data.filter(fresh))
            h.attrs.remember([(r.id, _row_attrs(r)) for r in rows], overwrite=True)
            if h.vectors.loaded:
                h.vectors.put([(r.id, r.scope, r.vector) for r in rows], present)
            if h.texts.loaded:
                h.texts.put([(r.id, r.scope, r.text) for r in rows])
            if h.graph is not None:
                h.graph.put([(r.id, r.vector) for r in rows])
                self._feeder.poke()
            if not h.has_text_index and self._wants_text_index:
                from lancedb.index import FTS

                h.table.create_index("text", config=FTS(with_position=False), name="text_idx")
                h.refresh()
                h.has_text_index = True  # once the reader holds it (see lance_maintenance)
            else:
                h.refresh()

    @staticmethod
    def _scopes_of(h: TableHandle, ids: list[str]) -> dict[str, str]:
        """The scope of each of these ids the table holds. The postings hold every row once
        loaded (kept by these same writes, under the table lock), so they answer; the table
        answers with a filtered scan whose cost grows with its fragments (in-process, single
        creates 35 ms apart with no compaction running: ~18 ms of Lance's CPU a batch)."""
        if h.texts.loaded:
            return h.texts.scopes_of(ids)
        data = h.reader.to_table(columns=["id", "scope"], filter=_in("id", ids))
        return dict(zip(data.column("id").to_pylist(), data.column("scope").to_pylist(), strict=True))

    def delete(self, tenant_id: str, ids: Sequence[str]) -> None:
        if not ids:
            return
        with self._writable(tenant_id, create=False) as h:
            if h is None:
                return
            for start in range(0, len(ids), 500):
                part = list(ids[start : start + 500])
                scopes = self._scopes_of(h, part) if h.vectors.loaded else {}
                h.table.delete(_in("id", part))
                h.vectors.remove(scopes)
                h.texts.remove(part)
                if h.graph is not None:
                    h.graph.remove(part)
            if h.pending is not None:
                h.pending = h.pending.without(ids)
            h.attrs.forget(ids)
            h.refresh()

    def drop_all(self) -> None:
        with self._lock:
            for name in list(self._db.list_tables().tables):
                self._db.drop_table(name)
            for h in self._handles.values():
                self._forget(h)
            self._handles.clear()
        if self.graph_dir is not None:
            graph_files.discard(self.graph_dir)

    def _forget(self, h: TableHandle | None) -> None:
        if h is not None and h.graph is not None:
            self._feeder.forget(h.graph)

    def close(self) -> None:
        """Stop loading and feeding the vector graphs (their queued writes are in the table
        already) and save them, with those writes, for the next start."""
        self._background_loads.stop()
        self._feeder.stop()
        if self.graph_dir is None:
            return
        for name, h in list(self._handles.items()):
            if h.graph is not None:
                h.graph.drain()
                if h.graph.unsaved:
                    self._save_graph(name, h)

    def _save_graph(self, name: str, h: TableHandle) -> None:
        """Save a tenant's built graph: the feeder's call once writes paused, or close's once
        the feeder stopped (nothing else changes a built graph)."""
        kept = h.graph
        graph = kept.current() if kept is not None else None
        if self.graph_dir is None or kept is None or graph is None:
            return
        began = time.monotonic()
        try:
            saved = graph_files.save(self.graph_dir, name, graph, self.dimension, self._graph_params)
        except Exception:  # a cache: the next start repairs an older save or builds it
            log.exception("saving the vector graph of %s failed", h.uri)
        else:
            if saved is not None:
                log.info("vector graph of %s saved in %.2f s", h.uri, time.monotonic() - began)
        finally:
            kept.mark_saved()  # after a failure too: tried again once as many writes reached it

    # --- maintenance (index/lance_maintenance.py) ---------------------------------------

    def compact(self, tenant_id: str) -> int:
        """Merge the small fragments appends leave behind (TableMaintenance.compact).
        Returns fragments removed."""
        h = self._handle(tenant_id, load=False)
        return 0 if h is None else self._maintenance.compact(h)

    def optimize(
        self, tenant_id: str, *, merge_deltas: bool = True, max_deltas: int | None = None
    ) -> dict[str, Any]:
        """Compact, fold new rows into the indices, make them once the table is large enough,
        drop old versions and merge small ANN deltas (TableMaintenance.optimize). Returns
        what was done."""
        h = self._handle(tenant_id, load=False)
        if h is None:
            return {}
        return self._maintenance.optimize(h, merge_deltas=merge_deltas, max_deltas=max_deltas)

    def vector_deltas(self, tenant_id: str) -> int:
        h = self._handle(tenant_id, load=False)
        return 0 if h is None else len(vector_segments(h))

    def cache_use(self, tenant_id: str) -> CacheUse:
        """What this tenant's searches keep in memory (zeros for a tenant with no table, or
        whose table is not kept: this opens nothing)."""
        with self._lock:
            h = self._handles.get(self.table_name(tenant_id))
        if h is None:
            return NO_CACHE_USE
        return CacheUse(
            index_session_bytes=session_bytes(h, self.cfg.session_measure_max_share),
            scope_vector_bytes=h.vectors.nbytes() if h.vectors.loaded else 0,
            text_posting_bytes=h.texts.nbytes() if h.texts.loaded else 0,
            index_row_id_bytes=h.ids.nbytes(),
            vector_graph_bytes=h.graph.nbytes() if h.graph is not None else 0,
            vector_graph_rows=h.graph.rows() if h.graph is not None else 0,
        )

    def stats(self, tenant_id: str) -> dict[str, Any]:
        h = self._handle(tenant_id, load=False)
        if h is None:
            return {"rows": 0, "indices": {}}
        return {
            "rows": h.table.count_rows(),
            "version": h.reader.version,
            "fragments": len(h.reader.get_fragments()),
            # Rows outside the ANN index searched in memory (None: LanceDB scans them).
            "pending_rows": None if h.pending is None else len(h.pending),
            # Rows whose vectors are kept by scope (None: not loaded, scoped searches go to LanceDB).
            "scope_vector_rows": h.vectors.rows() if h.vectors.loaded else None,
            # Rows in the in-memory full-text postings (None: not loaded, LanceDB answers).
            "text_posting_rows": h.texts.rows() if h.texts.loaded else None,
            # Rows in the vector graph and writes queued for it (None: not built).
            "graph_rows": h.graph.rows() if h.graph is not None and h.graph.built else None,
            "graph_queued": h.graph.queued() if h.graph is not None else None,
            "indices": {
                n: {"indexed": ix.num_indexed_rows, "unindexed": ix.num_unindexed_rows}
                for n, ix in index_names(h.table).items()
            },
        }

    def unindexed_rows(self, tenant_id: str) -> int:
        """Rows the full-text index does not cover yet (searched flat until optimize); none
        without one: the in-memory postings take every row as it is written."""
        if not self._wants_text_index:
            return 0  # opening nothing: GetStatus asks
        h = self._handle(tenant_id, load=False)
        if h is None:
            return 0
        if not h.has_text_index:
            return int(h.reader.count_rows())
        return rows_outside(h, "text_idx") or 0

    def rows_to_fold(self, tenant_id: str) -> int:
        """Rows outside the indices that only an optimize takes in: those the full-text
        index does not cover, or the ANN index's while the rows outside it are not known
        (searches then scan them flat in LanceDB). After a restart both are what the last
        run wrote after its last optimize."""
        h = self._handle(tenant_id, load=False)
        if h is None:
            return 0
        outside_ann = (rows_outside(h, "vector_idx") or 0) if h.pending is None else 0
        return max(outside_ann, self.unindexed_rows(tenant_id))

    # --- reads -----------------------------------------------------------------------

    def count(self, tenant_id: str) -> int:
        h = self._handle(tenant_id, load=False)
        return 0 if h is None else int(h.reader.count_rows())

    def revisions(self, tenant_id: str) -> dict[str, int]:
        """id -> indexed revision, for reconciliation."""
        h = self._handle(tenant_id, load=False)
        if h is None:
            return {}
        data = h.reader.to_table(columns=["id", "revision"])
        return dict(zip(data.column("id").to_pylist(), data.column("revision").to_pylist(), strict=True))

    def rows(self, tenant_id: str, ids: Sequence[str]) -> dict[str, tuple[Attrs, npt.NDArray[np.float32]]]:
        """Stored attributes and vectors by id (for candidates no leg returned)."""
        h = self._handle(tenant_id, create=False)
        if h is None or not ids:
            return {}
        data = h.reader.to_table(columns=["id", "vector"], filter=_in("id", list(ids)))
        vectors = data.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        matrix = np.asarray(vectors, dtype=np.float32).reshape(-1, self.dimension)
        found = data.column("id").to_pylist()
        attrs = self._attrs_of(h, found)
        return {i: (attrs[i], v) for i, v in zip(found, matrix, strict=True) if i in attrs}

    def cosines(
        self, tenant_id: str, vector: npt.NDArray[np.float32], hits: Sequence[LegHit]
    ) -> dict[str, float]:
        """The cosine of each hit's row with vector (for rows another leg found): from the
        scope vectors when loaded (microseconds), else read from the table (a scan of the id
        column: milliseconds at 100k). A row gone meanwhile is left out."""
        h = self._handle(tenant_id, create=False)
        if h is None or not hits:
            return {}
        if h.vectors.loaded:
            return h.vectors.cosines(vector, {hit.id: hit.attrs.scope for hit in hits})
        return {
            mid: float(v @ vector) for mid, (_, v) in self.rows(tenant_id, [hit.id for hit in hits]).items()
        }

    def vector_search(
        self, tenant_id: str, vector: npt.NDArray[np.float32], k: int, f: MemoryFilter
    ) -> list[LegHit]:
        h = self._handle(tenant_id, create=False)
        if h is None:
            return []
        if h.graph is not None and h.vectors.loaded:
            found = self._search_in_memory(h, vector, k, f)
            return self._leg_hits(h, [i for i, _ in found], [s for _, s in found])
        scopes = [s.key for s in f.scopes]
        if self._exact_in_memory(h, f, scopes):
            found = h.vectors.search(vector, k, scopes)
            return self._leg_hits(h, [i for i, _ in found], [s for _, s in found])
        # The pending rows before the snapshot: an optimize folds rows in, then clears them
        # here, so this order sees each row in one place or both, never in neither.
        pending, reader = h.pending, h.reader
        nearest = {
            "column": "vector",
            "q": vector,
            "k": k,
            "metric": "cosine",
            "nprobes": self.cfg.ann_nprobes,
        }
        result = reader.to_table(
            columns=["_distance"],
            with_row_address=True,
            nearest=nearest,
            filter=filter_sql(f),
            prefilter=True,
            fast_search=pending is not None,
        )
        hit_ids = h.ids.ids_at(reader, result.column("_rowaddr").to_pylist())
        dists = result.column("_distance").to_pylist()
        scores = {i: 1.0 - float(d) for i, d in zip(hit_ids, dists, strict=True) if i is not None}
        ids = list(scores)
        if pending:
            # A row written again is in both: its pending copy is the newer one.
            scores.update(pending.search(vector, k, f))
            ids = sorted(scores, key=lambda i: -scores[i])[:k]
        return self._leg_hits(h, ids, [scores[i] for i in ids])

    def _search_in_memory(
        self, h: TableHandle, vector: npt.NDArray[np.float32], k: int, f: MemoryFilter
    ) -> list[tuple[str, float]]:
        """With the graph, LanceDB keeps no ANN index (see _wants_ann_index): an unfiltered
        search asks the graph; one filtered on other columns but no scopes asks it for more
        and keeps the hits that pass, while that finds k of them (_then_filter); any
        other scans the filter's scopes (every row if it names none) exactly, limited to the
        rows LanceDB finds passing the rest of the filter. At 100k rows a scan of every row
        takes ~9 ms of CPU, the ids matching a filter that half the rows pass ~15 ms more."""
        assert h.graph is not None
        if f.is_empty:
            in_graph = h.graph.search(vector, k)
            if in_graph is not None:
                return in_graph
        elif not f.scopes:
            graph = h.graph
            kept = self._then_filter(h, k, f, lambda wanted: graph.search(vector, wanted))
            if kept is not None:
                return kept
        scopes = [s.key for s in f.scopes] or None
        allowed = None if f.scopes_only else self._ids_matching(h, f)
        if allowed is not None and not allowed:
            return []
        return h.vectors.search(vector, k, scopes, allowed)

    @staticmethod
    def _ids_matching(h: TableHandle, f: MemoryFilter) -> frozenset[str]:
        """The ids of the rows that pass a filter, read from the table (scalar columns only).
        A row written after this read is left out of the search, as it would be from an
        index search a moment earlier; DuckDB checks every hit that is returned. The last
        answer is kept for the same snapshot and filter: a Recall's vector and full-text
        legs ask the same (at 100k rows the ids of a filter half the rows pass: ~15 ms of CPU)."""
        reader = h.reader
        kept = h.last_matching
        if kept is not None and kept[0] is reader and kept[1] == f:
            return kept[2]
        result = reader.to_table(columns=[], filter=filter_sql(f), with_row_address=True)
        ids = frozenset(
            i for i in h.ids.ids_at(reader, result.column("_rowaddr").to_numpy()) if i is not None
        )
        h.last_matching = (reader, f, ids)
        return ids

    def scope_rows(self, tenant_id: str, scope_key: str) -> int | None:
        """Indexed rows in a scope, from the scope vectors; None while they are not loaded."""
        h = self._handle(tenant_id, create=False)
        return None if h is None or not h.vectors.loaded else h.vectors.rows_in([scope_key])

    def _exact_in_memory(self, h: TableHandle, f: MemoryFilter, scopes: list[str]) -> bool:
        """Whether a search is answered from the scope vectors: filtered by scopes alone,
        few enough rows to scan (past ~30k rows at 100k a scan costs more than LanceDB's)."""
        return (
            h.vectors.loaded
            and bool(scopes)
            and f.scopes_only
            and h.vectors.rows_in(scopes) <= self.cfg.exact_scope_search_max_rows
        )

    def text_search(self, tenant_id: str, query: str, k: int, f: MemoryFilter) -> list[LegHit]:
        h = self._handle(tenant_id, create=False)
        if h is None or not query.strip():
            return []
        if not self._wants_text_index:
            if not f.scopes and not f.is_empty:
                # Exactly the filtered search's answer: BM25 scores do not depend on the filter.
                kept = self._then_filter(h, k, f, lambda wanted: h.texts.search(query, wanted))
                if kept is not None:
                    return self._leg_hits(h, [i for i, _ in kept], [s for _, s in kept])
            allowed = None if f.scopes_only else self._ids_matching(h, f)
            if allowed is not None and not allowed:
                return []
            found = h.texts.search(query, k, [s.key for s in f.scopes] or None, allowed)
            return self._leg_hits(h, [i for i, _ in found], [s for _, s in found])
        if not h.has_text_index:
            return []
        result = h.reader.to_table(
            columns=["id", "_score"], full_text_query=query, filter=filter_sql(f), prefilter=True, limit=k
        )
        ids = result.column("id").to_pylist()
        scores = result.column("_score").to_pylist()
        return self._leg_hits(h, ids, [float(s) for s in scores])

    # A search filtered without scopes asks the graph (or the postings) for k x each of these
    # in turn until k hits pass the filter (_then_filter).
    _OVERSAMPLING = (4, 16)

    def _then_filter(
        self,
        h: TableHandle,
        k: int,
        f: MemoryFilter,
        search: Callable[[int], list[tuple[str, float]] | None],
    ) -> list[tuple[str, float]] | None:
        """The hits of an unfiltered `search` for k x 4, then k x 16, that pass the filter,
        once k of them pass or the search ran out of rows; None when it cannot answer or
        when the share of the first round's hits that passed says the second would not
        find k either (a filter few rows pass: the scan is then cheaper)."""
        first, last = self._OVERSAMPLING
        for factor in self._OVERSAMPLING:
            wanted = k * factor
            found = search(wanted)
            if found is None:
                return None
            attrs = self._attrs_of(h, [i for i, _ in found])
            kept = [(i, s) for i, s in found if (a := attrs.get(i)) is not None and a.passes(f)]
            if len(kept) >= k or len(found) < wanted:
                return kept[:k]
            if factor == first and len(kept) * last < k * first:
                return None
        return None

    # --- residency (index/residency.py) -----------------------------------------------

    def _load(self, tenant_id: str, h: TableHandle) -> None:
        """Load a kept table's in-memory indices, once: the loading thread's work, or
        warm-up's (a second caller waits under load_lock, then finds it done). Writes go on
        meanwhile (each load reads under the table lock)."""
        with h.load_lock:
            if h.settled.is_set():  # loaded, or dropped
                return
            began = time.monotonic()
            with _reading(tenant_id):
                rows = self._loader.load(self.table_name(tenant_id), h)
            h.settled.set()
            with self._lock:
                self._loads += 1
        log.info("index of tenant %s loaded: %d rows in %.2f s", tenant_id, rows, time.monotonic() - began)
        if self.on_load is not None:
            self.on_load(tenant_id)

    def _load_or_drop(self, tenant_id: str, h: TableHandle) -> None:
        """The loading thread's load. A table whose files do not read is dropped, and
        `on_unreadable` has its tenant indexed again: retried at every search instead, its
        load failed for good, and each of the tenant's searches waited index.load_wait_s for
        UNAVAILABLE until a restart (whose warm-up reaches only the resident tenants)."""
        try:
            self._load(tenant_id, h)
        except TableUnreadable as exc:
            log.warning("%s; dropped to be indexed again", exc)
            with h.lock:  # no write into it from now on: writes open the table again
                h.closed = True
                h.settled.set()  # a search waiting for the load opens it again, and finds none
            self.drop(tenant_id)
            if self.on_unreadable is not None:
                self.on_unreadable(tenant_id)

    def _await_load(self, tenant_id: str, h: TableHandle) -> None:
        """A search's wait for the tenant's indices: their load is queued (once) for the
        loading thread, and waited for at most index.load_wait_s; then UNAVAILABLE, which
        clients retry. Never loaded inside the call: a compute slot held for a large
        tenant's load (5-7 s for 100k rows) would hold back every tenant's searches."""
        self._background_loads.submit(id(h), lambda: self._load_or_drop(tenant_id, h))  # once per handle
        if not h.settled.wait(self.cfg.load_wait_s) and not h.closed:
            raise Unavailable(
                f"the search index of tenant {tenant_id} is being loaded into memory; retry shortly",
                reason="INDEX_LOADING",
            )

    def warm(self, tenant_id: str) -> dict[str, int]:
        """Load the tenant's in-memory indices in this thread and run a search of each kind
        (start-up pays what the first searches would). Returns the rows each holds; raises
        TableUnreadable if its table does not open or read."""
        h = self._handle(tenant_id, load=False)
        if h is None:
            return {}
        h.last_used = time.monotonic()
        with _reading(tenant_id):  # the first read of every row since the process started
            self._load(tenant_id, h)
            self.vector_search(tenant_id, np.ones(self.dimension, dtype=np.float32), 1, MemoryFilter())
            self.text_search(tenant_id, "warm", 1, MemoryFilter())
        return {
            "attrs": len(h.attrs),
            "scope_vectors": h.vectors.rows() if h.vectors.loaded else 0,
            "text_postings": h.texts.rows() if h.texts.loaded else 0,
            "vector_graph": h.graph.rows() if h.graph is not None else 0,
        }

    def tenants_newest_first(self) -> list[str]:
        """Every tenant with a table, the most recently written first (each write commits a
        new version file into the table's _versions directory)."""

        def written(tenant_id: str) -> float:
            try:
                return (self.path / f"{self.table_name(tenant_id)}.lance" / "_versions").stat().st_mtime
            except OSError:
                return 0.0

        return sorted(self.tenants(), key=written, reverse=True)

    @staticmethod
    def _rows_in_memory(h: TableHandle) -> int:
        if not h.ready:
            return 0
        return max(h.vectors.rows() if h.vectors.loaded else 0, h.texts.rows() if h.texts.loaded else 0)

    def _kept(self) -> list[Resident]:
        with self._lock:
            handles = list(self._handles.items())
        return [Resident(name, h.last_used, self._rows_in_memory(h)) for name, h in handles]

    def has_room(self) -> bool:
        """Whether the loaded tenants leave room to load one more (start-up's warm-up; the
        tables it opened without loading them do not count)."""
        with self._lock:
            loaded = [h for h in self._handles.values() if h.ready]
        return has_room(len(loaded), sum(self._rows_in_memory(h) for h in loaded), self.bounds)

    def residency(self) -> ResidencyStats:
        kept = self._kept()
        with self._lock:
            loads, drops = self._loads, self._drops
        return ResidencyStats(
            tenants=len(kept),
            rows=sum(r.rows for r in kept),
            max_tenants=self.bounds.max_tenants,
            max_rows=self.bounds.max_rows,
            loads=loads,
            drops=drops,
        )

    def is_kept(self, tenant_id: str) -> bool:
        with self._lock:
            h = self._handles.get(self.table_name(tenant_id))
        return h is not None and h.ready

    def trim(self) -> list[str]:
        """Drop the least recently used tenants past the residency bounds (the maintenance
        schedule's call). Returns the tenants dropped."""
        with self._lock:
            ready = {name for name, h in self._handles.items() if h.ready}
        dropped = [n for n in to_drop(self._kept(), self.bounds, time.monotonic()) if self._drop(n)]
        # One line a pass (a busy bound drops hundreds of tenants an hour), naming only those
        # whose indices were in memory: a table only opened (by start-up's checks, a write,
        # a status call) held nothing to speak of.
        unloaded = [n[2:] for n in dropped if n in ready]
        if unloaded:
            more = f" and {len(unloaded) - 10} more" if len(unloaded) > 10 else ""
            log.info(
                "indices of %d tenant(s) dropped from memory (index.max_resident_*): %s%s",
                len(unloaded),
                ", ".join(unloaded[:10]),
                more,
            )
        return [n[2:] for n in dropped]

    def _drop(self, name: str) -> bool:
        """Forget a kept table: its vector graph saved first (with every write queued for
        it), so that its next load reads it instead of building it. Not one queued for its
        load or being loaded."""
        with self._lock:
            h = self._handles.get(name)
            if h is None or self._background_loads.pending(id(h)) or not h.load_lock.acquire(blocking=False):
                return False
        try:
            if h.graph is not None:
                self._feeder.forget(h.graph, wait=True)  # then nothing else changes the graph
            with h.lock:
                if h.graph is not None and self.graph_dir is not None:
                    h.graph.drain()
                    if h.graph.unsaved:
                        self._save_graph(name, h)
                h.closed = True
                h.settled.set()  # a search waiting for its load opens the table again
                with self._lock:
                    if self._handles.get(name) is h:
                        del self._handles[name]
                    self._drops += 1
        finally:
            h.load_lock.release()
        return True

    @contextmanager
    def _writable(self, tenant_id: str, *, create: bool) -> Iterator[TableHandle | None]:
        """The tenant's table with its lock held, for a write that must reach the in-memory
        indices of the handle searches use: one dropped meanwhile is opened again."""
        while True:
            h = self._handle(tenant_id, create=create, load=False)
            if h is None:
                yield None
                return
            with h.lock:
                if not h.closed:
                    yield h
                    return

    # --- hit attributes -----------------------------------------------------------------

    def attrs(self, tenant_id: str, ids: Sequence[str]) -> dict[str, Attrs]:
        """Indexed attributes by id (from the cache when there); ids not indexed are absent."""
        h = self._handle(tenant_id, create=False)
        return {} if h is None or not ids else self._attrs_of(h, ids)

    def _attrs_of(self, h: TableHandle, ids: Sequence[str]) -> dict[str, Attrs]:
        found, missing = h.attrs.lookup(ids)
        if missing:
            data = h.reader.to_table(columns=["id", *ATTR_COLUMNS], filter=_in("id", missing))
            read = read_attrs(data)
            h.attrs.remember(read, overwrite=False)
            found.update(read)
        return found

    def _leg_hits(self, h: TableHandle, ids: list[str], scores: list[float]) -> list[LegHit]:
        """A hit whose row is gone by the time its attributes are read is dropped."""
        attrs = self._attrs_of(h, ids)
        return [LegHit(i, s, attrs[i]) for i, s in zip(ids, scores, strict=True) if i in attrs]
