import datetime

from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from mnemo.v1 import memory_pb2 as _memory_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RankingPath(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RANKING_PATH_UNSPECIFIED: _ClassVar[RankingPath]
    RANKING_PATH_MODEL: _ClassVar[RankingPath]
    RANKING_PATH_BASELINE: _ClassVar[RankingPath]
    RANKING_PATH_FALLBACK: _ClassVar[RankingPath]

class SessionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_STATE_UNSPECIFIED: _ClassVar[SessionState]
    SESSION_STATE_ACTIVE: _ClassVar[SessionState]
    SESSION_STATE_ENDED: _ClassVar[SessionState]

class RecallStage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECALL_STAGE_UNSPECIFIED: _ClassVar[RecallStage]
    RECALL_STAGE_VECTOR: _ClassVar[RecallStage]
    RECALL_STAGE_FULL_TEXT: _ClassVar[RecallStage]
    RECALL_STAGE_ENTITY_STRIP: _ClassVar[RecallStage]
    RECALL_STAGE_ADJACENCY: _ClassVar[RecallStage]
    RECALL_STAGE_SPEAKER: _ClassVar[RecallStage]
    RECALL_STAGE_DATE: _ClassVar[RecallStage]
    RECALL_STAGE_TIME_QUESTION: _ClassVar[RecallStage]
    RECALL_STAGE_SESSION_SUPPORT: _ClassVar[RecallStage]
    RECALL_STAGE_IMPORTANCE: _ClassVar[RecallStage]
RANKING_PATH_UNSPECIFIED: RankingPath
RANKING_PATH_MODEL: RankingPath
RANKING_PATH_BASELINE: RankingPath
RANKING_PATH_FALLBACK: RankingPath
SESSION_STATE_UNSPECIFIED: SessionState
SESSION_STATE_ACTIVE: SessionState
SESSION_STATE_ENDED: SessionState
RECALL_STAGE_UNSPECIFIED: RecallStage
RECALL_STAGE_VECTOR: RecallStage
RECALL_STAGE_FULL_TEXT: RecallStage
RECALL_STAGE_ENTITY_STRIP: RecallStage
RECALL_STAGE_ADJACENCY: RecallStage
RECALL_STAGE_SPEAKER: RecallStage
RECALL_STAGE_DATE: RecallStage
RECALL_STAGE_TIME_QUESTION: RecallStage
RECALL_STAGE_SESSION_SUPPORT: RecallStage
RECALL_STAGE_IMPORTANCE: RecallStage

class CreateMemoryRequest(_message.Message):
    __slots__ = ("memory", "request_id", "wait_for_index")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_INDEX_FIELD_NUMBER: _ClassVar[int]
    memory: _memory_pb2.Memory
    request_id: str
    wait_for_index: bool
    def __init__(self, memory: _Optional[_Union[_memory_pb2.Memory, _Mapping]] = ..., request_id: _Optional[str] = ..., wait_for_index: _Optional[bool] = ...) -> None: ...

class CreateMemoryResponse(_message.Message):
    __slots__ = ("memory", "deduplicated")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    memory: _memory_pb2.Memory
    deduplicated: bool
    def __init__(self, memory: _Optional[_Union[_memory_pb2.Memory, _Mapping]] = ..., deduplicated: _Optional[bool] = ...) -> None: ...

class BatchCreateMemoriesRequest(_message.Message):
    __slots__ = ("requests", "request_id", "wait_for_index")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_INDEX_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[CreateMemoryRequest]
    request_id: str
    wait_for_index: bool
    def __init__(self, requests: _Optional[_Iterable[_Union[CreateMemoryRequest, _Mapping]]] = ..., request_id: _Optional[str] = ..., wait_for_index: _Optional[bool] = ...) -> None: ...

class BatchCreateMemoriesResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CreateMemoryResponse]
    def __init__(self, results: _Optional[_Iterable[_Union[CreateMemoryResponse, _Mapping]]] = ...) -> None: ...

class GetMemoryRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetMemoryResponse(_message.Message):
    __slots__ = ("memory",)
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    memory: _memory_pb2.Memory
    def __init__(self, memory: _Optional[_Union[_memory_pb2.Memory, _Mapping]] = ...) -> None: ...

class GetMemoryHistoryRequest(_message.Message):
    __slots__ = ("id", "page_size", "page_token")
    ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    id: str
    page_size: int
    page_token: str
    def __init__(self, id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class MemoryHistoryEntry(_message.Message):
    __slots__ = ("action", "actor", "reason", "details", "time")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    action: str
    actor: str
    reason: str
    details: _struct_pb2.Struct
    time: _timestamp_pb2.Timestamp
    def __init__(self, action: _Optional[str] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ..., details: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetMemoryHistoryResponse(_message.Message):
    __slots__ = ("memory_id", "entries", "next_page_token")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    entries: _containers.RepeatedCompositeFieldContainer[MemoryHistoryEntry]
    next_page_token: str
    def __init__(self, memory_id: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[MemoryHistoryEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListMemoriesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "filter", "show_deleted")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    SHOW_DELETED_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    filter: _memory_pb2.MemoryFilter
    show_deleted: bool
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., filter: _Optional[_Union[_memory_pb2.MemoryFilter, _Mapping]] = ..., show_deleted: _Optional[bool] = ...) -> None: ...

class ListMemoriesResponse(_message.Message):
    __slots__ = ("memories", "next_page_token")
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[_memory_pb2.Memory]
    next_page_token: str
    def __init__(self, memories: _Optional[_Iterable[_Union[_memory_pb2.Memory, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateMemoryRequest(_message.Message):
    __slots__ = ("memory", "update_mask", "request_id", "wait_for_index")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_INDEX_FIELD_NUMBER: _ClassVar[int]
    memory: _memory_pb2.Memory
    update_mask: _field_mask_pb2.FieldMask
    request_id: str
    wait_for_index: bool
    def __init__(self, memory: _Optional[_Union[_memory_pb2.Memory, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ..., request_id: _Optional[str] = ..., wait_for_index: _Optional[bool] = ...) -> None: ...

class UpdateMemoryResponse(_message.Message):
    __slots__ = ("memory",)
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    memory: _memory_pb2.Memory
    def __init__(self, memory: _Optional[_Union[_memory_pb2.Memory, _Mapping]] = ...) -> None: ...

class DeleteMemoryRequest(_message.Message):
    __slots__ = ("id", "request_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    request_id: str
    def __init__(self, id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class DeleteMemoryResponse(_message.Message):
    __slots__ = ("memory",)
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    memory: _memory_pb2.Memory
    def __init__(self, memory: _Optional[_Union[_memory_pb2.Memory, _Mapping]] = ...) -> None: ...

class PurgeMemoriesRequest(_message.Message):
    __slots__ = ("filter", "force", "request_id", "all_memories", "snapshot_token")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ALL_MEMORIES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    filter: _memory_pb2.MemoryFilter
    force: bool
    request_id: str
    all_memories: bool
    snapshot_token: str
    def __init__(self, filter: _Optional[_Union[_memory_pb2.MemoryFilter, _Mapping]] = ..., force: _Optional[bool] = ..., request_id: _Optional[str] = ..., all_memories: _Optional[bool] = ..., snapshot_token: _Optional[str] = ...) -> None: ...

class PurgeMemoriesResponse(_message.Message):
    __slots__ = ("purge_count", "snapshot_token")
    PURGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    purge_count: int
    snapshot_token: str
    def __init__(self, purge_count: _Optional[int] = ..., snapshot_token: _Optional[str] = ...) -> None: ...

class RecallOptions(_message.Message):
    __slots__ = ("disabled_stages", "explain", "rerank", "rerank_deadline_ms")
    DISABLED_STAGES_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    RERANK_FIELD_NUMBER: _ClassVar[int]
    RERANK_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    disabled_stages: _containers.RepeatedScalarFieldContainer[RecallStage]
    explain: bool
    rerank: bool
    rerank_deadline_ms: int
    def __init__(self, disabled_stages: _Optional[_Iterable[_Union[RecallStage, str]]] = ..., explain: _Optional[bool] = ..., rerank: _Optional[bool] = ..., rerank_deadline_ms: _Optional[int] = ...) -> None: ...

class RecallRequest(_message.Message):
    __slots__ = ("query", "top_k", "filter", "options")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    query: str
    top_k: int
    filter: _memory_pb2.MemoryFilter
    options: RecallOptions
    def __init__(self, query: _Optional[str] = ..., top_k: _Optional[int] = ..., filter: _Optional[_Union[_memory_pb2.MemoryFilter, _Mapping]] = ..., options: _Optional[_Union[RecallOptions, _Mapping]] = ...) -> None: ...

class RecallScores(_message.Message):
    __slots__ = ("vector_score", "vector_rank", "text_score", "text_rank", "fused_score", "signals")
    class SignalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VECTOR_SCORE_FIELD_NUMBER: _ClassVar[int]
    VECTOR_RANK_FIELD_NUMBER: _ClassVar[int]
    TEXT_SCORE_FIELD_NUMBER: _ClassVar[int]
    TEXT_RANK_FIELD_NUMBER: _ClassVar[int]
    FUSED_SCORE_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    vector_score: float
    vector_rank: int
    text_score: float
    text_rank: int
    fused_score: float
    signals: _containers.ScalarMap[str, float]
    def __init__(self, vector_score: _Optional[float] = ..., vector_rank: _Optional[int] = ..., text_score: _Optional[float] = ..., text_rank: _Optional[int] = ..., fused_score: _Optional[float] = ..., signals: _Optional[_Mapping[str, float]] = ...) -> None: ...

class RecallHit(_message.Message):
    __slots__ = ("memory", "score", "scores", "explanation")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    memory: _memory_pb2.Memory
    score: float
    scores: RecallScores
    explanation: str
    def __init__(self, memory: _Optional[_Union[_memory_pb2.Memory, _Mapping]] = ..., score: _Optional[float] = ..., scores: _Optional[_Union[RecallScores, _Mapping]] = ..., explanation: _Optional[str] = ...) -> None: ...

class RecallResponse(_message.Message):
    __slots__ = ("hits", "vector_candidates", "text_candidates", "took_ms", "reranked", "rerank_fallback_reason")
    HITS_FIELD_NUMBER: _ClassVar[int]
    VECTOR_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    TEXT_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    TOOK_MS_FIELD_NUMBER: _ClassVar[int]
    RERANKED_FIELD_NUMBER: _ClassVar[int]
    RERANK_FALLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[RecallHit]
    vector_candidates: int
    text_candidates: int
    took_ms: float
    reranked: bool
    rerank_fallback_reason: str
    def __init__(self, hits: _Optional[_Iterable[_Union[RecallHit, _Mapping]]] = ..., vector_candidates: _Optional[int] = ..., text_candidates: _Optional[int] = ..., took_ms: _Optional[float] = ..., reranked: _Optional[bool] = ..., rerank_fallback_reason: _Optional[str] = ...) -> None: ...

class ExportMemoriesRequest(_message.Message):
    __slots__ = ("filter", "include_deleted")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DELETED_FIELD_NUMBER: _ClassVar[int]
    filter: _memory_pb2.MemoryFilter
    include_deleted: bool
    def __init__(self, filter: _Optional[_Union[_memory_pb2.MemoryFilter, _Mapping]] = ..., include_deleted: _Optional[bool] = ...) -> None: ...

class ExportMemoriesResponse(_message.Message):
    __slots__ = ("memories", "exported_count", "total_count")
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    EXPORTED_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COUNT_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[_memory_pb2.Memory]
    exported_count: int
    total_count: int
    def __init__(self, memories: _Optional[_Iterable[_Union[_memory_pb2.Memory, _Mapping]]] = ..., exported_count: _Optional[int] = ..., total_count: _Optional[int] = ...) -> None: ...

class ImportMemoriesRequest(_message.Message):
    __slots__ = ("memories",)
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[_memory_pb2.Memory]
    def __init__(self, memories: _Optional[_Iterable[_Union[_memory_pb2.Memory, _Mapping]]] = ...) -> None: ...

class ImportMemoriesResponse(_message.Message):
    __slots__ = ("imported_count", "skipped_count", "received_count")
    IMPORTED_COUNT_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_COUNT_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_COUNT_FIELD_NUMBER: _ClassVar[int]
    imported_count: int
    skipped_count: int
    received_count: int
    def __init__(self, imported_count: _Optional[int] = ..., skipped_count: _Optional[int] = ..., received_count: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("server_version", "embedding_model", "embedding_dimension", "memory_count", "deleted_count", "pending_index_count", "memory_count_by_type", "oldest_pending_index_time", "process_rss_bytes", "data_bytes", "search_index_lag_rows", "ranking_fallbacks", "sidecar_circuit", "feedback_outbox_pending", "write_lock", "write_locks", "process_peak_rss_bytes", "cache_use", "access_counts_pending", "create_group_commit", "process_cpu_seconds", "method_latencies", "latency_bucket_upper_ms", "feedback_outbox_undeliverable", "index_failed_batches", "index_last_failure_reason", "index_last_failure_time", "index_residency", "index_tables_to_check", "sidecar_call_failures", "interpreter_lock_wait")
    class MemoryCountByTypeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class RankingFallbacksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class SidecarCallFailuresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_DIMENSION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_COUNT_FIELD_NUMBER: _ClassVar[int]
    DELETED_COUNT_FIELD_NUMBER: _ClassVar[int]
    PENDING_INDEX_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_COUNT_BY_TYPE_FIELD_NUMBER: _ClassVar[int]
    OLDEST_PENDING_INDEX_TIME_FIELD_NUMBER: _ClassVar[int]
    PROCESS_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEARCH_INDEX_LAG_ROWS_FIELD_NUMBER: _ClassVar[int]
    RANKING_FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_CIRCUIT_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_OUTBOX_PENDING_FIELD_NUMBER: _ClassVar[int]
    WRITE_LOCK_FIELD_NUMBER: _ClassVar[int]
    WRITE_LOCKS_FIELD_NUMBER: _ClassVar[int]
    PROCESS_PEAK_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_USE_FIELD_NUMBER: _ClassVar[int]
    ACCESS_COUNTS_PENDING_FIELD_NUMBER: _ClassVar[int]
    CREATE_GROUP_COMMIT_FIELD_NUMBER: _ClassVar[int]
    PROCESS_CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    METHOD_LATENCIES_FIELD_NUMBER: _ClassVar[int]
    LATENCY_BUCKET_UPPER_MS_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_OUTBOX_UNDELIVERABLE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FAILED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    INDEX_LAST_FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    INDEX_LAST_FAILURE_TIME_FIELD_NUMBER: _ClassVar[int]
    INDEX_RESIDENCY_FIELD_NUMBER: _ClassVar[int]
    INDEX_TABLES_TO_CHECK_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_CALL_FAILURES_FIELD_NUMBER: _ClassVar[int]
    INTERPRETER_LOCK_WAIT_FIELD_NUMBER: _ClassVar[int]
    server_version: str
    embedding_model: str
    embedding_dimension: int
    memory_count: int
    deleted_count: int
    pending_index_count: int
    memory_count_by_type: _containers.ScalarMap[str, int]
    oldest_pending_index_time: _timestamp_pb2.Timestamp
    process_rss_bytes: int
    data_bytes: int
    search_index_lag_rows: int
    ranking_fallbacks: _containers.ScalarMap[str, int]
    sidecar_circuit: str
    feedback_outbox_pending: int
    write_lock: WriteLockStats
    write_locks: _containers.RepeatedCompositeFieldContainer[WriteLockStats]
    process_peak_rss_bytes: int
    cache_use: CacheUse
    access_counts_pending: int
    create_group_commit: GroupCommitStats
    process_cpu_seconds: float
    method_latencies: _containers.RepeatedCompositeFieldContainer[MethodLatency]
    latency_bucket_upper_ms: _containers.RepeatedScalarFieldContainer[float]
    feedback_outbox_undeliverable: int
    index_failed_batches: int
    index_last_failure_reason: str
    index_last_failure_time: _timestamp_pb2.Timestamp
    index_residency: IndexResidency
    index_tables_to_check: int
    sidecar_call_failures: _containers.ScalarMap[str, int]
    interpreter_lock_wait: InterpreterLockWait
    def __init__(self, server_version: _Optional[str] = ..., embedding_model: _Optional[str] = ..., embedding_dimension: _Optional[int] = ..., memory_count: _Optional[int] = ..., deleted_count: _Optional[int] = ..., pending_index_count: _Optional[int] = ..., memory_count_by_type: _Optional[_Mapping[str, int]] = ..., oldest_pending_index_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., process_rss_bytes: _Optional[int] = ..., data_bytes: _Optional[int] = ..., search_index_lag_rows: _Optional[int] = ..., ranking_fallbacks: _Optional[_Mapping[str, int]] = ..., sidecar_circuit: _Optional[str] = ..., feedback_outbox_pending: _Optional[int] = ..., write_lock: _Optional[_Union[WriteLockStats, _Mapping]] = ..., write_locks: _Optional[_Iterable[_Union[WriteLockStats, _Mapping]]] = ..., process_peak_rss_bytes: _Optional[int] = ..., cache_use: _Optional[_Union[CacheUse, _Mapping]] = ..., access_counts_pending: _Optional[int] = ..., create_group_commit: _Optional[_Union[GroupCommitStats, _Mapping]] = ..., process_cpu_seconds: _Optional[float] = ..., method_latencies: _Optional[_Iterable[_Union[MethodLatency, _Mapping]]] = ..., latency_bucket_upper_ms: _Optional[_Iterable[float]] = ..., feedback_outbox_undeliverable: _Optional[int] = ..., index_failed_batches: _Optional[int] = ..., index_last_failure_reason: _Optional[str] = ..., index_last_failure_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., index_residency: _Optional[_Union[IndexResidency, _Mapping]] = ..., index_tables_to_check: _Optional[int] = ..., sidecar_call_failures: _Optional[_Mapping[str, int]] = ..., interpreter_lock_wait: _Optional[_Union[InterpreterLockWait, _Mapping]] = ...) -> None: ...

class InterpreterLockWait(_message.Message):
    __slots__ = ("samples", "interval_ms", "p50_ms", "p99_ms", "max_ms", "bucket_counts")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_COUNTS_FIELD_NUMBER: _ClassVar[int]
    samples: int
    interval_ms: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    bucket_counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, samples: _Optional[int] = ..., interval_ms: _Optional[float] = ..., p50_ms: _Optional[float] = ..., p99_ms: _Optional[float] = ..., max_ms: _Optional[float] = ..., bucket_counts: _Optional[_Iterable[int]] = ...) -> None: ...

class IndexResidency(_message.Message):
    __slots__ = ("tenants", "rows", "max_tenants", "max_rows", "loads", "drops", "tenant_loaded")
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    MAX_TENANTS_FIELD_NUMBER: _ClassVar[int]
    MAX_ROWS_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    DROPS_FIELD_NUMBER: _ClassVar[int]
    TENANT_LOADED_FIELD_NUMBER: _ClassVar[int]
    tenants: int
    rows: int
    max_tenants: int
    max_rows: int
    loads: int
    drops: int
    tenant_loaded: bool
    def __init__(self, tenants: _Optional[int] = ..., rows: _Optional[int] = ..., max_tenants: _Optional[int] = ..., max_rows: _Optional[int] = ..., loads: _Optional[int] = ..., drops: _Optional[int] = ..., tenant_loaded: _Optional[bool] = ...) -> None: ...

class MethodLatency(_message.Message):
    __slots__ = ("method", "calls", "failed", "p50_ms", "p99_ms", "max_ms", "bucket_counts")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_COUNTS_FIELD_NUMBER: _ClassVar[int]
    method: str
    calls: int
    failed: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    bucket_counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, method: _Optional[str] = ..., calls: _Optional[int] = ..., failed: _Optional[int] = ..., p50_ms: _Optional[float] = ..., p99_ms: _Optional[float] = ..., max_ms: _Optional[float] = ..., bucket_counts: _Optional[_Iterable[int]] = ...) -> None: ...

class GroupCommitStats(_message.Message):
    __slots__ = ("calls", "groups", "largest_group")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    LARGEST_GROUP_FIELD_NUMBER: _ClassVar[int]
    calls: int
    groups: int
    largest_group: int
    def __init__(self, calls: _Optional[int] = ..., groups: _Optional[int] = ..., largest_group: _Optional[int] = ...) -> None: ...

class CacheUse(_message.Message):
    __slots__ = ("index_session_bytes", "scope_vector_bytes", "text_posting_bytes", "row_cache_rows", "row_cache_hits", "row_cache_misses", "recent_id_scopes", "recent_id_hits", "recent_id_misses", "row_cache_fills_skipped", "recent_id_fills_skipped", "index_row_id_bytes", "vector_graph_bytes", "vector_graph_rows")
    INDEX_SESSION_BYTES_FIELD_NUMBER: _ClassVar[int]
    SCOPE_VECTOR_BYTES_FIELD_NUMBER: _ClassVar[int]
    TEXT_POSTING_BYTES_FIELD_NUMBER: _ClassVar[int]
    ROW_CACHE_ROWS_FIELD_NUMBER: _ClassVar[int]
    ROW_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    ROW_CACHE_MISSES_FIELD_NUMBER: _ClassVar[int]
    RECENT_ID_SCOPES_FIELD_NUMBER: _ClassVar[int]
    RECENT_ID_HITS_FIELD_NUMBER: _ClassVar[int]
    RECENT_ID_MISSES_FIELD_NUMBER: _ClassVar[int]
    ROW_CACHE_FILLS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    RECENT_ID_FILLS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    INDEX_ROW_ID_BYTES_FIELD_NUMBER: _ClassVar[int]
    VECTOR_GRAPH_BYTES_FIELD_NUMBER: _ClassVar[int]
    VECTOR_GRAPH_ROWS_FIELD_NUMBER: _ClassVar[int]
    index_session_bytes: int
    scope_vector_bytes: int
    text_posting_bytes: int
    row_cache_rows: int
    row_cache_hits: int
    row_cache_misses: int
    recent_id_scopes: int
    recent_id_hits: int
    recent_id_misses: int
    row_cache_fills_skipped: int
    recent_id_fills_skipped: int
    index_row_id_bytes: int
    vector_graph_bytes: int
    vector_graph_rows: int
    def __init__(self, index_session_bytes: _Optional[int] = ..., scope_vector_bytes: _Optional[int] = ..., text_posting_bytes: _Optional[int] = ..., row_cache_rows: _Optional[int] = ..., row_cache_hits: _Optional[int] = ..., row_cache_misses: _Optional[int] = ..., recent_id_scopes: _Optional[int] = ..., recent_id_hits: _Optional[int] = ..., recent_id_misses: _Optional[int] = ..., row_cache_fills_skipped: _Optional[int] = ..., recent_id_fills_skipped: _Optional[int] = ..., index_row_id_bytes: _Optional[int] = ..., vector_graph_bytes: _Optional[int] = ..., vector_graph_rows: _Optional[int] = ...) -> None: ...

class WriteLockStats(_message.Message):
    __slots__ = ("transactions", "held_seconds", "waited_seconds", "domain")
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    HELD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WAITED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    transactions: int
    held_seconds: float
    waited_seconds: float
    domain: str
    def __init__(self, transactions: _Optional[int] = ..., held_seconds: _Optional[float] = ..., waited_seconds: _Optional[float] = ..., domain: _Optional[str] = ...) -> None: ...

class StartSessionRequest(_message.Message):
    __slots__ = ("session_id", "agent_id", "persona_id", "project_id", "context", "token_budget", "max_memories", "request_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PERSONA_ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_MEMORIES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    agent_id: str
    persona_id: str
    project_id: str
    context: str
    token_budget: int
    max_memories: int
    request_id: str
    def __init__(self, session_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., persona_id: _Optional[str] = ..., project_id: _Optional[str] = ..., context: _Optional[str] = ..., token_budget: _Optional[int] = ..., max_memories: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class InjectedMemory(_message.Message):
    __slots__ = ("memory", "rank", "score", "baseline_score", "predictor_score", "origin", "tokens")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    BASELINE_SCORE_FIELD_NUMBER: _ClassVar[int]
    PREDICTOR_SCORE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    memory: _memory_pb2.Memory
    rank: int
    score: float
    baseline_score: float
    predictor_score: float
    origin: str
    tokens: int
    def __init__(self, memory: _Optional[_Union[_memory_pb2.Memory, _Mapping]] = ..., rank: _Optional[int] = ..., score: _Optional[float] = ..., baseline_score: _Optional[float] = ..., predictor_score: _Optional[float] = ..., origin: _Optional[str] = ..., tokens: _Optional[int] = ...) -> None: ...

class RankingDecision(_message.Message):
    __slots__ = ("path", "fallback_reason", "model_version", "predictor_weight", "sidecar_ms", "sidecar_deadline_ms", "took_ms")
    PATH_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PREDICTOR_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_MS_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    TOOK_MS_FIELD_NUMBER: _ClassVar[int]
    path: RankingPath
    fallback_reason: str
    model_version: str
    predictor_weight: float
    sidecar_ms: float
    sidecar_deadline_ms: int
    took_ms: float
    def __init__(self, path: _Optional[_Union[RankingPath, str]] = ..., fallback_reason: _Optional[str] = ..., model_version: _Optional[str] = ..., predictor_weight: _Optional[float] = ..., sidecar_ms: _Optional[float] = ..., sidecar_deadline_ms: _Optional[int] = ..., took_ms: _Optional[float] = ...) -> None: ...

class StartSessionResponse(_message.Message):
    __slots__ = ("session_id", "memories", "ranking", "token_budget", "tokens_used", "dropped_count", "context_text")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    RANKING_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_COUNT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TEXT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    memories: _containers.RepeatedCompositeFieldContainer[InjectedMemory]
    ranking: RankingDecision
    token_budget: int
    tokens_used: int
    dropped_count: int
    context_text: str
    def __init__(self, session_id: _Optional[str] = ..., memories: _Optional[_Iterable[_Union[InjectedMemory, _Mapping]]] = ..., ranking: _Optional[_Union[RankingDecision, _Mapping]] = ..., token_budget: _Optional[int] = ..., tokens_used: _Optional[int] = ..., dropped_count: _Optional[int] = ..., context_text: _Optional[str] = ...) -> None: ...

class MemoryFeedback(_message.Message):
    __slots__ = ("memory_id", "relevance", "used")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    relevance: float
    used: bool
    def __init__(self, memory_id: _Optional[str] = ..., relevance: _Optional[float] = ..., used: _Optional[bool] = ...) -> None: ...

class EndSessionRequest(_message.Message):
    __slots__ = ("session_id", "feedback", "transcript", "request_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    feedback: _containers.RepeatedCompositeFieldContainer[MemoryFeedback]
    transcript: str
    request_id: str
    def __init__(self, session_id: _Optional[str] = ..., feedback: _Optional[_Iterable[_Union[MemoryFeedback, _Mapping]]] = ..., transcript: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class MemoryContinuity(_message.Message):
    __slots__ = ("memory_id", "relevance", "source")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    relevance: float
    source: str
    def __init__(self, memory_id: _Optional[str] = ..., relevance: _Optional[float] = ..., source: _Optional[str] = ...) -> None: ...

class EndSessionResponse(_message.Message):
    __slots__ = ("session_id", "continuity", "training_pairs")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CONTINUITY_FIELD_NUMBER: _ClassVar[int]
    TRAINING_PAIRS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    continuity: _containers.RepeatedCompositeFieldContainer[MemoryContinuity]
    training_pairs: int
    def __init__(self, session_id: _Optional[str] = ..., continuity: _Optional[_Iterable[_Union[MemoryContinuity, _Mapping]]] = ..., training_pairs: _Optional[int] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("session_id", "agent_id", "persona_id", "project_id", "context", "state", "ranking", "injected", "continuity", "start_time", "end_time", "feedback_delivered")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PERSONA_ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RANKING_FIELD_NUMBER: _ClassVar[int]
    INJECTED_FIELD_NUMBER: _ClassVar[int]
    CONTINUITY_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_DELIVERED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    agent_id: str
    persona_id: str
    project_id: str
    context: str
    state: SessionState
    ranking: RankingDecision
    injected: _containers.RepeatedCompositeFieldContainer[InjectedMemory]
    continuity: _containers.RepeatedCompositeFieldContainer[MemoryContinuity]
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    feedback_delivered: bool
    def __init__(self, session_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., persona_id: _Optional[str] = ..., project_id: _Optional[str] = ..., context: _Optional[str] = ..., state: _Optional[_Union[SessionState, str]] = ..., ranking: _Optional[_Union[RankingDecision, _Mapping]] = ..., injected: _Optional[_Iterable[_Union[InjectedMemory, _Mapping]]] = ..., continuity: _Optional[_Iterable[_Union[MemoryContinuity, _Mapping]]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., feedback_delivered: _Optional[bool] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...
