import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MemoryType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMORY_TYPE_UNSPECIFIED: _ClassVar[MemoryType]
    MEMORY_TYPE_SEMANTIC: _ClassVar[MemoryType]
    MEMORY_TYPE_EPISODIC: _ClassVar[MemoryType]
    MEMORY_TYPE_PROCEDURAL: _ClassVar[MemoryType]
    MEMORY_TYPE_DOCUMENT_CHUNK: _ClassVar[MemoryType]

class ScopeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCOPE_KIND_UNSPECIFIED: _ClassVar[ScopeKind]
    SCOPE_KIND_SESSION: _ClassVar[ScopeKind]
    SCOPE_KIND_PERSONA: _ClassVar[ScopeKind]
    SCOPE_KIND_PROJECT: _ClassVar[ScopeKind]
    SCOPE_KIND_WORKSPACE: _ClassVar[ScopeKind]
MEMORY_TYPE_UNSPECIFIED: MemoryType
MEMORY_TYPE_SEMANTIC: MemoryType
MEMORY_TYPE_EPISODIC: MemoryType
MEMORY_TYPE_PROCEDURAL: MemoryType
MEMORY_TYPE_DOCUMENT_CHUNK: MemoryType
SCOPE_KIND_UNSPECIFIED: ScopeKind
SCOPE_KIND_SESSION: ScopeKind
SCOPE_KIND_PERSONA: ScopeKind
SCOPE_KIND_PROJECT: ScopeKind
SCOPE_KIND_WORKSPACE: ScopeKind

class Scope(_message.Message):
    __slots__ = ("kind", "id")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    kind: ScopeKind
    id: str
    def __init__(self, kind: _Optional[_Union[ScopeKind, str]] = ..., id: _Optional[str] = ...) -> None: ...

class Source(_message.Message):
    __slots__ = ("who", "why", "run_id", "session_id")
    WHO_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    who: str
    why: str
    run_id: str
    session_id: str
    def __init__(self, who: _Optional[str] = ..., why: _Optional[str] = ..., run_id: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class TimeRange(_message.Message):
    __slots__ = ("start_time", "end_time")
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    def __init__(self, start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
