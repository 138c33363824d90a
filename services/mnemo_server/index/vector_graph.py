"""A tenant's vectors in an in-process HNSW graph (usearch), for vector searches with no filter.

LanceDB's ANN search costs ~5.3 ms of CPU per query at 100k rows, most of a Recall's vector
leg and a third of the server's CPU under Recalls alone; a usearch graph over the same
vectors answers in 0.2-0.4 ms (connectivity 16, expansion 64; ~63 MiB resident per 100k
rows). Filtered searches stay with the scope vectors and LanceDB: the graph holds no
attributes.

The graph is given the rows' int8 codes with a scale per row (quantize(), as the scope
vectors keep them), not float vectors: usearch casts floats to int8 with one scale for all
(~5 of 8 bits used by MiniLM's vectors), and over the settled 100k vectors that kept 0.948
of an exact search's top 10 where the codes keep 0.992; cosine ignores the per-row scale.

Writes reach the graph through a queue that `GraphFeeder` drains in the background, never on
the index worker's path: usearch's add takes the GIL back after every vector (to check for
signals), so beside busy Python threads each vector costs up to a switch interval (~5 ms
measured against one spinning thread, 0.35 ms alone). A search merges what is still queued:
queued rows are scored exactly, and an id with a queued write or removal is taken from the
queue, not from the graph. Past `max_queued` waiting writes (a bulk load) the graph is
dropped, LanceDB answers, and once the tenant's writes have been quiet for a moment the feeder
builds it again from the scope vectors (int8 with a scale per row, index/scope_vectors.py) in
one go, which costs far less than the adds one by one.

A row removed or written again is never removed from usearch: its node stays as a ghost
that no search returns (HnswGraph.remove says why), and once ghosts pass MAX_GHOST_SHARE of
the nodes the feeder builds the graph afresh while the old one goes on answering.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mnemo_server.index.scope_vectors import quantize

log = logging.getLogger(__name__)

# Vectors the feeder adds per hold of the graph lock: searches wait at most this many adds.
_ADDS_PER_HOLD = 4
# Past this share of ghosts among a graph's nodes it is built afresh: a ghost costs memory
# and a place in searches' answers, and a rebuild ~40 s of one core per 100k rows.
MAX_GHOST_SHARE = 0.2
# A graph's fresh builds start at most this often: one that could not start (its scope
# vectors not loaded) would otherwise be tried again at once, and again.
_FRESH_EVERY_S = 60.0


@dataclass(frozen=True)
class GraphParams:
    connectivity: int = 16
    expansion_add: int = 128
    expansion_search: int = 64
    dtype: str = "i8"
    max_queued: int = 2_000


# (ids, int8 codes) of rows to fill a graph with, as quantize() makes them.
Chunks = Iterable[tuple[Sequence[str], npt.NDArray[np.int8]]]


@dataclass(frozen=True)
class _Queued:
    """A queued row's codes and scale: its exact cosine with a unit query is codes @ q x scale."""

    codes: npt.NDArray[np.int8]
    scale: float


class HnswGraph:
    """The usearch index and its keys: replaced whole when the graph is dropped or rebuilt."""

    def __init__(self, dimension: int, params: GraphParams):
        from usearch.index import Index

        self.index = Index(
            ndim=dimension,
            metric="cos",
            dtype=params.dtype,
            connectivity=params.connectivity,
            expansion_add=params.expansion_add,
            expansion_search=params.expansion_search,
        )
        # Every call into usearch holds it: its Python binding does not say which calls may
        # overlap (a search's scratch space, a capacity grown under a search, a size read
        # beside an add that grows the index crashed the process), so none do. A search
        # costs ~0.25 ms, and the feeder adds a few vectors per hold.
        self.lock = threading.Lock()
        # id -> key and back; a row written again gets a new key (its old one a ghost).
        self.key_of: dict[str, int] = {}
        self.id_of: dict[int, str] = {}
        self.next_key = 0
        # Nodes of rows removed or written again since the graph was made (see remove).
        self.ghosts = 0

    def add(self, ids: Sequence[str], codes: npt.NDArray[np.int8]) -> None:
        """One thread: usearch's add on several threads leaves some nodes stored yet
        unreachable by any search (usearch issue #735, open in 2.x). Measured here: on 2
        threads a build left 9 of 2,000 (400 rows, 32 dims) and 14 of 25,000 (5k rows, 384
        dims) rows missing from their own vector's top hit; on one thread none."""
        keys = np.arange(self.next_key, self.next_key + len(ids), dtype=np.uint64)
        self.next_key += len(ids)
        with self.lock:
            self.index.add(keys, codes, threads=1)
        for mid, key in zip(ids, keys.tolist(), strict=True):
            self.key_of[mid] = key
            self.id_of[key] = mid

    def remove(self, ids: Iterable[str]) -> None:
        """Forget the rows: their nodes stay in usearch as ghosts, which searches skip.
        usearch's own remove frees a node's slot for the next add, which then puts another
        vector under the links that led to the old one: after enough updates whole
        neighbourhoods have no link left leading in, and rows nobody touched are never found
        (measured: 24 of 48 untouched notes missing from their own vector's top 10 after 600
        content updates among 348 rows; none with ghosts). A ghost keeps its links."""
        gone = [self.key_of.pop(mid) for mid in ids if mid in self.key_of]
        for key in gone:
            del self.id_of[key]
        self.ghosts += len(gone)

    def ghost_share(self) -> float:
        return self.ghosts / max(1, self.ghosts + len(self.key_of))

    def nearest(self, codes: npt.NDArray[np.int8], k: int, skip: Collection[str]) -> dict[str, float]:
        """Up to k rows nearest to the codes, leaving out those in `skip`: id -> cosine.
        Ghosts and skipped rows take places in usearch's answer, so a short answer is asked
        again for more until it has k rows or holds the whole graph."""
        count = k + len(skip) + min(self.ghosts, k)
        while True:
            with self.lock:
                found = self.index.search(codes, count, threads=1)
                nodes = len(self.index)
            scores: dict[str, float] = {}
            for key, distance in zip(found.keys.tolist(), found.distances.tolist(), strict=True):
                mid = self.id_of.get(key)
                if mid is not None and mid not in skip:
                    scores[mid] = 1.0 - float(distance)
            if len(scores) >= k or count >= nodes:
                return scores
            count = min(count * 4, nodes)

    def differences(self, chunks: Chunks) -> tuple[list[str], list[tuple[list[str], npt.NDArray[np.int8]]]]:
        """What stands between this graph and a snapshot of the rows: the ids to remove (rows
        gone, or held with other codes) and the (ids, codes) to add (rows new, or changed).
        Changes nothing; for a graph saved earlier (index/graph_files.py)."""
        seen: set[str] = set()
        stale: list[str] = []
        adds: list[tuple[list[str], npt.NDArray[np.int8]]] = []
        for ids, codes in chunks:
            seen.update(ids)
            keys = [self.key_of.get(mid) for mid in ids]
            same = np.zeros(len(ids), dtype=bool)
            held = [n for n, key in enumerate(keys) if key is not None]
            if held:
                with self.lock:  # one vector (or None) per key, as a tuple
                    stored = self.index.get(np.asarray([keys[n] for n in held], dtype=np.uint64), "i8")
                assert isinstance(stored, tuple)
                for n, vector in zip(held, stored, strict=True):
                    same[n] = vector is not None and bool(np.array_equal(vector, codes[n]))
                    if not same[n]:
                        stale.append(ids[n])
            new = np.flatnonzero(~same)
            if len(new):
                adds.append(([ids[int(n)] for n in new], codes[new]))
        stale.extend(mid for mid in self.key_of if mid not in seen)
        return stale, adds


class VectorGraph:
    """One tenant's graph and the writes queued for it. Writers call put/remove (cheap, any
    thread, the table lock held); the feeder calls apply_queued and rebuilds; searches call
    search. Until built (build, or begin_build + fill) it answers nothing and queues nothing,
    and it is dropped again when too many writes wait."""

    def __init__(self, dimension: int, params: GraphParams):
        self.dimension = dimension
        self.params = params
        # Guards the queue and which graph is current (each graph has its own lock for usearch).
        self._lock = threading.Lock()
        self._graph: HnswGraph | None = None
        self.built = False
        # While a fresh graph fills, the one it replaces answers (with the queue written since).
        self._serving: HnswGraph | None = None
        # Dropped for too many queued writes: the feeder builds it again once writes pause.
        self.needs_build = False
        self._last_write = 0.0
        # Writes applied since the graph was last saved (a graph built afresh counts its rows).
        self.unsaved = 0
        self._last_save = time.monotonic()  # or when this object was made
        # Queued writes in order; None as a vector is a removal. Newest per id in _latest.
        self._queue: list[tuple[str, _Queued | None]] = []
        self._latest: dict[str, _Queued | None] = {}

    # --- building --------------------------------------------------------------------

    def begin_build(self, graph: HnswGraph | None = None) -> HnswGraph:
        """Start a new graph (or take one loaded from a file); every write from now on is
        queued for it. The caller holds the table lock and takes the snapshot of the rows to
        fill it with under the same hold. A built graph with nothing queued holds exactly
        that snapshot, so it answers (beside the queue) until the new one is filled."""
        with self._lock:
            self._serving = self._graph if self.built and not self._queue else None
            self._graph = graph if graph is not None else HnswGraph(self.dimension, self.params)
            self.built = self.needs_build = False
            self._queue, self._latest = [], {}
            return self._graph

    def fill(self, graph: HnswGraph, chunks: Chunks) -> bool:
        """Add the snapshot's rows to a graph from begin_build, then let searches use it
        (the writes queued meanwhile are still searched from the queue until applied).
        False if the graph was dropped meanwhile."""
        added = 0
        for ids, codes in chunks:
            if self._graph is not graph:
                return False
            if len(ids):
                graph.add(ids, codes)
                added += len(ids)
        with self._lock:
            if self._graph is not graph:
                return False
            self.built = True
            self._serving = None
            self.unsaved += added
            return True

    def build(self, chunks: Chunks) -> bool:
        return self.fill(self.begin_build(), chunks)

    def current(self) -> HnswGraph | None:
        """The graph searches use (None while it is dropped or being built)."""
        with self._lock:
            return self._graph if self.built else None

    def wants_build(self, quiet_s: float) -> bool:
        return self.needs_build and time.monotonic() - self._last_write >= quiet_s

    def wants_fresh(self) -> bool:
        """Built, every write applied, and more than MAX_GHOST_SHARE of its nodes ghosts:
        worth building afresh (the old graph answers meanwhile, so no quiet is needed)."""
        with self._lock:
            graph = self._graph
            return (
                self.built and graph is not None and not self._queue and graph.ghost_share() > MAX_GHOST_SHARE
            )

    def wants_save(self, quiet_s: float, changes: int, max_wait_s: float = math.inf) -> bool:
        """Built, every write applied, at least `changes` of them since the last save, and
        either no write for `quiet_s` or no save for `max_wait_s` (writes that never pause
        would otherwise keep the last save from ever being renewed)."""
        with self._lock:
            settled = self.built and not self._queue and self.unsaved >= changes
        now = time.monotonic()
        return settled and (now - self._last_write >= quiet_s or now - self._last_save >= max_wait_s)

    def mark_saved(self) -> None:
        """A save was made (or tried: it is tried again once as many writes reached it)."""
        self.unsaved = 0
        self._last_save = time.monotonic()

    # --- writes ----------------------------------------------------------------------

    def put(self, rows: Sequence[tuple[str, npt.NDArray[np.float32]]]) -> None:
        if rows:
            codes, scales = quantize(np.stack([np.asarray(v, dtype=np.float32) for _, v in rows]))
            self._enqueue(
                [
                    (mid, _Queued(c, float(sc)))
                    for (mid, _), c, sc in zip(rows, codes, scales.tolist(), strict=True)
                ]
            )

    def remove(self, ids: Iterable[str]) -> None:
        self._enqueue([(mid, None) for mid in ids])

    def _enqueue(self, ops: list[tuple[str, _Queued | None]]) -> None:
        with self._lock:
            self._last_write = time.monotonic()
            if self._graph is None:
                return  # nothing kept: a build reads the rows later
            self._queue.extend(ops)
            self._latest.update(ops)
            if len(self._queue) > self.params.max_queued:
                # A bulk load: adding its rows one by one would take longer than building the
                # graph again once it is over, and hold every queued vector meanwhile.
                self._graph, self._serving, self.built, self.needs_build = None, None, False, True
                self._queue, self._latest = [], {}
                log.info("vector graph dropped: over %d writes queued", self.params.max_queued)

    def queued(self) -> int:
        return len(self._queue)

    def apply_queued(self, most: int = 256) -> int:
        """Move up to `most` queued writes into the graph; returns how many. The feeder's
        call: searches meanwhile see each write in the queue or the graph (both for a
        moment: the queue's copy wins)."""
        with self._lock:
            graph = self._graph
            ops = self._queue[:most] if self.built else []
        if graph is None or not ops:
            return 0
        # The newest op per id in this slice is the one that counts.
        last: dict[str, _Queued | None] = dict(ops)
        graph.remove(last)
        adds = [(mid, v) for mid, v in last.items() if v is not None]
        for start in range(0, len(adds), _ADDS_PER_HOLD):
            part = adds[start : start + _ADDS_PER_HOLD]
            graph.add([mid for mid, _ in part], np.stack([q.codes for _, q in part]))
        with self._lock:
            if self._graph is not graph:
                return 0  # dropped or rebuilt meanwhile: its queue is another one
            self.unsaved += len(ops)
            del self._queue[: len(ops)]
            for mid, vector in ops:
                if mid in self._latest and self._latest[mid] is vector:
                    del self._latest[mid]
        return len(ops)

    def drain(self) -> int:
        """Apply every queued write (at close, the feeder stopped); returns how many: at
        most graph_max_queued adds, ~0.35 ms each with the server idle."""
        total = 0
        while applied := self.apply_queued():
            total += applied
        return total

    # --- reads -----------------------------------------------------------------------

    def rows(self) -> int:
        """Rows the graph answers for (its ghosts left out)."""
        graph = self._graph
        return 0 if graph is None else len(graph.key_of)

    def nbytes(self) -> int:
        graph = self._graph
        if graph is None:
            return 0
        with graph.lock:
            return int(graph.index.memory_usage)

    def search(self, vector: npt.NDArray[np.float32], k: int) -> list[tuple[str, float]] | None:
        """The k rows most similar to vector: (id, cosine), best first; None when the graph
        cannot answer (not built, or too many writes queued)."""
        if k <= 0:
            return []
        with self._lock:
            graph = self._graph if self.built else self._serving
            if graph is None or len(self._queue) > self.params.max_queued:
                return None
            latest = dict(self._latest)  # before the graph: see apply_queued
        query_codes, _ = quantize(np.asarray(vector, dtype=np.float32)[None, :])
        scores = graph.nearest(query_codes[0], k, latest)
        queued = [(mid, q) for mid, q in latest.items() if q is not None]
        if queued:
            unit = np.asarray(vector, dtype=np.float32) / (float(np.linalg.norm(vector)) or 1.0)
            codes = np.stack([q.codes for _, q in queued]).astype(np.float32)
            cos = (codes @ unit) * np.array([q.scale for _, q in queued], dtype=np.float32)
            scores.update((mid, float(c)) for (mid, _), c in zip(queued, cos, strict=True))
        return sorted(scores.items(), key=lambda item: -item[1])[:k]


class GraphFeeder:
    """One background thread for every tenant's graph: moves queued writes in, builds a
    dropped graph again (through the callback given with it) once its writes paused for
    `quiet_s`, and one with too many ghosts at once (the old one answers meanwhile), and
    saves a graph (through its save callback, if any) once `save_changes` writes reached it
    since its last save and writes paused for `save_quiet_s` (or, under writes that never
    pause, `save_max_wait_s` passed since its last save), so that a restart after a kill -9
    has a recent save to repair rather than one from the last orderly shutdown
    (index/graph_files.py). The feeder is the only thread that changes a built graph, so
    nothing changes it while it saves."""

    def __init__(
        self,
        quiet_s: float = 2.0,
        save_quiet_s: float = 10.0,
        save_changes: int = 1_000,
        save_max_wait_s: float = 300.0,
    ) -> None:
        self.quiet_s = quiet_s
        self.save_quiet_s = save_quiet_s
        self.save_changes = save_changes
        self.save_max_wait_s = save_max_wait_s
        self._graphs: dict[VectorGraph, tuple[Callable[[], object], Callable[[], object] | None]] = {}
        self._wake = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        # The graph the feeder is working on outside the lock (forget(wait=True) waits it out).
        self._working_on: VectorGraph | None = None
        # When each graph's last fresh build (for its ghosts) started.
        self._fresh_started: dict[VectorGraph, float] = {}

    def watch(
        self, graph: VectorGraph, rebuild: Callable[[], object], save: Callable[[], object] | None = None
    ) -> None:
        with self._wake:
            self._graphs[graph] = (rebuild, save)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="graph-feeder", daemon=True)
                self._thread.start()

    def forget(self, graph: VectorGraph, *, wait: bool = False) -> None:
        """Stop feeding a graph; with `wait`, return only once the feeder is not working on
        it any more, so that the caller is then the only thread changing it."""
        with self._wake:
            self._graphs.pop(graph, None)
            self._fresh_started.pop(graph, None)
            while wait and self._working_on is graph:
                self._wake.wait()

    def poke(self) -> None:
        with self._wake:
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _wants_fresh(self, graph: VectorGraph) -> bool:
        started = self._fresh_started.get(graph)
        return graph.wants_fresh() and (started is None or time.monotonic() - started >= _FRESH_EVERY_S)

    def _wants_save(self, graph: VectorGraph, save: Callable[[], object] | None) -> bool:
        return save is not None and graph.wants_save(
            self.save_quiet_s, self.save_changes, self.save_max_wait_s
        )

    def _has_work(self) -> bool:
        return any(
            g.queued() or g.wants_build(self.quiet_s) or self._wants_fresh(g) or self._wants_save(g, save)
            for g, (_, save) in self._graphs.items()
        )

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopped and not self._has_work():
                    self._wake.wait(timeout=0.5)  # a dropped graph's quiet time passes unannounced
                if self._stopped:
                    return
                graphs = list(self._graphs.items())
            for graph, (rebuild, save) in graphs:
                with self._wake:
                    if graph not in self._graphs:
                        continue  # forgotten since the list was taken
                    self._working_on = graph
                try:
                    if graph.wants_build(self.quiet_s):
                        rebuild()
                    elif self._wants_fresh(graph):
                        self._fresh_started[graph] = time.monotonic()
                        rebuild()
                    elif graph.queued():
                        graph.apply_queued()
                    elif save is not None and self._wants_save(graph, save):
                        save()
                except Exception:  # its writes stay queued; searches decline past max_queued
                    log.exception("feeding a vector graph failed")
                    with self._wake:
                        self._wake.wait(timeout=1.0)
                finally:
                    with self._wake:
                        self._working_on = None
                        self._wake.notify_all()
