"""The composition root: builds every store, model, worker and servicer from one Config.
No module-level singletons; tests build as many independent apps as they like."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mnemo.v1 import (
    admin_service_pb2_grpc,
    learning_service_pb2_grpc,
    memory_service_pb2_grpc,
    skill_service_pb2_grpc,
)
from mnemo_server.api.admin_servicer import AdminServicer
from mnemo_server.api.compute_gate import ComputeGate
from mnemo_server.api.interceptor import ApiInterceptor
from mnemo_server.api.learning_servicer import LearningServicer
from mnemo_server.api.memory_servicer import MemoryServicer
from mnemo_server.api.server import GrpcServer, is_loopback, listen_address
from mnemo_server.api.skill_servicer import SkillServicer
from mnemo_server.config import Config
from mnemo_server.diagnostics import DataDirSize
from mnemo_server.embed.embedder import CachedQueryEmbedder, Embedder
from mnemo_server.embed.factory import build_embedder, model_dir
from mnemo_server.embed.fingerprint import model_fingerprint
from mnemo_server.errors import EmbeddingModelMismatch, FailedPrecondition
from mnemo_server.index import in_step, kernels
from mnemo_server.index.indexer import IndexWorker
from mnemo_server.index.lance_index import LanceIndex, TableUnreadable
from mnemo_server.latency_histogram import CallTimes
from mnemo_server.learning.service import LearningService
from mnemo_server.lock_wait_probe import LockWaitProbe
from mnemo_server.memory.service import MemoryService
from mnemo_server.memory.validation import Validator
from mnemo_server.ranking.client import RankingClient
from mnemo_server.ranking.outbox import FeedbackDelivery
from mnemo_server.retrieval.recall import RecallPipeline
from mnemo_server.sessions.access_counts import AccessCounts
from mnemo_server.sessions.service import SessionService
from mnemo_server.skills.service import SkillService
from mnemo_server.store import index_marks, memory_repo
from mnemo_server.store.database import Database
from mnemo_server.store.recent_ids import RecentIds
from mnemo_server.tenancy.tenants import Principal, TenantService
from mnemo_server.workers.retention import RetentionWorker
from mnemo_server.workers.scheduler import Scheduler

log = logging.getLogger(__name__)


def _maintenance_level(seconds: float) -> int:
    """Maintenance that runs for seconds competes with searches for the cores and for
    LanceDB's threads: logged where the slow-call log can be read against it."""
    return logging.INFO if seconds >= 1.0 else logging.DEBUG


# The first retention sweep after start, once warm-up's own work has settled.
RETENTION_FIRST_AFTER_S = 60.0

META_MODEL = "embedding_model"
META_DIMENSION = "embedding_dimension"
# What the model's files held (embed/fingerprint.py); absent in stores from before it.
META_MODEL_FINGERPRINT = "embedding_model_fingerprint"
# The tokens a text is cut to before embedding: another limit gives long texts other
# vectors (probe: a long memory's own text scored 0.815 against it, not 1.0, once
# embedding.max_seq_length was 16). Absent in stores from before it was recorded.
META_MAX_SEQ_LENGTH = "embedding_max_seq_length"


@dataclass(frozen=True)
class DataPaths:
    root: Path

    @property
    def duckdb(self) -> Path:
        return self.root / "mnemo.duckdb"

    @property
    def lance(self) -> Path:
        return self.root / "lance"

    @property
    def vector_graphs(self) -> Path:
        return self.root / "vector_graphs"

    def models(self, config: Config) -> Path:
        """The model cache, made here: one that cannot be made is the setting's fault, not a
        failed export (it was three tracebacks ending in advice about embedding.precision)."""
        if not config.embedding.cache_dir:
            return self.root / "models"
        cache = Path(config.embedding.cache_dir)
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise FailedPrecondition(
                f"embedding.cache_dir {str(cache)!r} cannot be made: {exc.strerror or exc}",
                reason="BAD_CONFIG",
            ) from None
        return cache


@dataclass(frozen=True)
class ModelIdentity:
    """The configured embedding model as the store records it: its name (with the precision),
    the dimension of its vectors, and a fingerprint of its files, which tells apart two models
    under one name (embedding.model_path pointed elsewhere)."""

    model_id: str
    dimension: int
    fingerprint: str
    source: Path
    max_seq_length: int

    @classmethod
    def of(cls, config: Config, embedder: Embedder, memo_dir: Path) -> ModelIdentity:
        source = model_dir(config.embedding)
        return cls(
            embedder.model_id,
            embedder.dimension,
            model_fingerprint(source, memo_dir),
            source,
            config.embedding.max_seq_length,
        )


def record_model_identity(db: Database, model: ModelIdentity) -> None:
    """The store's model from now on: at its first open, and by `mnemo reembed`."""
    with db.transaction() as cur:
        db.set_meta(cur, META_MODEL, model.model_id)
        db.set_meta(cur, META_DIMENSION, str(model.dimension))
        db.set_meta(cur, META_MODEL_FINGERPRINT, model.fingerprint)
        db.set_meta(cur, META_MAX_SEQ_LENGTH, str(model.max_seq_length))


def check_model_identity(db: Database, model: ModelIdentity) -> None:
    """First open records the model; later opens must match until `mnemo reembed`."""
    recorded, dim = db.get_meta(META_MODEL), db.get_meta(META_DIMENSION)
    if recorded is None:
        record_model_identity(db, model)
        return
    reembed = "run `mnemo reembed` to re-embed every memory with the configured model, or configure"
    if recorded != model.model_id or int(dim or 0) != model.dimension:
        raise EmbeddingModelMismatch(
            f"the store was embedded with {recorded!r} ({dim} dimensions) but the configured model is "
            f"{model.model_id!r} ({model.dimension} dimensions); {reembed} the original one"
        )
    fingerprint = db.get_meta(META_MODEL_FINGERPRINT)
    if fingerprint is None:
        # A store from before fingerprints, opened with the model it names: taken to be its
        # files (nothing recorded says otherwise), and recorded for the opens to come.
        log.info("embedding model files of %r fingerprinted for the store: %s", recorded, model.fingerprint)
        with db.transaction() as cur:
            db.set_meta(cur, META_MODEL_FINGERPRINT, model.fingerprint)
    elif fingerprint != model.fingerprint:
        raise EmbeddingModelMismatch(
            f"the store was embedded with other files of {recorded!r} (fingerprint {fingerprint}) than "
            f"the configured ones in {model.source} (fingerprint {model.fingerprint}); {reembed} "
            "the original files"
        )
    cut_at = db.get_meta(META_MAX_SEQ_LENGTH)
    if cut_at is None:  # as with the fingerprint: taken to be the configured one, recorded
        with db.transaction() as cur:
            db.set_meta(cur, META_MAX_SEQ_LENGTH, str(model.max_seq_length))
    elif int(cut_at) != model.max_seq_length:
        raise EmbeddingModelMismatch(
            f"the store was embedded with embedding.max_seq_length {cut_at}, and {model.max_seq_length} "
            f"is configured: long texts would get other vectors; {reembed} {cut_at}"
        )


class StartCancelled(Exception):
    """MnemoServer.start was told to stop before it served."""


class Core:
    """Stores, models and domain services: everything but the network."""

    def __init__(self, config: Config, *, accept_model_change: bool = False):
        self.config = config
        self.paths = DataPaths(config.data_dir)
        self.db = Database(
            self.paths.duckdb,
            memory_limit=config.storage.duckdb_memory_limit,
            rows=memory_repo.new_row_cache(config.storage.row_cache_rows),
            recent=RecentIds(config.storage.recent_ids_depth),
        )
        try:
            models = self.paths.models(config)
            self.embedder = build_embedder(config.embedding, models)
            self.index_embedder = build_embedder(
                config.embedding,
                models,
                threads=config.embedding.index_intra_op_threads,
                batch_size=config.embedding.index_batch_size,
                concurrent_runs=config.embedding.index_concurrent_runs,
            )
            model = ModelIdentity.of(config, self.embedder, models)
            # Adopted (recorded) once rebuild_index has re-embedded everything with it: a
            # reembed that failed before (an index it could not write) left the store
            # naming a model none of its vectors came from (probe).
            self._adopting = model if accept_model_change else None
            if not accept_model_change:
                check_model_identity(self.db, model)
            self.index = LanceIndex(
                self.paths.lance,
                self.embedder.dimension,
                config.index,
                graph_dir=self.paths.vector_graphs if config.index.graph_saved else None,
            )
            # Taken before anything writes, so that a crash from here on finds no seal.
            self.start_check = in_step.take_seal(self.db, self.index)
            # What an orderly close may seal: not tables this run was to check and did not.
            self._start_check_made = not self.start_check.needed
            self.indexer = IndexWorker(self.db, self.index, self.index_embedder, config.index)
            self.index.on_load = self._index_loaded
            self.index.on_unreadable = self._reindex_unreadable
            self.validator = Validator(config.limits)
            self.memories = MemoryService(
                self.db,
                self.indexer,
                self.validator,
                config.caps,
                config.index,
                self.embedder.model_id,
                group_commit_max_memories=config.storage.group_commit_max_memories,
                purge_batch=config.storage.purge_batch,
            )
            self.tenants = TenantService(self.db)
            self.ranking = RankingClient(config.ranking)
            self.query_embedder = CachedQueryEmbedder(
                self.embedder, config.embedding.query_cache_size, config.embedding.query_workers
            )
            self.recall = RecallPipeline(
                self.db,
                self.index,
                self.query_embedder,
                self.validator,
                config.limits,
                config.recall,
                self.ranking,
                config.ranking,
            )
            self.delivery = FeedbackDelivery(self.db, self.ranking, config.ranking)
            self.access_counts = AccessCounts(self.db)
            self.sessions = SessionService(
                self.db,
                self.recall,
                self.ranking,
                self.access_counts,
                self.validator,
                config.limits,
                config.ranking,
                on_feedback=self.delivery.notify,
                group_commit_max_sessions=config.storage.group_commit_max_sessions,
            )
            self.learnings = LearningService(self.db, self.validator)
            self.skills = SkillService(self.db, self.validator)
            self.retention = RetentionWorker(self.db, config.retention)
        except BaseException:
            self.db.close()
            raise

    def warm_up(self) -> None:
        """Pay one-time costs (onnxruntime's first run, loading the in-memory indices of the
        most recently written tenants while the residency bounds allow, filling the row
        cache, compiling the search kernels) before SERVING, so the first real call is
        as fast as the rest. The other tenants' indices are loaded by their first search."""
        self.query_embedder.embed_one("warm-up query")
        started = time.monotonic()
        kernels.compile_now()
        log.info("search kernels ready in %.2f s", time.monotonic() - started)
        started = time.monotonic()
        rows = memory_repo.preload(self.db.reader(), self.db.rows, self.db.rows.max_rows)
        log.info("row cache: %d rows read in %.2f s", rows, time.monotonic() - started)
        started = time.monotonic()
        tenants = self.index.tenants_newest_first()
        warmed = dropped = 0
        for tenant_id in tenants:
            if not self.index.has_room():
                break
            if self._warm(tenant_id):
                warmed += 1
            else:
                dropped += 1
        if dropped:
            self.indexer.reconcile()  # the dropped tables' memories, submitted for indexing
        self.index.trim()  # the tables opened at start-up and not loaded
        log.info(
            "indices of %d of %d tenants loaded in %.2f s (index.max_resident_*: others at first search)",
            warmed,
            len(tenants),
            time.monotonic() - started,
        )

    def _warm(self, tenant_id: str) -> bool:
        """Load the tenant's index; False if its table did not read (damaged files, which
        warm-up is the first to read in full) and was dropped to be indexed again."""
        try:
            self.index.warm(tenant_id)
        except TableUnreadable as exc:
            log.warning("%s", exc)
            self.index.drop(tenant_id)
            self._index_again(tenant_id, "unreadable")
            return False
        return True

    def _index_loaded(self, tenant_id: str) -> None:
        # Rows the last run wrote after its last optimize make every vector search scan them
        # flat in LanceDB (~2x its CPU at 100k rows), and only a write would have scheduled
        # their fold: a tenant that is only read would pay that until then.
        behind = self.index.rows_to_fold(tenant_id)
        if behind:
            self.indexer.maintenance.wrote(tenant_id, behind)

    def optimize_dirty(self, *, force: bool = False) -> list[str]:
        """Compact tenants with many small fragments; fold new rows into the indices of
        tenants whose writes settled (or waited too long). Returns the tenants optimized; one
        tenant's failure is logged and leaves the others' maintenance to run."""
        work = self.indexer.maintenance.take(force)
        for tenant_id in work.compact:
            try:
                self._compact(tenant_id)
            except Exception:  # the next writes ask again; the other tenants go on
                log.exception("compaction of %s failed", tenant_id)
        optimized: list[str] = []
        for tenant_id in work.optimize:
            try:
                self._optimize(tenant_id, backlog_only=tenant_id in work.backlog_only)
            except Exception:  # its rows wait again; the other tenants go on
                log.exception("optimize of %s failed; tried again later", tenant_id)
                self.indexer.maintenance.failed(tenant_id, work.rows.get(tenant_id, 0))
            else:
                optimized.append(tenant_id)
        return optimized

    def _compact(self, tenant_id: str) -> None:
        started = time.monotonic()
        removed = self.index.compact(tenant_id)
        took = time.monotonic() - started
        log.log(
            _maintenance_level(took), "compacted %s in %.2f s: %d fragments gone", tenant_id, took, removed
        )

    def _optimize(self, tenant_id: str, *, backlog_only: bool) -> None:
        started = time.monotonic()
        if backlog_only:  # deltas merged only past the backlog's bound
            backlog_bound = self.config.index.ann_backlog_max_deltas
            done = self.index.optimize(tenant_id, merge_deltas=backlog_bound > 0, max_deltas=backlog_bound)
        else:
            done = self.index.optimize(tenant_id)
        took = time.monotonic() - started
        # A delta merge is rare (every ann_max_deltas optimizes) and long; charged to the
        # share it would hold the next few regular optimizes back for minutes.
        self.indexer.maintenance.optimized(tenant_id, took - done.get("merge_s", 0.0))
        log.log(_maintenance_level(took), "optimized %s in %.2f s: %s", tenant_id, took, done)

    def search_index_lag(self, tenant_id: str) -> int:
        return self.index.unindexed_rows(tenant_id)

    def rebuild_index(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Drop LanceDB and re-embed every live memory from DuckDB (offline command)."""
        self.index.drop_all()
        with self.db.transaction() as cur:
            index_marks.reset_index_marks(cur)
        total = self.indexer.reconcile()
        self.indexer.start()
        try:
            while not self.indexer.wait_idle(0.5):
                if progress:
                    progress(total - self.indexer.pending(), total)
            for tenant_id in self.index.tenants():
                self.index.optimize(tenant_id)
            self._start_check_made = True  # every table written afresh from the store
            if self._adopting is not None:
                record_model_identity(self.db, self._adopting)
        finally:
            self.indexer.stop()
        if progress:
            progress(total, total)
        return total

    def check_index_at_start(self) -> None:
        """Put the index in step with the store: before serving, tables of an older layout
        rebuilt and rows a crash left behind submitted; once serving, rows a crash left
        behind or ahead put right by the index worker. Only the tables the last shutdown's
        seal does not vouch for are checked (index/in_step.py)."""
        check = self.start_check
        # Tables an older server wrote with another layout, or left with an ANN index that
        # no longer reads, are rebuilt from DuckDB.
        for tenant_id in self.index.drop_outdated(check.layout):
            self._index_again(tenant_id, "older layout or unreadable")
        in_step.record_layout(self.index)  # what a start after a crash need not check again
        self.indexer.forget_missing_tables()
        tables = self.indexer.check_rows(check.rows)
        self._start_check_made = True
        # Anything committed but not indexed before a crash (or indexed but since deleted).
        queued = self.indexer.reconcile()
        log.info(
            "index checked at start-up: %s; %d memories to (re)index or remove; rows of %d table(s) "
            "to compare with the store's once serving",
            "every table's layout"
            if check.layout is None
            else f"layout of {len(check.layout)} table(s) written since the last orderly shutdown",
            queued,
            tables,
        )

    def _reindex_unreadable(self, tenant_id: str) -> None:
        """A table the loading thread found damaged, and dropped: indexed again."""
        self._index_again(tenant_id, "unreadable")
        self.indexer.reconcile()

    def _index_again(self, tenant_id: str, why: str) -> None:
        """After its table was dropped: DuckDB, the source of truth, no longer marks the
        tenant's memories as indexed, so the next reconcile submits every one of them."""
        log.info("index table dropped (%s): re-indexing tenant %s", why, tenant_id)
        with self.db.transaction() as cur:
            index_marks.reset_index_marks(cur, tenant_id)

    @property
    def index_in_step(self) -> bool:
        """Whether every check start-up was to make of the index is done: only then may an
        orderly close seal it."""
        return self._start_check_made and self.indexer.rows_checked

    def close(self) -> None:
        self.delivery.stop()
        self.recall.close()
        indexer_stopped = self.indexer.stop()
        self.index_embedder.close()
        self.query_embedder.close()
        self.embedder.close()
        self.index.close()
        self.ranking.close()
        try:
            self.access_counts.flush()
        except Exception:  # closing goes on: the counts are a feature, not acknowledged writes
            log.exception("access counts not written at close")
        # Work left in the worker's queue (a delete whose row is still in the index, say)
        # would not be done by the next start if the seal vouched for the tables.
        if indexer_stopped and not self.indexer.pending() and self.index_in_step:
            try:
                in_step.seal(self.db, self.index)
            except Exception:  # the next start checks every table instead
                log.exception("index not sealed at close")
        self.db.close()


class MnemoServer:
    """Core + gRPC server + background workers, with an orderly start and stop."""

    def __init__(self, config: Config):
        if not config.auth.enabled and not is_loopback(config.server.host):
            raise FailedPrecondition(
                f"authentication is disabled, so the server only binds loopback addresses, not "
                f"{config.server.host!r}; enable auth or bind 127.0.0.1",
                reason="INSECURE_BIND",
            )
        self.config = config
        if config.auth.enabled and not config.auth.admin_key:
            log.warning("auth.admin_key is empty: admin calls (tenants, API keys) are refused")
        call_times = CallTimes()
        self.lock_wait = LockWaitProbe(config.server.lock_wait_probe_ms)
        interceptor = ApiInterceptor(
            self._authenticate,
            ComputeGate(
                config.server.compute_slots,
                config.server.compute_reserved_slots,
                config.server.compute_max_waiters,
                config.server.compute_waiters_per_tenant,
            ),
            config.server.slow_call_ms,
            call_times,
            config.server.max_streams,
            config.server.max_streams_per_tenant,
        )
        # Before the core opens the stores: its TLS settings are checked here.
        self.grpc = GrpcServer(config.server, interceptor)
        self.core = Core(config)
        self.core.tenants.on_revocation(interceptor.end_streams_of_key)
        self.scheduler = Scheduler()
        self.grpc.add(
            memory_service_pb2_grpc.add_MemoryServiceServicer_to_server,
            MemoryServicer(
                self.core.memories,
                self.core.recall,
                self.core.embedder.dimension,
                DataDirSize(config.data_dir, exclude=(self.core.paths.models(config),)),
                self.core.sessions,
                call_times,
                self.lock_wait,
            ),
            "mnemo.v1.MemoryService",
        )
        self.grpc.add(
            admin_service_pb2_grpc.add_AdminServiceServicer_to_server,
            AdminServicer(self.core.tenants, self.core.validator, self.core.delivery),
            "mnemo.v1.AdminService",
        )
        self.grpc.add(
            learning_service_pb2_grpc.add_LearningServiceServicer_to_server,
            LearningServicer(self.core.learnings),
            "mnemo.v1.LearningService",
        )
        self.grpc.add(
            skill_service_pb2_grpc.add_SkillServiceServicer_to_server,
            SkillServicer(self.core.skills),
            "mnemo.v1.SkillService",
        )
        self._stopped = threading.Event()

    def _authenticate(self, token: str) -> Principal:
        if not self.config.auth.enabled:
            return Principal(tenant_id=self.config.auth.local_tenant, is_admin=True)
        return self.core.tenants.authenticate(token, self.config.auth.admin_key)

    @property
    def port(self) -> int:
        return self.grpc.port

    def start(self, cancelled: Callable[[], bool] = lambda: False) -> int:
        """Warm up and serve; the port. StartCancelled, having served nothing, once
        `cancelled()` is true between the stages (a SIGTERM during warm-up was answered by
        binding the port, reporting SERVING and only then stopping; shutdown probe)."""
        core = self.core
        if not self.config.auth.enabled:
            core.tenants.ensure_tenant(self.config.auth.local_tenant)
        core.check_index_at_start()
        if not cancelled():
            core.warm_up()
        if cancelled():
            self.stop(0.0)
            raise StartCancelled("stopped before serving")
        core.indexer.start()
        core.delivery.start()
        cfg = self.config
        self.scheduler.add("reconcile", cfg.index.reconcile_interval_s, core.indexer.reconcile)
        self.scheduler.add("optimize", cfg.index.optimize_interval_s, core.optimize_dirty)
        self.scheduler.add("index_residency", cfg.index.optimize_interval_s, core.index.trim)
        # Soon after start too: a sweep only every interval_s (6 h) after start never came
        # for a server restarted more often, and windows were overrun by up to that (probe).
        self.scheduler.add(
            "retention", cfg.retention.interval_s, core.retention.sweep, first_after_s=RETENTION_FIRST_AFTER_S
        )
        self.scheduler.add("access_counts", cfg.ranking.access_flush_interval_s, core.access_counts.flush)
        self.scheduler.start()
        try:
            port = self.grpc.start()
        except BaseException:
            # Not served (the port in use, say): the workers just started and the stores are
            # stopped and closed here, as after serving, not left to the interpreter's exit.
            self.stop(0.0)
            raise
        self.lock_wait.start()
        log.info("mnemo serving on %s (data in %s)", listen_address(cfg.server.host, port), cfg.data_dir)
        return port

    def stop(self, grace_s: float | None = None) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        # Past the grace, CreateMemory/UpdateMemory calls waiting for the index answer
        # PENDING: they held the stop ~30 s (index.max_wait_for_index_s), whatever the grace.
        self.grpc.stop(
            self.config.server.shutdown_grace_s if grace_s is None else grace_s,
            on_calls_cancelled=self.core.indexer.release_waiters,
        )
        self.lock_wait.stop()
        self.scheduler.stop()
        self.core.close()
