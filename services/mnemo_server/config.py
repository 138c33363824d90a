"""Typed configuration: defaults, then a TOML file, then ``MNEMO_<SECTION>__<KEY>`` env vars.

Example: ``MNEMO_SERVER__PORT=6000`` or, in ``mnemo.toml``::

    [server]
    port = 6000
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

from mnemo_server.errors import FailedPrecondition

ENV_PREFIX = "MNEMO_"
DEFAULT_EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    max_workers: int = 32
    # Streamed calls (ExportMemories, ImportMemories) at once; more are RESOURCE_EXHAUSTED
    # (TOO_MANY_STREAMS). Each holds one of the max_workers for as long as its client takes
    # to read or send, so without a bound 32+ slow export readers left no worker for any
    # other call, health checks included (overload probe). Keep it below max_workers.
    max_streams: int = 8
    # Of those, at most this many one tenant's: idle imports of one tenant took all 8, and
    # every other tenant's exports and imports were refused for as long (noisy-neighbour probe).
    max_streams_per_tenant: int = 4
    # Recall and StartSession (CPU-bound) running at once; more wait their turn within their
    # deadline, StartSession first (api/compute_gate.py has the measurements). Two per core
    # suits a small machine for throughput, one per core for latency; 0 removes the limit.
    compute_slots: int = 4
    # Of those, slots only StartSession may take (at most compute_slots - 1), so it need not
    # queue behind Recalls: with 2, StartSession's p99 in the bench is mostly within its
    # deadline + 10 ms at the same throughput, for ~8 ms more of Recall's p50 (compute_gate.py).
    compute_reserved_slots: int = 2
    # Calls waiting for a compute slot, server-wide and of one tenant; past either a call is
    # RESOURCE_EXHAUSTED at once (COMPUTE_QUEUE_FULL, retried by the clients). Each waiter
    # holds one of max_workers: one tenant's 64 Recalls in flight took all 32, and another
    # tenant's GetMemory, gated or not, missed 2 s deadlines (fairness probe).
    compute_max_waiters: int = 16
    compute_waiters_per_tenant: int = 8
    # A call that takes this long is logged with its stages (call_trace.py); 0: never.
    slow_call_ms: float = 1000.0
    # How often a thread wakes to measure the wait for Python's interpreter lock, reported in
    # GetStatus.interpreter_lock_wait (lock_wait_probe.py); 0: not measured.
    lock_wait_probe_ms: float = 20.0
    # Seconds in-flight calls get to finish on SIGTERM.
    shutdown_grace_s: float = 5.0
    # Cap on glibc malloc arenas for `mnemo serve`: less resident memory after bulk loads,
    # at a throughput cost (figures in process_memory.py); 0 keeps glibc's 8 per core.
    malloc_arenas: int = 0
    # glibc malloc thresholds for `mnemo serve` (process_memory.py): blocks from this size
    # get their own mapping, returned when freed; the heap top is trimmed past the second.
    # 0 keeps glibc's dynamic thresholds.
    malloc_mmap_threshold_kb: int = 128
    malloc_trim_threshold_kb: int = 1024
    # `mnemo serve` moves what warm-up loaded out of the garbage collector's reach once it
    # serves (gc.freeze; process_memory.py has why and the measurements).
    gc_freeze_after_warm_up: bool = True
    # With that, a full collection that takes this long freezes the heap again: what is
    # loaded after warm-up (a bulk load, a tenant's first search) is walked by every full
    # collection otherwise (process_memory.py, HeapRefreezer). 0: only the warm-up freeze.
    gc_refreeze_after_ms: float = 20.0
    tls_cert_file: str = ""
    tls_key_file: str = ""


@dataclass(frozen=True)
class AuthConfig:
    # Off only for local development; then every call acts as `local_tenant` and the server
    # refuses to bind anything but a loopback address.
    enabled: bool = True
    admin_key: str = ""
    local_tenant: str = "default"


@dataclass(frozen=True)
class StorageConfig:
    data_dir: str = "./mnemo-data"
    # DuckDB's buffer pool would otherwise grow to 80% of RAM; the store needs far less.
    duckdb_memory_limit: str = "512MB"
    # Memory rows kept in memory for Recall's and StartSession's reads (~0.6 KB each, rows
    # over 4 KB are not kept; 0: none).
    # Reading rows by id from DuckDB costs ~0.4 ms a row at 100k (see store/row_cache.py).
    row_cache_rows: int = 120_000
    # Each scope's newest live ids kept in memory (store/recent_ids.py) for StartSession's
    # recent candidates, this many a scope (0: none; used when >= sessions.pool_recent).
    recent_ids_depth: int = 32
    # Creates that queue while another is being written are written together, up to this
    # many memories in one transaction (store/group_commit.py); 0: each on its own.
    group_commit_max_memories: int = 500
    # A forced purge tombstones this many memories a transaction, other writers taking the
    # memories write lock between them (memory/purges.py).
    purge_batch: int = 1_000
    # The same for StartSession's records (a session and its candidates) and for EndSession's
    # writes, up to this many sessions in one transaction; 0: each on its own.
    group_commit_max_sessions: int = 8


@dataclass(frozen=True)
class EmbeddingConfig:
    # Identity recorded in the store. The default is the bundled all-MiniLM-L6-v2.
    model: str = DEFAULT_EMBEDDING_MODEL
    # Directory of a sentence-transformers model; empty means the bundled one.
    model_path: str = ""
    # "onnx" (exported once and cached in the data directory) or "torch".
    backend: str = "onnx"
    # ONNX only: "int8" quantises the MatMul weights per channel (2.2x the throughput on this
    # CPU; LoCoMo vector-only NDCG@10 0.3305 vs 0.3290 for fp32, cosine to fp32 0.99). The
    # precision is part of the model identity recorded in the store.
    precision: str = "int8"
    batch_size: int = 16
    # Threads per query-embedding call; concurrency comes from parallel calls.
    intra_op_threads: int = 1
    # The index worker's own session: threads inside one run, and micro-batches run at once.
    # Two intra-op threads cost ~60% more CPU per text on the one- or two-text batches of a
    # serving workload (hand-offs between ~400 small operators); two single-threaded runs
    # side by side use both cores on a bulk load at no extra cost per text.
    index_intra_op_threads: int = 1
    index_concurrent_runs: int = 2
    # Texts per run of the index worker. 1: each memory is embedded alone, exactly as a query
    # is. int8 activations are quantised per run, so a vector made in a batch depends on the
    # texts that shared it (cosine 0.98-0.99 to the same text alone). Alone measured better
    # (LoCoMo: StartSession baseline on conv-41/42 NDCG@10 0.6601 against 0.6511 in
    # length-bucketed batches of 16) and makes a memory's vector reproducible; it costs
    # ~15% more CPU per text on bulk loads (5.0 against 4.3 ms).
    index_batch_size: int = 1
    max_seq_length: int = 256
    query_cache_size: int = 2048
    # Threads that embed Recall's query while the calling thread searches full text (0: the
    # caller embeds it first). As many as Recalls run at once (server.compute_slots).
    query_workers: int = 4
    # Where the one-time ONNX export is cached; empty means <data_dir>/models.
    cache_dir: str = ""


@dataclass(frozen=True)
class LimitsConfig:
    max_content_chars: int = 20_000
    max_query_chars: int = 4_000
    max_batch_size: int = 500
    max_top_k: int = 100
    max_page_size: int = 1_000
    max_metadata_bytes: int = 16_384
    max_external_id_chars: int = 256
    max_category_chars: int = 64
    max_scope_id_chars: int = 256
    max_request_id_chars: int = 128


@dataclass(frozen=True)
class CapsConfig:
    """Live memories kept per (tenant, scope, type); the oldest unpinned are pruned first."""

    semantic: int = 250_000
    episodic: int = 250_000
    procedural: int = 10_000
    document_chunk: int = 250_000


@dataclass(frozen=True)
class IndexConfig:
    # Above this many rows a tenant's vector column gets an ANN index (IVF-HNSW-SQ).
    ann_min_rows: int = 20_000
    # Lance's CPU thread pool (LANCE_CPU_THREADS, unless the environment sets it); 0: the
    # cores + 2. Lance's own default, the cores, let an ANN delta merge take the whole pool
    # and every vector search wait for it: 8.8 s of an 8.9 s merge at 100k on 2 cores, and
    # Recalls timed out in full benches; with 4 threads searches took at most 59 ms meanwhile.
    lance_cpu_threads: int = 0
    # IVF partitions searched per query once the ANN index exists. LanceDB's optimize folds
    # the index we create with sqrt(rows) partitions into one (Lance 14), where this has no
    # effect; measured at 100k, 316 partitions were slower at the same recall, so it stays so.
    ann_nprobes: int = 20
    # Each optimize adds a delta to the ANN index; past this many they are merged (when
    # writes allow: not while a backlog is being folded in).
    ann_max_deltas: int = 6
    # While a backlog is folded in (a bulk load) the deltas are merged only past this many
    # (0: not at all). Left for the end, a 100k load's 31-38 deltas took one 42-58 s merge
    # inside the first minute after it; merged along the way the work is spread out.
    ann_backlog_max_deltas: int = 12
    # Old LanceDB versions are deleted this long after they are superseded.
    keep_versions_s: float = 60.0
    # Largest micro-batch the index worker embeds at once.
    max_batch: int = 64
    # How long the worker waits to fill a micro-batch.
    batch_wait_ms: float = 5.0
    # Background maintenance of LanceDB tables, checked this often: small fragments are
    # compacted once compact_after_writes index batches accumulated (cheap). Rows are folded
    # into the indices (optimize) once a tenant's writes have been quiet for optimize_quiet_s,
    # optimize_lag_rows wait outside the indices, or every optimize_max_interval_s; but an
    # optimize costs time in proportion to the whole table (~0.8 s of CPU at 100k rows), so
    # after one the next waits until optimizing has used at most optimize_time_share of the
    # tenant's time. Rows outside the indices are searched flat (~11 us each per full-text
    # query), so optimize_max_lag_rows of them trigger an optimize at once.
    optimize_interval_s: float = 1.0
    compact_after_writes: int = 8
    # Compaction (the periodic one and the one before each optimize) waits until the table
    # has this many fragments; 0 compacts whenever asked. Each compaction commits a version
    # and remaps the indices, ~1.5 s at 100k rows whatever it merges: on settled 100k data
    # under the bench's mix, waiting for 32 gave 60.9-71.0 operations/s against 49.6-61.3
    # compacting every time (four alternating minutes each).
    compact_min_fragments: int = 32
    # Compaction merges runs of fragments under this many rows into fragments of up to this
    # many; larger ones stay. Lance merges only fragments the same indices cover, and while
    # the ANN index covered the bulk of a table that left it alone; without an ANN index (with
    # the vector graph) a target of 1M rows rewrote the whole table at every compaction: at
    # 100k rows ~250 MB written every ~13 s under the bench's mix, the data directory at
    # 1.25 GB (versions are kept keep_versions_s) and the RSS ~80 MiB higher.
    compact_target_rows: int = 16_384
    optimize_quiet_s: float = 1.0
    optimize_lag_rows: int = 200
    optimize_max_lag_rows: int = 2_000
    optimize_max_interval_s: float = 60.0
    optimize_time_share: float = 0.1
    # LanceDB caches per tenant table (the ANN and FTS indices live here when warm).
    index_cache_mb: int = 256
    metadata_cache_mb: int = 64
    # The caches of the connection every tenant's writes go through (its tables' id index
    # and manifests), shared by all tenants. With LanceDB's defaults (GBs) they grew with
    # every write: 40 rows rewritten 8,000 times left the server at 983 MiB against 897
    # with these bounds, the growth beyond the readers' caches 19 against 12.6 MB per 1,000
    # writes (the rest is not found yet); LanceIndex alone levelled off at +241 MiB after
    # 4,000 writes against +337 and rising. A write's time is the same.
    writer_index_cache_mb: int = 64
    writer_metadata_cache_mb: int = 32
    # After an optimize, a tenant's caches are replaced by fresh, warmed ones once they hold
    # more than cache_renew_factor x its index files on disk + cache_renew_slack_mb (and
    # that much more than the last fresh one held): the rest is superseded index files
    # (lance_maintenance.py, _renew_bloated_session). 0: never. A warm session holds about its
    # index files (66 MB at 100k rows); at 2.0 one held up to ~200 MB before renewal.
    cache_renew_factor: float = 1.0
    cache_renew_slack_mb: int = 64
    # Measuring a tenant's Lance session (for that renewal, and GetStatus's cache use) takes
    # at most this share of the time: the next measure waits 1/share times what the last one
    # took, and the last figure stands meanwhile. Lance's size_bytes walks every cached entry
    # holding the GIL, so it stalls every call in flight: 12 ms with 60 MB of manifests
    # cached after 400 appends, 24 ms with another thread busy. Run after every optimize
    # (twice with the graph) and in every GetStatus, it was ~17 ms of a GetStatus, and a
    # status poll every 20 ms raised a lone client's ListMemories p90 from 5 to 28-31 ms.
    # At 0.002 a 20 ms measure is taken at most every 10 s. 0: measured at every use.
    session_measure_max_share: float = 0.002
    # Per tenant, the attributes Recall's signals read (text, scope, session, times) of up
    # to this many rows stay in memory (~0.5 KB each), so searches fetch only ids and scores.
    attrs_cache_rows: int = 200_000
    # Per tenant, every row's vector is kept in memory by scope (int8, ~0.5 KB a row with its
    # id), and a vector search filtered by scopes alone over at most this many rows scans
    # them exactly instead of asking LanceDB, whose ANN search pays for a selective filter
    # (index/scope_vectors.py; k 100 at 100k rows: 5k rows scanned in 1.4 ms of CPU against
    # LanceDB's 9.7, 20k in 5.0 against 9.2, 40k in 10.4 against 7.8). 0: nothing kept.
    # With the vector graph there is no ANN index, and every scoped search scans in memory.
    exact_scope_search_max_rows: int = 20_000
    # Per tenant, every row's full-text postings are kept in memory (index/text_postings.py)
    # and answer every full-text search (BM25 as LanceDB's); tables then get no LanceDB
    # full-text index (one left by an older configuration is dropped at start-up).
    memory_text_search: bool = True
    # Per tenant, every row's vector is also kept in an in-process HNSW graph (usearch,
    # index/vector_graph.py) that answers vector searches with no filter: 0.2-0.3 ms of CPU
    # per query at 100k rows against LanceDB's ~5.3, ~63 MiB per 100k rows (int8). Writes
    # reach it in the background; past graph_max_queued waiting, an exact scan answers.
    # With it (and the scope vectors, which it is built from) tables get no ANN index:
    # filtered searches scan the scope vectors (LanceDB's ann_* settings then do nothing).
    vector_graph: bool = True
    graph_dtype: Literal["i8", "f16", "f32"] = "i8"
    graph_expansion_search: int = 64
    graph_max_queued: int = 2_000
    # The graphs are saved in the data directory at an orderly shutdown and read back at
    # start-up, checked row by row against the table (index/graph_files.py); false: built
    # at every start. While serving, a graph is saved again once graph_save_changes writes
    # reached it since its last save and writes have paused for graph_save_quiet_s (~0.13 s
    # at 100k rows), or graph_save_max_wait_s passed since its last save (writes that never
    # pause), so a restart after a kill -9 repairs a recent save.
    graph_saved: bool = True
    graph_save_quiet_s: float = 10.0
    graph_save_changes: int = 1_000
    graph_save_max_wait_s: float = 300.0
    # The tenants whose indices (above: vectors, graph, postings, attributes, Lance session)
    # stay in memory, the most recently used first (index/residency.py): at most this many
    # tenants and rows (0: no bound), checked every optimize_interval_s. Others are loaded
    # when a search asks (1k rows: ~55 ms; 100k: 5-7 s; see load_wait_s) and at start-up
    # only the most recently written are loaded. A tenant used within resident_min_idle_s is kept even
    # past the bounds. ~4 KB a row at 100k rows, ~1.9 MB for a tenant of 1k rows.
    max_resident_tenants: int = 1_000
    max_resident_rows: int = 1_000_000
    resident_min_idle_s: float = 30.0
    # A search of a tenant whose indices are not in memory waits this long for their load
    # (on one background thread, never inside the call: a call's compute slot held for a
    # 100k-row tenant's 5-7 s would hold back every tenant's searches), then fails
    # UNAVAILABLE with reason INDEX_LOADING, which the shipped clients retry.
    load_wait_s: float = 2.0
    # Background scan for anything DuckDB has that LanceDB lacks.
    reconcile_interval_s: float = 60.0
    # Longest a wait_for_index call blocks (the call's own deadline also bounds it).
    max_wait_for_index_s: float = 30.0
    # wait_for_index calls blocked at once, server-wide; past it a call answers at once with
    # its memory as written (index_state pending). Each blocked call holds a gRPC worker:
    # 40 of one tenant's, waiting on its backlog, took all 32, and another tenant's
    # GetMemory timed out (noisy-neighbour probe).
    max_index_waits: int = 8


@dataclass(frozen=True)
class RetentionConfig:
    tombstone_days: float = 30.0
    idempotency_hours: float = 24.0
    history_days: float = 180.0
    # A session (its row with the candidates it recorded, its transcript) is kept this long
    # after it ended (or started, if it never ended); 0 keeps sessions forever. Its training
    # pairs live on in the sidecar.
    session_days: float = 180.0
    # Training pairs the sidecar acknowledged are dropped from the outbox after this long.
    delivered_feedback_hours: float = 24.0
    interval_s: float = 6 * 3600.0


@dataclass(frozen=True)
class RecallConfig:
    """The Recall pipeline's weights: tuned once on the LoCoMo DEV split (cross-validated
    across its conversations), then left alone. See retrieval/recall.py for each stage."""

    # Candidates each leg returns: 2 x top_k, within [leg_min, leg_max].
    leg_min: int = 50
    leg_max: int = 100
    # Fusion: text_weight x BM25 / best BM25 + vector_weight x cosine.
    vector_weight: float = 0.7
    text_weight: float = 0.3
    # Same-session neighbours of the best `neighbour_head` fused candidates join the pool.
    neighbour_head: int = 20
    adjacency: float = 0.5
    speaker_penalty: float = 0.5
    min_speaker_memories: int = 3
    date_boost: float = 1.0
    date_tau_days: float = 7.0
    time_question_boost: float = 0.4
    session_support: float = 0.3
    session_top: int = 2
    # Score x (1 + importance_weight x (2 x importance - 1)): neutral at importance 0.5.
    importance_weight: float = 0.2
    # Speaker counts per (tenant, scope) are read again in the background once this old, and
    # served meanwhile; past speakers_stale_s (or never read) they are read in the call
    # (retrieval/speakers.py).
    speakers_cache_s: float = 5.0
    speakers_stale_s: float = 60.0


@dataclass(frozen=True)
class RankingConfig:
    """The server's side of the ranking sidecar."""

    # host:port of the sidecar; empty means no sidecar (baseline ordering everywhere).
    sidecar_address: str = ""
    auth_token: str = ""
    # Budget for the sidecar inside StartSession; also capped by the caller's own deadline.
    start_session_deadline_ms: float = 120.0
    # Default budget for Recall's optional rerank of the head.
    rerank_deadline_ms: float = 250.0
    rerank_head: int = 30
    # Time kept from a caller's deadline for the reply when the sidecar is asked (Recall's
    # rerank; StartSession's, beyond what its own work after the sidecar's answer has lately
    # taken: sessions/time_after_ranking.py).
    deadline_margin_ms: float = 10.0
    # Circuit breaker: open after this many consecutive failures; after the cooldown the
    # sidecar's health is probed in the background, allowed this long (no caller waits on it).
    breaker_failures: int = 5
    breaker_cooldown_s: float = 5.0
    breaker_probe_timeout_s: float = 1.0
    # Candidate pool for StartSession; at most max_scored (best baseline first) go to the
    # sidecar, which refuses more than its own cap (100 by default).
    max_scored: int = 100
    # The query and each memory's text as sent to the sidecar are cut to this many characters:
    # it refuses longer ones (its inference.max_text_chars, 20,000 by default), which with
    # limits.max_content_chars raised above it cost every session holding such a memory its
    # model order, and its training pairs. Keep it at most the sidecar's setting. The models
    # read only the first few hundred tokens of a text.
    max_text_chars: int = 20_000
    # How the model's order and the baseline's are fused by the health weight: by rank,
    # weight / (k + rank), with this k; 0 blends min-max-scaled scores instead (below 0 is
    # refused at start-up). A few outlying model scores squeeze the rest of a min-max-scaled
    # list together, and the baseline then decides most of it. On LoCoMo (a ranker fit on
    # two DEV conversations' sessions, judged on the other two's) at the weights a new model
    # serves with (0.65-0.7): offline, both ways, ranks kept +0.004-0.010 NDCG@10 more of
    # the model's gain; through `mnemo eval locomo --train-sessions`, 0.6804 against 0.6779
    # (two runs by rank, five by score).
    fusion_rank_k: float = 10.0
    pool_recall: int = 50
    # Pinned memories are always candidates (memory.proto); this bound only keeps a tenant
    # that pins by the thousand from costing every session start a scan of them all: past
    # it, the newest pinned memories in the session's scopes are the candidates.
    pool_pinned: int = 100
    pool_recent: int = 10
    default_token_budget: int = 1_000
    default_max_memories: int = 20
    # StartSession's access counts (a ranker feature) are written in one batch this often.
    access_flush_interval_s: float = 1.0
    # Delivery of training pairs (outbox) to the sidecar.
    delivery_interval_s: float = 0.5
    # After an EndSession wakes the delivery, it waits this long for others to join the pass:
    # their rows are then marked delivered in one transaction instead of one each.
    delivery_gather_s: float = 0.2
    delivery_timeout_s: float = 10.0
    delivery_max_backoff_s: float = 60.0


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    caps: CapsConfig = field(default_factory=CapsConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    recall: RecallConfig = field(default_factory=RecallConfig)
    ranking: RankingConfig = field(default_factory=RankingConfig)

    @property
    def data_dir(self) -> Path:
        return Path(self.storage.data_dir)

    def replace(self, **sections: Mapping[str, Any]) -> Config:
        """A copy with some keys of some sections changed: ``cfg.replace(server={"port": 0})``."""
        return apply_sections(
            self, {name: dict(values) for name, values in sections.items()}, origin="override"
        )


_T = TypeVar("_T")
_C = TypeVar("_C")


# Ranges of integer keys of any section, by name: out of range is refused at start-up (a
# port of 70000 was taken modulo 65536 by the gRPC bind, and 0 workers failed later).
_INT_RANGES = {
    "port": (0, 65_535),
    "max_workers": (1, 4_096),
    "batch_size": (1, 4_096),
    "index_batch_size": (1, 4_096),
    "max_batch_size": (1, 100_000),
    "purge_batch": (1, 1_000_000),
    "max_train_streams": (1, 4_096),
    "max_streams": (1, 4_096),
    "max_streams_per_tenant": (1, 4_096),
    "compute_max_waiters": (1, 4_096),
    "compute_waiters_per_tenant": (1, 4_096),
    # Limits a request must fit: 0 would refuse every call (probe: max_top_k -1 failed every
    # Recall, max_content_chars -1 every create).
    "max_top_k": (1, None),
    "max_content_chars": (1, None),
    "max_query_chars": (1, None),
    "max_page_size": (1, None),
    "max_running": (1, 4_096),  # the sidecar's inference slots: 0 ran nothing
    "max_candidates": (1, None),
    "max_text_chars": (1, None),  # the sidecar's, and what the server sends it
}
# Every other number is a size, a count, a time or a weight: 0 or more. These may be less.
_MAY_BE_NEGATIVE = frozenset({"promote_margin"})
# Text keys of any section that name something and cannot be empty: an empty data_dir put
# the store in the working directory, an empty host bound every address and was refused
# only after warm-up, as a port that could not be bound (CLI probe).
_NOT_EMPTY = frozenset({"data_dir", "host"})


# Keys clients send as 'authorization: Bearer <key>'.
_BEARER_KEYS = frozenset({"admin_key"})


def _bearer_key(value: str, where: str) -> str:
    """Surrounding whitespace dropped, as the server drops it from what callers send: a key
    from a secret file or an env file ends in a newline, and no call could ever match it.
    A key gRPC metadata cannot carry (non-ASCII, control characters) is refused, never
    echoed: the server started with one and refused every admin call (probe)."""
    key = value.strip()
    if any(not " " <= ch <= "~" for ch in key):
        raise FailedPrecondition(
            f"config {where}: must be printable ASCII (it is sent as gRPC metadata)", reason="BAD_CONFIG"
        )
    return key


def _number(value: Any, typ: Any, where: str) -> int | float:
    """An int or float setting, within its range (see _INT_RANGES, _MAY_BE_NEGATIVE)."""
    name = where.rsplit(".", 1)[-1]
    if isinstance(value, bool):
        raise FailedPrecondition(f"config {where}: expected a number, got {value!r}", reason="BAD_CONFIG")
    if typ is int:
        # A TOML float (port = 1.7) or true would otherwise pass through int() as 1.
        number = value if isinstance(value, int) else _int_text(value, where)
        lo, hi = _INT_RANGES.get(name, (None if name in _MAY_BE_NEGATIVE else 0, None))
        if (lo is not None and number < lo) or (hi is not None and number > hi):
            span = f"{lo}..{hi}" if hi is not None else f"{lo} or more"
            raise FailedPrecondition(f"config {where}: {number} is outside {span}", reason="BAD_CONFIG")
        return number
    try:
        real = float(value)
    except (TypeError, ValueError):
        raise FailedPrecondition(
            f"config {where}: expected a number, got {value!r}", reason="BAD_CONFIG"
        ) from None
    if not math.isfinite(real) or (real < 0 and name not in _MAY_BE_NEGATIVE):
        raise FailedPrecondition(
            f"config {where}: {value!r} is not a finite number of 0 or more", reason="BAD_CONFIG"
        )
    return real


def _coerce(value: Any, typ: Any, where: str) -> Any:
    if typ in (int, float):
        return _number(value, typ, where)
    if get_origin(typ) is Literal:  # one of a few words: anything else is refused at start-up
        allowed = get_args(typ)
        if value in allowed:
            return value
        raise FailedPrecondition(
            f"config {where}: expected one of {', '.join(map(repr, allowed))}, got {value!r}",
            reason="BAD_CONFIG",
        )
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"1", "true", "yes", "on", "0", "false", "no", "off"}:
            return value.lower() in {"1", "true", "yes", "on"}
        raise FailedPrecondition(f"config {where}: expected a boolean, got {value!r}", reason="BAD_CONFIG")
    if typ is str:
        # A number may stand for its digits; a list, a table or true is no text setting
        # (probe: data_dir ["a", "b"] made a directory named "['a', 'b']", true an admin key "True").
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise FailedPrecondition(f"config {where}: expected str, got {value!r}", reason="BAD_CONFIG")
        name = where.rsplit(".", 1)[-1]
        if name in _NOT_EMPTY and not str(value).strip():
            raise FailedPrecondition(f"config {where}: must not be empty", reason="BAD_CONFIG")
        return _bearer_key(str(value), where) if name in _BEARER_KEYS else str(value)
    raise FailedPrecondition(f"config {where}: unsupported type", reason="BAD_CONFIG")


def _int_text(value: Any, where: str) -> int:
    """An integer from the environment's text ("8", " 8 "); anything else is refused."""
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise FailedPrecondition(f"config {where}: expected an integer, got {value!r}", reason="BAD_CONFIG")


def _apply_section(section: _T, values: Mapping[str, Any], where: str) -> _T:
    hints = get_type_hints(type(section))
    known = {f.name for f in dataclasses.fields(section)}  # type: ignore[arg-type]
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise FailedPrecondition(f"config {where}: unknown key {key!r}", reason="BAD_CONFIG")
        changes[key] = _coerce(value, hints[key], f"{where}.{key}")
    return dataclasses.replace(section, **changes)  # type: ignore[type-var]


def apply_sections(cfg: _C, sections: Mapping[str, Mapping[str, Any]], origin: str) -> _C:
    """A copy of a config dataclass with some keys of some (dataclass) sections changed."""
    changes: dict[str, Any] = {}
    for name, values in sections.items():
        if not hasattr(cfg, name) or not dataclasses.is_dataclass(getattr(cfg, name)):
            raise FailedPrecondition(f"config ({origin}): unknown section {name!r}", reason="BAD_CONFIG")
        if not isinstance(values, Mapping):
            raise FailedPrecondition(
                f"config ({origin}): section {name!r} must be a table", reason="BAD_CONFIG"
            )
        changes[name] = _apply_section(getattr(cfg, name), values, f"{name}")
    return dataclasses.replace(cfg, **changes)  # type: ignore[type-var]


def sections_from_env(env: Mapping[str, str], prefix: str) -> dict[str, dict[str, str]]:
    """PREFIX<SECTION>__<KEY>=value, lower-cased, grouped by section."""
    sections: dict[str, dict[str, str]] = {}
    for key, value in env.items():
        if not key.startswith(prefix) or "__" not in key:
            continue
        section, _, name = key[len(prefix) :].lower().partition("__")
        sections.setdefault(section, {})[name] = value
    return sections


def refuse_misspelt_settings(cfg: Any, env: Mapping[str, str], prefix: str) -> None:
    """A variable that names a setting with one underscore where two belong
    (MNEMO_STORAGE_DATA_DIR) was silently not read; a misspelt key with two is refused, so
    is this. Only exact settings count: other MNEMO_ variables (the CLI's) are not settings."""
    for key in env:
        if not key.startswith(prefix) or "__" in key:
            continue
        rest = key[len(prefix) :].lower()
        for section in dataclasses.fields(cfg):
            name = rest.removeprefix(section.name + "_")
            values = getattr(cfg, section.name)
            if name != rest and dataclasses.is_dataclass(values) and hasattr(values, name):
                right = f"{prefix}{section.name.upper()}__{name.upper()}"
                raise FailedPrecondition(
                    f"environment variable {key} is not read: settings are {prefix}<SECTION>__<KEY> "
                    f"(two underscores), here {right}",
                    reason="BAD_CONFIG",
                )


def read_toml(file: Path) -> dict[str, Any]:
    try:
        with file.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise FailedPrecondition(f"config file {file} does not exist", reason="BAD_CONFIG") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise FailedPrecondition(f"config file {file}: {exc}", reason="BAD_CONFIG") from None
    except OSError as exc:  # a directory, unreadable
        raise FailedPrecondition(f"config file {file}: {exc.strerror or exc}", reason="BAD_CONFIG") from None


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Defaults < file (``path`` or ``$MNEMO_CONFIG``) < environment."""
    env = os.environ if env is None else env
    cfg = Config()
    file = path or env.get("MNEMO_CONFIG")
    if file:
        cfg = apply_sections(cfg, read_toml(Path(file)), origin=str(file))
    # MNEMO_SIDECAR_* belongs to the sidecar's own configuration.
    own = {k: v for k, v in env.items() if not k.startswith("MNEMO_SIDECAR_")}
    refuse_misspelt_settings(cfg, own, ENV_PREFIX)
    return apply_sections(cfg, sections_from_env(own, ENV_PREFIX), origin="environment")
