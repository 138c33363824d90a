import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from mnemo.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LearningKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEARNING_KIND_UNSPECIFIED: _ClassVar[LearningKind]
    LEARNING_KIND_RUN_SUMMARY: _ClassVar[LearningKind]
    LEARNING_KIND_FACT: _ClassVar[LearningKind]
    LEARNING_KIND_PREFERENCE: _ClassVar[LearningKind]
    LEARNING_KIND_DECISION: _ClassVar[LearningKind]
    LEARNING_KIND_PROCEDURE: _ClassVar[LearningKind]

class CandidateState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANDIDATE_STATE_UNSPECIFIED: _ClassVar[CandidateState]
    CANDIDATE_STATE_PENDING: _ClassVar[CandidateState]
    CANDIDATE_STATE_PUBLISHED: _ClassVar[CandidateState]
    CANDIDATE_STATE_REJECTED: _ClassVar[CandidateState]

class LearningState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEARNING_STATE_UNSPECIFIED: _ClassVar[LearningState]
    LEARNING_STATE_ACTIVE: _ClassVar[LearningState]
    LEARNING_STATE_REVOKED: _ClassVar[LearningState]
    LEARNING_STATE_SUPERSEDED: _ClassVar[LearningState]
LEARNING_KIND_UNSPECIFIED: LearningKind
LEARNING_KIND_RUN_SUMMARY: LearningKind
LEARNING_KIND_FACT: LearningKind
LEARNING_KIND_PREFERENCE: LearningKind
LEARNING_KIND_DECISION: LearningKind
LEARNING_KIND_PROCEDURE: LearningKind
CANDIDATE_STATE_UNSPECIFIED: CandidateState
CANDIDATE_STATE_PENDING: CandidateState
CANDIDATE_STATE_PUBLISHED: CandidateState
CANDIDATE_STATE_REJECTED: CandidateState
LEARNING_STATE_UNSPECIFIED: LearningState
LEARNING_STATE_ACTIVE: LearningState
LEARNING_STATE_REVOKED: LearningState
LEARNING_STATE_SUPERSEDED: LearningState

class LearningCandidate(_message.Message):
    __slots__ = ("id", "scope", "kind", "content", "confidence", "source", "evidence_refs", "state", "review_reason", "learning_id", "create_time", "review_time")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_REFS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REVIEW_REASON_FIELD_NUMBER: _ClassVar[int]
    LEARNING_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    REVIEW_TIME_FIELD_NUMBER: _ClassVar[int]
    id: str
    scope: _common_pb2.Scope
    kind: LearningKind
    content: str
    confidence: float
    source: _common_pb2.Source
    evidence_refs: _containers.RepeatedScalarFieldContainer[str]
    state: CandidateState
    review_reason: str
    learning_id: str
    create_time: _timestamp_pb2.Timestamp
    review_time: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., scope: _Optional[_Union[_common_pb2.Scope, _Mapping]] = ..., kind: _Optional[_Union[LearningKind, str]] = ..., content: _Optional[str] = ..., confidence: _Optional[float] = ..., source: _Optional[_Union[_common_pb2.Source, _Mapping]] = ..., evidence_refs: _Optional[_Iterable[str]] = ..., state: _Optional[_Union[CandidateState, str]] = ..., review_reason: _Optional[str] = ..., learning_id: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., review_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Learning(_message.Message):
    __slots__ = ("id", "scope", "kind", "content", "confidence", "state", "candidate_id", "supersedes_id", "superseded_by_id", "revoke_reason", "create_time", "update_time")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDES_ID_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_BY_ID_FIELD_NUMBER: _ClassVar[int]
    REVOKE_REASON_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    id: str
    scope: _common_pb2.Scope
    kind: LearningKind
    content: str
    confidence: float
    state: LearningState
    candidate_id: str
    supersedes_id: str
    superseded_by_id: str
    revoke_reason: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., scope: _Optional[_Union[_common_pb2.Scope, _Mapping]] = ..., kind: _Optional[_Union[LearningKind, str]] = ..., content: _Optional[str] = ..., confidence: _Optional[float] = ..., state: _Optional[_Union[LearningState, str]] = ..., candidate_id: _Optional[str] = ..., supersedes_id: _Optional[str] = ..., superseded_by_id: _Optional[str] = ..., revoke_reason: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateLearningCandidateRequest(_message.Message):
    __slots__ = ("candidate", "request_id")
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    candidate: LearningCandidate
    request_id: str
    def __init__(self, candidate: _Optional[_Union[LearningCandidate, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateLearningCandidateResponse(_message.Message):
    __slots__ = ("candidate",)
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    candidate: LearningCandidate
    def __init__(self, candidate: _Optional[_Union[LearningCandidate, _Mapping]] = ...) -> None: ...

class GetLearningCandidateRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetLearningCandidateResponse(_message.Message):
    __slots__ = ("candidate",)
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    candidate: LearningCandidate
    def __init__(self, candidate: _Optional[_Union[LearningCandidate, _Mapping]] = ...) -> None: ...

class ListLearningCandidatesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "state")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    state: CandidateState
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., state: _Optional[_Union[CandidateState, str]] = ...) -> None: ...

class ListLearningCandidatesResponse(_message.Message):
    __slots__ = ("candidates", "next_page_token")
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[LearningCandidate]
    next_page_token: str
    def __init__(self, candidates: _Optional[_Iterable[_Union[LearningCandidate, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PublishLearningCandidateRequest(_message.Message):
    __slots__ = ("id", "reason", "supersedes_id", "request_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDES_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    supersedes_id: str
    request_id: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ..., supersedes_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class PublishLearningCandidateResponse(_message.Message):
    __slots__ = ("candidate", "learning")
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_FIELD_NUMBER: _ClassVar[int]
    candidate: LearningCandidate
    learning: Learning
    def __init__(self, candidate: _Optional[_Union[LearningCandidate, _Mapping]] = ..., learning: _Optional[_Union[Learning, _Mapping]] = ...) -> None: ...

class RejectLearningCandidateRequest(_message.Message):
    __slots__ = ("id", "reason", "request_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    request_id: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class RejectLearningCandidateResponse(_message.Message):
    __slots__ = ("candidate",)
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    candidate: LearningCandidate
    def __init__(self, candidate: _Optional[_Union[LearningCandidate, _Mapping]] = ...) -> None: ...

class GetLearningRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetLearningResponse(_message.Message):
    __slots__ = ("learning",)
    LEARNING_FIELD_NUMBER: _ClassVar[int]
    learning: Learning
    def __init__(self, learning: _Optional[_Union[Learning, _Mapping]] = ...) -> None: ...

class ListLearningsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "state", "kind")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    state: LearningState
    kind: LearningKind
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., state: _Optional[_Union[LearningState, str]] = ..., kind: _Optional[_Union[LearningKind, str]] = ...) -> None: ...

class ListLearningsResponse(_message.Message):
    __slots__ = ("learnings", "next_page_token")
    LEARNINGS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    learnings: _containers.RepeatedCompositeFieldContainer[Learning]
    next_page_token: str
    def __init__(self, learnings: _Optional[_Iterable[_Union[Learning, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RevokeLearningRequest(_message.Message):
    __slots__ = ("id", "reason", "request_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    request_id: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class RevokeLearningResponse(_message.Message):
    __slots__ = ("learning",)
    LEARNING_FIELD_NUMBER: _ClassVar[int]
    learning: Learning
    def __init__(self, learning: _Optional[_Union[Learning, _Mapping]] = ...) -> None: ...
