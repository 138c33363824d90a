"""mnemo.v1.MemoryService: protobuf in, domain call, protobuf out."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc

from mnemo.v1 import memory_service_pb2 as pb
from mnemo.v1 import memory_service_pb2_grpc as pb_grpc
from mnemo_server import __version__
from mnemo_server.api import convert, session_convert
from mnemo_server.api.interceptor import current_principal
from mnemo_server.api.server import MAX_MESSAGE_BYTES
from mnemo_server.diagnostics import DataDirSize, peak_rss_bytes, rss_bytes
from mnemo_server.errors import InvalidArgument
from mnemo_server.index.residency import ResidencyStats
from mnemo_server.latency_histogram import BUCKET_UPPER_MS, CallTimes
from mnemo_server.lock_wait_probe import LockWaitProbe
from mnemo_server.memory.model import DEFAULT_CONFIDENCE, DEFAULT_IMPORTANCE
from mnemo_server.memory.purges import Patience
from mnemo_server.memory.service import MemoryPatch, MemoryService
from mnemo_server.retrieval.recall import RecallPipeline, RecallQuery, Stage
from mnemo_server.sessions.service import Feedback, SessionService, StartSessionInput
from mnemo_server.store import session_repo
from mnemo_server.store.database import WriteDomain
from mnemo_server.tenancy.tenants import require_tenant

_STAGES = {
    pb.RECALL_STAGE_VECTOR: Stage.VECTOR,
    pb.RECALL_STAGE_FULL_TEXT: Stage.FULL_TEXT,
    pb.RECALL_STAGE_ENTITY_STRIP: Stage.ENTITY_STRIP,
    pb.RECALL_STAGE_ADJACENCY: Stage.ADJACENCY,
    pb.RECALL_STAGE_SPEAKER: Stage.SPEAKER,
    pb.RECALL_STAGE_DATE: Stage.DATE,
    pb.RECALL_STAGE_TIME_QUESTION: Stage.TIME_QUESTION,
    pb.RECALL_STAGE_SESSION_SUPPORT: Stage.SESSION_SUPPORT,
    pb.RECALL_STAGE_IMPORTANCE: Stage.IMPORTANCE,
}
# Leave this much of the caller's deadline for the response itself.
_DEADLINE_MARGIN_S = 0.05


def _tenant() -> str:
    return require_tenant(current_principal())


def _wait_budget(context: grpc.ServicerContext) -> float:
    remaining = context.time_remaining()
    return 0.0 if remaining is None else max(0.0, remaining - _DEADLINE_MARGIN_S)


class MemoryServicer(pb_grpc.MemoryServiceServicer):
    def __init__(
        self,
        memories: MemoryService,
        recall: RecallPipeline,
        embedding_dimension: int,
        data_size: DataDirSize,
        sessions: SessionService,
        call_times: CallTimes,
        lock_wait: LockWaitProbe,
    ):
        self.memories = memories
        self.recall_pipeline = recall
        self.embedding_dimension = embedding_dimension
        self.data_size = data_size
        self.sessions = sessions
        self.call_times = call_times
        self.lock_wait = lock_wait

    def CreateMemory(
        self, request: pb.CreateMemoryRequest, context: grpc.ServicerContext
    ) -> pb.CreateMemoryResponse:
        tenant = _tenant()
        self.memories.validator.request_id(request.request_id)
        result = self.memories.create(
            tenant,
            convert.draft_from_pb(request.memory, "memory"),
            key=convert.idempotency_key("CreateMemory", request, request.request_id),
            wait_for_index=request.wait_for_index,
            wait_timeout_s=_wait_budget(context),
        )
        return pb.CreateMemoryResponse(
            memory=convert.memory_to_pb(result.memory), deduplicated=result.deduplicated
        )

    def BatchCreateMemories(
        self, request: pb.BatchCreateMemoriesRequest, context: grpc.ServicerContext
    ) -> pb.BatchCreateMemoriesResponse:
        tenant = _tenant()
        self.memories.validator.request_id(request.request_id)
        limit = self.memories.validator.limits.max_batch_size
        if len(request.requests) > limit:
            raise InvalidArgument("requests", f"holds {len(request.requests)} memories; the limit is {limit}")
        drafts = [
            convert.draft_from_pb(r.memory, f"requests[{i}].memory") for i, r in enumerate(request.requests)
        ]
        results = self.memories.batch_create(
            tenant,
            drafts,
            key=convert.idempotency_key("BatchCreateMemories", request, request.request_id),
            wait_for_index=request.wait_for_index,
            wait_timeout_s=_wait_budget(context),
            answer_bytes=MAX_MESSAGE_BYTES,
        )
        return pb.BatchCreateMemoriesResponse(
            results=[
                pb.CreateMemoryResponse(memory=convert.memory_to_pb(r.memory), deduplicated=r.deduplicated)
                for r in results
            ]
        )

    def GetMemory(self, request: pb.GetMemoryRequest, context: grpc.ServicerContext) -> pb.GetMemoryResponse:
        return pb.GetMemoryResponse(memory=convert.memory_to_pb(self.memories.get(_tenant(), request.id)))

    def GetMemoryHistory(
        self, request: pb.GetMemoryHistoryRequest, context: grpc.ServicerContext
    ) -> pb.GetMemoryHistoryResponse:
        memory_id, entries, token = self.memories.history(
            _tenant(), request.id, page_size=request.page_size, page_token=request.page_token
        )
        return pb.GetMemoryHistoryResponse(
            memory_id=memory_id,
            entries=[
                pb.MemoryHistoryEntry(
                    action=e.action,
                    actor=e.actor,
                    reason=e.reason,
                    details=convert.dict_to_struct(e.details),
                    time=convert.ns_to_ts(e.time_ns),
                )
                for e in entries
            ],
            next_page_token=token,
        )

    def ListMemories(
        self, request: pb.ListMemoriesRequest, context: grpc.ServicerContext
    ) -> pb.ListMemoriesResponse:
        rows, token = self.memories.list_memories(
            _tenant(),
            convert.filter_from_pb(request),
            page_size=request.page_size,
            page_token=request.page_token,
            show_deleted=request.show_deleted,
        )
        return pb.ListMemoriesResponse(
            memories=[convert.memory_to_pb(m) for m in rows], next_page_token=token
        )

    def UpdateMemory(
        self, request: pb.UpdateMemoryRequest, context: grpc.ServicerContext
    ) -> pb.UpdateMemoryResponse:
        tenant = _tenant()
        self.memories.validator.request_id(request.request_id)
        m, paths = request.memory, list(request.update_mask.paths)
        # A masked field left unset takes the value CreateMemory gives it (as AIP-134 asks);
        # a field the mask does not name is ignored, not read (its NaN refused an update).
        patch = MemoryPatch(
            importance=m.importance if m.HasField("importance") else DEFAULT_IMPORTANCE,
            confidence=m.confidence if m.HasField("confidence") else DEFAULT_CONFIDENCE,
            pinned=m.pinned,
            category=m.category,
            metadata=convert.struct_to_dict(m.metadata, "memory.metadata") if "metadata" in paths else None,
            event_time_ns=convert.opt_ts(m, "event_time", "memory") if "event_time" in paths else None,
            content=m.content,
        )
        updated = self.memories.update(
            tenant,
            m.id,
            patch,
            paths,
            key=convert.idempotency_key("UpdateMemory", request, request.request_id),
            wait_for_index=request.wait_for_index,
            wait_timeout_s=_wait_budget(context),
        )
        return pb.UpdateMemoryResponse(memory=convert.memory_to_pb(updated))

    def DeleteMemory(
        self, request: pb.DeleteMemoryRequest, context: grpc.ServicerContext
    ) -> pb.DeleteMemoryResponse:
        tenant = _tenant()
        self.memories.validator.request_id(request.request_id)
        deleted = self.memories.delete(
            tenant, request.id, key=convert.idempotency_key("DeleteMemory", request, request.request_id)
        )
        return pb.DeleteMemoryResponse(memory=convert.memory_to_pb(deleted))

    def PurgeMemories(
        self, request: pb.PurgeMemoriesRequest, context: grpc.ServicerContext
    ) -> pb.PurgeMemoriesResponse:
        tenant = _tenant()
        self.memories.validator.request_id(request.request_id)
        purged = self.memories.purge(
            tenant,
            convert.filter_from_pb(request),
            force=request.force,
            all_memories=request.all_memories,
            snapshot=request.snapshot_token,
            key=convert.idempotency_key("PurgeMemories", request, request.request_id),
            patience=Patience(_wait_budget(context), context.is_active),
        )
        return pb.PurgeMemoriesResponse(purge_count=purged.count, snapshot_token=purged.snapshot_token)

    def Recall(self, request: pb.RecallRequest, context: grpc.ServicerContext) -> pb.RecallResponse:
        tenant = _tenant()
        if request.options.rerank_deadline_ms < 0:
            raise InvalidArgument("options.rerank_deadline_ms", "must not be negative")
        disabled = set()
        for i, stage in enumerate(request.options.disabled_stages):
            if stage not in _STAGES:
                raise InvalidArgument(f"options.disabled_stages[{i}]", f"unknown stage {stage}")
            disabled.add(_STAGES[stage])
        result = self.recall_pipeline.recall(
            tenant,
            RecallQuery(
                text=request.query,
                top_k=request.top_k,
                filter=convert.filter_from_pb(request),
                disabled=frozenset(disabled),
                explain=request.options.explain,
                rerank=request.options.rerank,
                rerank_deadline_s=request.options.rerank_deadline_ms / 1000.0,
                caller_remaining_s=context.time_remaining(),
            ),
        )
        return pb.RecallResponse(
            hits=[
                pb.RecallHit(
                    memory=convert.memory_to_pb(h.memory),
                    score=h.score,
                    explanation=h.explanation,
                    scores=pb.RecallScores(
                        vector_score=h.scores.vector_score,
                        vector_rank=h.scores.vector_rank,
                        text_score=h.scores.text_score,
                        text_rank=h.scores.text_rank,
                        fused_score=h.scores.fused_score,
                        signals=h.scores.signals,
                    ),
                )
                for h in result.hits
            ],
            vector_candidates=result.vector_candidates,
            text_candidates=result.text_candidates,
            took_ms=result.took_ms,
            reranked=result.reranked,
            rerank_fallback_reason=result.rerank_fallback_reason,
        )

    def ExportMemories(
        self, request: pb.ExportMemoriesRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ExportMemoriesResponse]:
        tenant = _tenant()
        for rows, done, total in self.memories.export(
            tenant, convert.filter_from_pb(request), include_deleted=request.include_deleted
        ):
            yield pb.ExportMemoriesResponse(
                memories=[convert.memory_to_pb(m) for m in rows], exported_count=done, total_count=total
            )

    def ImportMemories(
        self, request_iterator: Iterator[pb.ImportMemoriesRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.ImportMemoriesResponse]:
        tenant = _tenant()
        imported = skipped = received = 0
        for n, request in enumerate(request_iterator):
            batch = [
                convert.exported_memory_from_pb(m, f"messages[{n}].memories[{i}]")
                for i, m in enumerate(request.memories)
            ]
            done, skip = self.memories.import_batch(tenant, batch, field_prefix=f"messages[{n}].memories")
            imported, skipped, received = imported + done, skipped + skip, received + len(batch)
            yield pb.ImportMemoriesResponse(
                imported_count=imported, skipped_count=skipped, received_count=received
            )

    def GetStatus(self, request: pb.GetStatusRequest, context: grpc.ServicerContext) -> pb.GetStatusResponse:
        s = self.memories.status(_tenant())
        rows, recent = self.memories.db.rows.stats(), self.memories.db.recent.stats()
        groups = self.memories.creates.group_stats
        locks = [
            pb.WriteLockStats(
                domain=d.value, transactions=x.transactions, held_seconds=x.held_s, waited_seconds=x.waited_s
            )
            for d, x in self.memories.db.write_lock_stats.items()
        ]
        outbox_pending, outbox_parked = session_repo.outbox_counts(self.memories.db.reader())
        resp = pb.GetStatusResponse(
            server_version=__version__,
            embedding_model=self.memories.embedding_model,
            embedding_dimension=self.embedding_dimension,
            memory_count=s.live,
            deleted_count=s.deleted,
            pending_index_count=s.pending_index,
            memory_count_by_type=s.by_type,
            process_rss_bytes=rss_bytes(),
            process_peak_rss_bytes=peak_rss_bytes(),
            process_cpu_seconds=time.process_time(),
            search_index_lag_rows=s.search_index_lag,
            ranking_fallbacks=self.sessions.baseline_sessions(),
            sidecar_call_failures=self.sessions.ranking.failures(),
            sidecar_circuit=self.sessions.ranking.breaker.state.value
            if self.sessions.ranking.enabled
            else "",
            feedback_outbox_pending=outbox_pending,
            feedback_outbox_undeliverable=outbox_parked,
            index_failed_batches=s.index_failed_batches,
            index_last_failure_reason=s.index_last_failure_reason,
            index_tables_to_check=s.index_tables_to_check,
            data_bytes=self.data_size.get(),
            write_lock=next(x for x in locks if x.domain == WriteDomain.MEMORIES.value),
            write_locks=locks,
            cache_use=pb.CacheUse(
                index_session_bytes=s.cache_use.index_session_bytes,
                scope_vector_bytes=s.cache_use.scope_vector_bytes,
                text_posting_bytes=s.cache_use.text_posting_bytes,
                index_row_id_bytes=s.cache_use.index_row_id_bytes,
                vector_graph_bytes=s.cache_use.vector_graph_bytes,
                vector_graph_rows=s.cache_use.vector_graph_rows,
                row_cache_rows=rows.rows,
                row_cache_hits=rows.hits,
                row_cache_misses=rows.misses,
                recent_id_scopes=recent.scopes,
                recent_id_hits=recent.hits,
                recent_id_misses=recent.misses,
                row_cache_fills_skipped=rows.fills_skipped,
                recent_id_fills_skipped=recent.fills_skipped,
            ),
            access_counts_pending=self.sessions.access.pending(),
            index_residency=_residency_pb(s.index_residency, s.index_loaded),
            create_group_commit=pb.GroupCommitStats(
                calls=groups.requests, groups=groups.groups, largest_group=groups.largest
            ),
            method_latencies=[
                pb.MethodLatency(
                    method=m.method,
                    calls=m.calls,
                    failed=m.failed,
                    p50_ms=m.quantile(0.5),
                    p99_ms=m.quantile(0.99),
                    max_ms=m.max_ms,
                    bucket_counts=m.bucket_counts,
                )
                for m in self.call_times.snapshot()
            ],
            latency_bucket_upper_ms=BUCKET_UPPER_MS,
            interpreter_lock_wait=_lock_wait_pb(self.lock_wait),
        )
        if s.oldest_pending_ns is not None:
            resp.oldest_pending_index_time.CopyFrom(convert.ns_to_ts(s.oldest_pending_ns))
        if s.index_last_failure_ns:
            resp.index_last_failure_time.CopyFrom(convert.ns_to_ts(s.index_last_failure_ns))
        return resp

    # --- sessions ------------------------------------------------------------------------

    def StartSession(
        self, request: pb.StartSessionRequest, context: grpc.ServicerContext
    ) -> pb.StartSessionResponse:
        tenant = _tenant()
        self.memories.validator.request_id(request.request_id)
        key = convert.idempotency_key("StartSession", request, request.request_id)
        bundle = self.sessions.start(
            tenant,
            StartSessionInput(
                session_id=request.session_id,
                context=request.context,
                agent_id=request.agent_id,
                persona_id=request.persona_id,
                project_id=request.project_id,
                token_budget=request.token_budget,
                max_memories=request.max_memories,
                request_fingerprint=f"{key.request_id}:{key.fingerprint}" if key else "",
            ),
            context.time_remaining(),
        )
        return session_convert.start_response(bundle)

    def EndSession(
        self, request: pb.EndSessionRequest, context: grpc.ServicerContext
    ) -> pb.EndSessionResponse:
        tenant = _tenant()
        self.memories.validator.request_id(request.request_id)
        continuity, pairs = self.sessions.end(
            tenant,
            request.session_id,
            [Feedback(f.memory_id, f.relevance, f.used) for f in request.feedback],
            request.transcript,
            key=convert.idempotency_key("EndSession", request, request.request_id),
        )
        return pb.EndSessionResponse(
            session_id=request.session_id,
            continuity=session_convert.continuity_pb(continuity),
            training_pairs=pairs,
        )

    def GetSession(
        self, request: pb.GetSessionRequest, context: grpc.ServicerContext
    ) -> pb.GetSessionResponse:
        return pb.GetSessionResponse(
            session=session_convert.session_pb(self.sessions.get(_tenant(), request.session_id))
        )


def _residency_pb(stats: ResidencyStats | None, loaded: bool) -> pb.IndexResidency | None:
    if stats is None:
        return None
    return pb.IndexResidency(
        tenants=stats.tenants,
        rows=stats.rows,
        max_tenants=stats.max_tenants,
        max_rows=stats.max_rows,
        loads=stats.loads,
        drops=stats.drops,
        tenant_loaded=loaded,
    )


def _lock_wait_pb(probe: LockWaitProbe) -> pb.InterpreterLockWait:
    waits = probe.snapshot()
    return pb.InterpreterLockWait(
        samples=waits.count,
        interval_ms=probe.interval_s * 1000.0,
        p50_ms=waits.quantile(0.5),
        p99_ms=waits.quantile(0.99),
        max_ms=waits.max_ms,
        bucket_counts=waits.bucket_counts if probe.enabled else (),
    )
