import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RerankMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RERANK_METHOD_UNSPECIFIED: _ClassVar[RerankMethod]
    RERANK_METHOD_CROSS_ENCODER: _ClassVar[RerankMethod]
    RERANK_METHOD_EMBEDDING_BLEND: _ClassVar[RerankMethod]

class ModelKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_KIND_UNSPECIFIED: _ClassVar[ModelKind]
    MODEL_KIND_CROSS_ENCODER: _ClassVar[ModelKind]
    MODEL_KIND_RANKER: _ClassVar[ModelKind]
RERANK_METHOD_UNSPECIFIED: RerankMethod
RERANK_METHOD_CROSS_ENCODER: RerankMethod
RERANK_METHOD_EMBEDDING_BLEND: RerankMethod
MODEL_KIND_UNSPECIFIED: ModelKind
MODEL_KIND_CROSS_ENCODER: ModelKind
MODEL_KIND_RANKER: ModelKind

class Candidate(_message.Message):
    __slots__ = ("id", "text", "baseline_score", "features")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    BASELINE_SCORE_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    id: str
    text: str
    baseline_score: float
    features: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, id: _Optional[str] = ..., text: _Optional[str] = ..., baseline_score: _Optional[float] = ..., features: _Optional[_Iterable[float]] = ...) -> None: ...

class RerankRequest(_message.Message):
    __slots__ = ("tenant_id", "query", "candidates")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    query: str
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    def __init__(self, tenant_id: _Optional[str] = ..., query: _Optional[str] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ...) -> None: ...

class CandidateScore(_message.Message):
    __slots__ = ("id", "score")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    id: str
    score: float
    def __init__(self, id: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class RerankResponse(_message.Message):
    __slots__ = ("scores", "method", "model_version")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[CandidateScore]
    method: RerankMethod
    model_version: str
    def __init__(self, scores: _Optional[_Iterable[_Union[CandidateScore, _Mapping]]] = ..., method: _Optional[_Union[RerankMethod, str]] = ..., model_version: _Optional[str] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("tenant_id", "session_id", "query", "feature_names", "candidates")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    FEATURE_NAMES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    session_id: str
    query: str
    feature_names: _containers.RepeatedScalarFieldContainer[str]
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    def __init__(self, tenant_id: _Optional[str] = ..., session_id: _Optional[str] = ..., query: _Optional[str] = ..., feature_names: _Optional[_Iterable[str]] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores", "model_version", "cold_start", "predictor_weight")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    COLD_START_FIELD_NUMBER: _ClassVar[int]
    PREDICTOR_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[CandidateScore]
    model_version: str
    cold_start: bool
    predictor_weight: float
    def __init__(self, scores: _Optional[_Iterable[_Union[CandidateScore, _Mapping]]] = ..., model_version: _Optional[str] = ..., cold_start: _Optional[bool] = ..., predictor_weight: _Optional[float] = ...) -> None: ...

class TrainingCandidate(_message.Message):
    __slots__ = ("candidate", "relevance", "baseline_rank", "predictor_rank")
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_FIELD_NUMBER: _ClassVar[int]
    BASELINE_RANK_FIELD_NUMBER: _ClassVar[int]
    PREDICTOR_RANK_FIELD_NUMBER: _ClassVar[int]
    candidate: Candidate
    relevance: float
    baseline_rank: int
    predictor_rank: int
    def __init__(self, candidate: _Optional[_Union[Candidate, _Mapping]] = ..., relevance: _Optional[float] = ..., baseline_rank: _Optional[int] = ..., predictor_rank: _Optional[int] = ...) -> None: ...

class TrainingSession(_message.Message):
    __slots__ = ("session_id", "query", "feature_names", "candidates", "end_time")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    FEATURE_NAMES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    query: str
    feature_names: _containers.RepeatedScalarFieldContainer[str]
    candidates: _containers.RepeatedCompositeFieldContainer[TrainingCandidate]
    end_time: _timestamp_pb2.Timestamp
    def __init__(self, session_id: _Optional[str] = ..., query: _Optional[str] = ..., feature_names: _Optional[_Iterable[str]] = ..., candidates: _Optional[_Iterable[_Union[TrainingCandidate, _Mapping]]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SubmitTrainingPairsRequest(_message.Message):
    __slots__ = ("tenant_id", "session")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    session: TrainingSession
    def __init__(self, tenant_id: _Optional[str] = ..., session: _Optional[_Union[TrainingSession, _Mapping]] = ...) -> None: ...

class HealthSnapshot(_message.Message):
    __slots__ = ("sessions", "win_ema", "predictor_weight", "drift", "window_win_rate", "window_predictor_ndcg", "window_baseline_ndcg")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    WIN_EMA_FIELD_NUMBER: _ClassVar[int]
    PREDICTOR_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    DRIFT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_WIN_RATE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_PREDICTOR_NDCG_FIELD_NUMBER: _ClassVar[int]
    WINDOW_BASELINE_NDCG_FIELD_NUMBER: _ClassVar[int]
    sessions: int
    win_ema: float
    predictor_weight: float
    drift: bool
    window_win_rate: float
    window_predictor_ndcg: float
    window_baseline_ndcg: float
    def __init__(self, sessions: _Optional[int] = ..., win_ema: _Optional[float] = ..., predictor_weight: _Optional[float] = ..., drift: _Optional[bool] = ..., window_win_rate: _Optional[float] = ..., window_predictor_ndcg: _Optional[float] = ..., window_baseline_ndcg: _Optional[float] = ...) -> None: ...

class SubmitTrainingPairsResponse(_message.Message):
    __slots__ = ("duplicate", "stored_pairs", "health", "training_started")
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    STORED_PAIRS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    TRAINING_STARTED_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    stored_pairs: int
    health: HealthSnapshot
    training_started: bool
    def __init__(self, duplicate: _Optional[bool] = ..., stored_pairs: _Optional[int] = ..., health: _Optional[_Union[HealthSnapshot, _Mapping]] = ..., training_started: _Optional[bool] = ...) -> None: ...

class TrainRequest(_message.Message):
    __slots__ = ("tenant_id", "models", "force")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    models: _containers.RepeatedScalarFieldContainer[ModelKind]
    force: bool
    def __init__(self, tenant_id: _Optional[str] = ..., models: _Optional[_Iterable[_Union[ModelKind, str]]] = ..., force: _Optional[bool] = ...) -> None: ...

class TrainingOutcome(_message.Message):
    __slots__ = ("model", "candidate_version", "promoted", "heldout_sessions", "candidate_ndcg", "current_ndcg", "baseline_ndcg", "reason", "train_seconds", "train_pairs", "finish_time")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMOTED_FIELD_NUMBER: _ClassVar[int]
    HELDOUT_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_NDCG_FIELD_NUMBER: _ClassVar[int]
    CURRENT_NDCG_FIELD_NUMBER: _ClassVar[int]
    BASELINE_NDCG_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TRAIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_PAIRS_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    model: ModelKind
    candidate_version: str
    promoted: bool
    heldout_sessions: int
    candidate_ndcg: float
    current_ndcg: float
    baseline_ndcg: float
    reason: str
    train_seconds: float
    train_pairs: int
    finish_time: _timestamp_pb2.Timestamp
    def __init__(self, model: _Optional[_Union[ModelKind, str]] = ..., candidate_version: _Optional[str] = ..., promoted: _Optional[bool] = ..., heldout_sessions: _Optional[int] = ..., candidate_ndcg: _Optional[float] = ..., current_ndcg: _Optional[float] = ..., baseline_ndcg: _Optional[float] = ..., reason: _Optional[str] = ..., train_seconds: _Optional[float] = ..., train_pairs: _Optional[int] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class TrainResponse(_message.Message):
    __slots__ = ("model", "stage", "progress", "message", "outcome")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    model: ModelKind
    stage: str
    progress: float
    message: str
    outcome: TrainingOutcome
    def __init__(self, model: _Optional[_Union[ModelKind, str]] = ..., stage: _Optional[str] = ..., progress: _Optional[float] = ..., message: _Optional[str] = ..., outcome: _Optional[_Union[TrainingOutcome, _Mapping]] = ...) -> None: ...

class GetModelStatusRequest(_message.Message):
    __slots__ = ("tenant_id",)
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    def __init__(self, tenant_id: _Optional[str] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("kind", "version", "ready", "source", "promote_time")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_TIME_FIELD_NUMBER: _ClassVar[int]
    kind: ModelKind
    version: str
    ready: bool
    source: str
    promote_time: _timestamp_pb2.Timestamp
    def __init__(self, kind: _Optional[_Union[ModelKind, str]] = ..., version: _Optional[str] = ..., ready: _Optional[bool] = ..., source: _Optional[str] = ..., promote_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class LatencyStats(_message.Message):
    __slots__ = ("calls", "p50_ms", "p99_ms", "deadline_exceeded", "shed")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_EXCEEDED_FIELD_NUMBER: _ClassVar[int]
    SHED_FIELD_NUMBER: _ClassVar[int]
    calls: int
    p50_ms: float
    p99_ms: float
    deadline_exceeded: int
    shed: int
    def __init__(self, calls: _Optional[int] = ..., p50_ms: _Optional[float] = ..., p99_ms: _Optional[float] = ..., deadline_exceeded: _Optional[int] = ..., shed: _Optional[int] = ...) -> None: ...

class GetModelStatusResponse(_message.Message):
    __slots__ = ("cross_encoder", "ranker", "health", "stored_sessions", "stored_pairs", "training", "recent_outcomes", "latency", "cold_start", "note", "sessions_until_fine_tune", "resident_cross_encoders")
    class LatencyEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: LatencyStats
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[LatencyStats, _Mapping]] = ...) -> None: ...
    CROSS_ENCODER_FIELD_NUMBER: _ClassVar[int]
    RANKER_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    STORED_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    STORED_PAIRS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    RECENT_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    COLD_START_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_UNTIL_FINE_TUNE_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_CROSS_ENCODERS_FIELD_NUMBER: _ClassVar[int]
    cross_encoder: ModelInfo
    ranker: ModelInfo
    health: HealthSnapshot
    stored_sessions: int
    stored_pairs: int
    training: bool
    recent_outcomes: _containers.RepeatedCompositeFieldContainer[TrainingOutcome]
    latency: _containers.MessageMap[str, LatencyStats]
    cold_start: bool
    note: str
    sessions_until_fine_tune: int
    resident_cross_encoders: ResidentModels
    def __init__(self, cross_encoder: _Optional[_Union[ModelInfo, _Mapping]] = ..., ranker: _Optional[_Union[ModelInfo, _Mapping]] = ..., health: _Optional[_Union[HealthSnapshot, _Mapping]] = ..., stored_sessions: _Optional[int] = ..., stored_pairs: _Optional[int] = ..., training: _Optional[bool] = ..., recent_outcomes: _Optional[_Iterable[_Union[TrainingOutcome, _Mapping]]] = ..., latency: _Optional[_Mapping[str, LatencyStats]] = ..., cold_start: _Optional[bool] = ..., note: _Optional[str] = ..., sessions_until_fine_tune: _Optional[int] = ..., resident_cross_encoders: _Optional[_Union[ResidentModels, _Mapping]] = ...) -> None: ...

class ResidentModels(_message.Message):
    __slots__ = ("in_memory", "max_resident", "loads", "drops")
    IN_MEMORY_FIELD_NUMBER: _ClassVar[int]
    MAX_RESIDENT_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    DROPS_FIELD_NUMBER: _ClassVar[int]
    in_memory: int
    max_resident: int
    loads: int
    drops: int
    def __init__(self, in_memory: _Optional[int] = ..., max_resident: _Optional[int] = ..., loads: _Optional[int] = ..., drops: _Optional[int] = ...) -> None: ...
