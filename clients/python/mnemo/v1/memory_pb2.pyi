import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from mnemo.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IndexState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INDEX_STATE_UNSPECIFIED: _ClassVar[IndexState]
    INDEX_STATE_PENDING: _ClassVar[IndexState]
    INDEX_STATE_INDEXED: _ClassVar[IndexState]
INDEX_STATE_UNSPECIFIED: IndexState
INDEX_STATE_PENDING: IndexState
INDEX_STATE_INDEXED: IndexState

class Memory(_message.Message):
    __slots__ = ("id", "external_id", "scope", "type", "category", "content", "content_hash", "importance", "confidence", "pinned", "source", "metadata", "event_time", "create_time", "update_time", "delete_time", "supersedes_id", "superseded_by_id", "embedding_model", "index_state")
    ID_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    DELETE_TIME_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDES_ID_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_BY_ID_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    INDEX_STATE_FIELD_NUMBER: _ClassVar[int]
    id: str
    external_id: str
    scope: _common_pb2.Scope
    type: _common_pb2.MemoryType
    category: str
    content: str
    content_hash: str
    importance: float
    confidence: float
    pinned: bool
    source: _common_pb2.Source
    metadata: _struct_pb2.Struct
    event_time: _timestamp_pb2.Timestamp
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    delete_time: _timestamp_pb2.Timestamp
    supersedes_id: str
    superseded_by_id: str
    embedding_model: str
    index_state: IndexState
    def __init__(self, id: _Optional[str] = ..., external_id: _Optional[str] = ..., scope: _Optional[_Union[_common_pb2.Scope, _Mapping]] = ..., type: _Optional[_Union[_common_pb2.MemoryType, str]] = ..., category: _Optional[str] = ..., content: _Optional[str] = ..., content_hash: _Optional[str] = ..., importance: _Optional[float] = ..., confidence: _Optional[float] = ..., pinned: _Optional[bool] = ..., source: _Optional[_Union[_common_pb2.Source, _Mapping]] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., event_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., delete_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., supersedes_id: _Optional[str] = ..., superseded_by_id: _Optional[str] = ..., embedding_model: _Optional[str] = ..., index_state: _Optional[_Union[IndexState, str]] = ...) -> None: ...

class MemoryFilter(_message.Message):
    __slots__ = ("scopes", "types", "categories", "create_time", "event_time", "pinned_only", "source_session_ids")
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    CATEGORIES_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    PINNED_ONLY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    scopes: _containers.RepeatedCompositeFieldContainer[_common_pb2.Scope]
    types: _containers.RepeatedScalarFieldContainer[_common_pb2.MemoryType]
    categories: _containers.RepeatedScalarFieldContainer[str]
    create_time: _common_pb2.TimeRange
    event_time: _common_pb2.TimeRange
    pinned_only: bool
    source_session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, scopes: _Optional[_Iterable[_Union[_common_pb2.Scope, _Mapping]]] = ..., types: _Optional[_Iterable[_Union[_common_pb2.MemoryType, str]]] = ..., categories: _Optional[_Iterable[str]] = ..., create_time: _Optional[_Union[_common_pb2.TimeRange, _Mapping]] = ..., event_time: _Optional[_Union[_common_pb2.TimeRange, _Mapping]] = ..., pinned_only: _Optional[bool] = ..., source_session_ids: _Optional[_Iterable[str]] = ...) -> None: ...
