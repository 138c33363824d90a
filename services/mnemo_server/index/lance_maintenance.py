"""Keeping one tenant's LanceDB table fast as it is written: compaction of the small
fragments appends leave, folding new rows into the indices (and making them once the table
is large enough), merging the ANN index's small deltas, dropping versions nobody reads, and
renewing a Lance session bloated by superseded index files. LanceIndex decides when; the
work runs beside the index worker's writes wherever Lance allows it.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from mnemo_server.config import IndexConfig
from mnemo_server.index.lance_table import (
    TableHandle,
    index_names,
    measure_session,
    new_session,
    read_whole_ann_index,
    record_session_bytes,
    session_bytes,
    settle_pending,
    vector_segments,
)
from mnemo_server.index.pending import PendingRows

log = logging.getLogger(__name__)


class TableMaintenance:
    def __init__(self, cfg: IndexConfig, dimension: int, *, wants_ann_index: bool, wants_text_index: bool):
        """`wants_ann_index`, `wants_text_index`: whether tables get LanceDB's ANN and
        full-text indices (LanceIndex says why not when memory answers those searches)."""
        self.cfg = cfg
        self.dimension = dimension
        self.wants_ann_index = wants_ann_index
        self.wants_text_index = wants_text_index

    def compact(self, h: TableHandle) -> int:
        """Merge the small fragments that appends leave behind (one per index batch); many
        of them slow every search. Not before index.compact_min_fragments of them: merging
        a few costs about as much as merging many (the indices' remap dominates); folding the
        rows into the indices is optimize()'s job. Returns fragments removed.

        The indices' row addresses are remapped at once, not deferred: a deferred remap
        (Lance 14) left an ANN delta whose rows had since been rewritten unreadable, and
        every vector search of the table failed from then on, optimize or not. Measured at
        100k rows, compacting a few writes' fragments costs the same either way (~10 ms)."""
        if not self._needs_compaction(h):
            return 0
        metrics = self._compact_files(h)
        with h.lock:
            h.table.checkout_latest()
            h.refresh()
        return int(metrics.fragments_removed)

    def _needs_compaction(self, h: TableHandle) -> bool:
        return len(h.reader.get_fragments()) >= self.cfg.compact_min_fragments

    def _compact(self, h: TableHandle) -> Any:
        return h.for_maintenance().optimize.compact_files(
            target_rows_per_fragment=self.cfg.compact_target_rows, defer_index_remap=False
        )

    def _compact_files(self, h: TableHandle) -> Any:
        """Compaction beside the index worker's writes (see _optimize_beside_writes). Lance
        commits it beside appends, but a rewrite loses to an update or delete of rows in the
        fragments it rewrote (a "retryable commit conflict", an OSError from Python); it is
        then done again under the table lock, where no write can intervene."""
        try:
            return self._compact(h)
        except OSError as exc:
            if "commit conflict" not in str(exc):
                raise
            log.info("compaction lost to a concurrent write; again under the table lock")
            with h.lock:
                metrics = self._compact(h)
                self.remove_lost_files(h)
                return metrics

    def remove_lost_files(self, h: TableHandle) -> None:
        """Remove the files of a compaction whose commit was lost: no version names them, and
        Lance keeps such files 7 days unless told they are no writer's under way (probe: 114
        of a churned tenant's 128 MB after 22 minutes, 4.6 MB a minute, kept over restarts).
        Only under the table lock, where no write is under way: maintenance runs one step at
        a time, and every write takes the lock."""
        h.for_maintenance().cleanup_old_versions(
            older_than=timedelta(seconds=self.cfg.keep_versions_s), delete_unverified=True
        )

    def _fold_and_clean(self, h: TableHandle) -> None:
        """Fold the rows outside the indices in and drop versions nobody reads any more: with
        a compaction first, what LanceDB's table.optimize does. One path whether the caller
        holds the table lock throughout or works beside the writes."""
        dataset = h.for_maintenance()
        dataset.optimize.optimize_indices()
        dataset.cleanup_old_versions(older_than=timedelta(seconds=self.cfg.keep_versions_s))

    def optimize(
        self, h: TableHandle, *, merge_deltas: bool = True, max_deltas: int | None = None
    ) -> dict[str, Any]:
        """Compact small fragments, fold new rows into the indices, add the ANN index once
        the table is large, drop versions nobody reads any more, and (merge_deltas) merge
        the ANN index's deltas once there are more than `max_deltas` (`ann_max_deltas`
        unless given). Returns what was done."""
        from lancedb.index import FTS, Bitmap, BTree, HnswSq

        done: dict[str, Any] = {}
        # With the graph nothing is warmed (_renew_bloated_session), so a bloated session is
        # renewed before the work too: the compaction, folds and merges below then add their
        # transient memory to a light session, not to one about to be dropped.
        renewed_first = self._renew_bloated_session(h) if h.graph is not None else None
        if renewed_first is not None:
            done["session_mb_before_after"] = renewed_first
        made: dict[str, Any] = {}  # indices created by this call
        with h.lock:
            table = h.table
            rows = table.count_rows()
            indices = index_names(table)
            if rows >= self.cfg.ann_min_rows and "vector_idx" not in indices and self.wants_ann_index:
                partitions = max(1, int(rows**0.5))
                table.create_index(
                    "vector",
                    config=HnswSq(distance_type="cosine", num_partitions=partitions),
                    name="vector_idx",
                )
                made["ann_index"] = partitions
            if "scope_idx" not in indices and rows:
                table.create_index("scope", config=Bitmap(), name="scope_idx")
                made["scope_index"] = True
            if "id_idx" not in indices and rows:
                table.create_index("id", config=BTree(), name="id_idx")
                made["id_index"] = True
            if "text_idx" not in indices and rows and self.wants_text_index:
                # A table written while the in-memory postings answered (the first write
                # makes it otherwise).
                table.create_index("text", config=FTS(with_position=False), name="text_idx")
                made["text_index"] = True
            before = h.pending
            if made or (before is None and self.wants_ann_index):
                # Until the rows outside the ANN index are known (before its first optimize,
                # or after a restart), the whole optimize holds the lock: then no write
                # lands while it runs, so afterwards the index holds every row.
                self._compact(h)
                self._fold_and_clean(h)
                table.checkout_latest()
                h.refresh()
                # Only now does the reader searches use hold the index: flagged before, a
                # Recall in between failed INTERNAL ("Cannot perform full text search unless
                # an INVERTED index has been created"; probe: 30 of 8,728).
                h.has_text_index = h.has_text_index or "text_index" in made
                if "vector_idx" in indices or "ann_index" in made:
                    settle_pending(h)
        done.update(made)
        if not made and (before is not None or not self.wants_ann_index):
            self._optimize_beside_writes(h, before)
            done["beside_writes"] = True
        done["rows"] = rows
        if merge_deltas:
            done.update(self._merge_small_deltas(h, max_deltas))
        renewed = self._renew_bloated_session(h)
        if renewed is not None:
            done["session_mb_before_after"] = renewed
            log.info("tenant table %s: Lance caches renewed, %d MB held, %d MB once warm", h.uri, *renewed)
        return done

    def _merge_small_deltas(self, h: TableHandle, max_deltas: int | None) -> dict[str, Any]:
        """Merge the ANN index's newest small deltas once there are more than `max_deltas`
        (`ann_max_deltas` unless given)."""
        segments = vector_segments(h)
        most = self.cfg.ann_max_deltas if max_deltas is None else max_deltas
        tail = self._small_newest(segments) if len(segments) > most else 0
        if tail <= 1:
            return {}
        # Every optimize folds the new rows into a delta of the ANN index and a search
        # probes each delta: after a 100k bulk load, 45 deltas made it 27 ms instead of 6.
        # The newest small deltas are merged into one, large ones are kept (merging them
        # again and again would rebuild most of the index each time, ~0.4 ms per row).
        # It runs outside the table lock: indexing goes on, Lance rebases the merge
        # onto newer appends.
        started = time.monotonic()
        h.for_maintenance().optimize.optimize_indices(index_names=["vector_idx"], num_indices_to_merge=tail)
        with h.lock:
            h.table.checkout_latest()
            h.refresh()
        return {"merged_vector_deltas": tail, "merge_s": time.monotonic() - started}

    def _renew_bloated_session(self, h: TableHandle) -> tuple[int, int] | None:
        """Give the tenant a new Lance session when the old one holds far more than the
        indices on disk. Optimizes, delta merges and compactions write index files anew, and
        the session keeps the superseded ones (never read again, still resident) until its
        caps are full: right after a 100k load it held 321 MB where a fresh one, warm after a
        minute of searches, held 85 MB; with the tenant's handle opened afresh the server's
        peak RSS over the next minute was ~200 MB lower at the same throughput. The new
        session replaces the old one first and is warmed after (the whole ANN index read
        here in maintenance): warming it beside the old one held both, and reading the index
        briefly takes twice what it keeps (at 100k rows +130 MB for 65 MB kept), which set
        the bench's high-water mark (VmHWM sampled every 0.1 s: each renewal +70 MB for a
        moment, the highest at 1,379 MiB). Searches already on the old session finish there,
        which frees it; one that arrives while the index loads waits for that one load
        (Lance shares it: four cold searches at once took 100-103 ms and as much memory as
        one), ~100 ms at 100k rows. Returns the MB held before and after, or None when
        nothing was renewed."""
        if self.cfg.cache_renew_factor <= 0:
            return None
        held = session_bytes(h, self.cfg.session_measure_max_share)
        descriptions = h.reader.describe_indices()
        # A table has an ANN or full-text index only when no in-memory index answers its
        # searches (_wants_ann_index, _wants_text_index): then the searches read it, and it
        # is warmed.
        on_disk = sum(seg.size_bytes for d in descriptions for seg in d.segments)
        # Past a size a fresh session reached before, or the next renewal would come at once.
        baseline = max(self.cfg.cache_renew_factor * on_disk, h.warm_session_bytes)
        if held <= baseline + (self.cfg.cache_renew_slack_mb << 20):
            return None
        import lance

        session = new_session(self.cfg)
        with h.lock:
            h.session = session
            h.refresh()
        fresh = lance.dataset(h.uri, session=session)
        if any(d.name == "vector_idx" for d in descriptions):
            read_whole_ann_index(fresh, self.dimension)
        if h.has_text_index:
            fresh.to_table(columns=["id", "_score"], full_text_query="warm", limit=1)
        # Measured directly, not through session_bytes' share limit: once per renewal, and a
        # fresh session is small; its cost then sets the next measure's wait, not the old
        # session's (larger) one.
        warm, took = measure_session(session)
        with h.lock:
            if h.session is session:
                h.warm_session_bytes = warm
                record_session_bytes(h, warm, took)
        return held >> 20, warm >> 20

    def _optimize_beside_writes(self, h: TableHandle, before: PendingRows | None) -> None:
        """Compact, fold the rows outside the indices in and drop old versions while the
        index worker goes on writing. Under the table lock this held every write back for
        its whole length, at 100k rows up to 3 s for an optimize and 5 s for a compaction
        that rewrote the large fragment: the p99 of created -> searchable in the bench.
        Lance commits these beside the appends (as it does the ANN merges). `before` is the
        pending set when the work began: its rows are all in the indices afterwards, so the
        rows written since are the ones left pending."""
        if self._needs_compaction(h):
            self._compact_files(h)
        self._fold_and_clean(h)
        with h.lock:
            h.table.checkout_latest()
            h.refresh()
            if h.pending is not None and before is not None:
                h.pending = h.pending.written_since(before)

    @staticmethod
    def _small_newest(segments: list[Any]) -> int:
        """How many of the newest ANN deltas are each under a tenth of the index's size."""
        total = sum(seg.size_bytes for seg in segments) or 1
        count = 0
        for seg in sorted(segments, key=lambda seg: seg.created_at, reverse=True):
            if seg.size_bytes >= total / 10:
                break
            count += 1
        return count
