import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SkillState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SKILL_STATE_UNSPECIFIED: _ClassVar[SkillState]
    SKILL_STATE_DRAFT: _ClassVar[SkillState]
    SKILL_STATE_VERIFIED: _ClassVar[SkillState]
    SKILL_STATE_CANARY: _ClassVar[SkillState]
    SKILL_STATE_ACTIVE: _ClassVar[SkillState]
    SKILL_STATE_REVOKED: _ClassVar[SkillState]

class RolloutStage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLLOUT_STAGE_UNSPECIFIED: _ClassVar[RolloutStage]
    ROLLOUT_STAGE_VERIFICATION: _ClassVar[RolloutStage]
    ROLLOUT_STAGE_CANARY: _ClassVar[RolloutStage]
SKILL_STATE_UNSPECIFIED: SkillState
SKILL_STATE_DRAFT: SkillState
SKILL_STATE_VERIFIED: SkillState
SKILL_STATE_CANARY: SkillState
SKILL_STATE_ACTIVE: SkillState
SKILL_STATE_REVOKED: SkillState
ROLLOUT_STAGE_UNSPECIFIED: RolloutStage
ROLLOUT_STAGE_VERIFICATION: RolloutStage
ROLLOUT_STAGE_CANARY: RolloutStage

class Skill(_message.Message):
    __slots__ = ("id", "name", "description", "instructions", "source_learning_id", "state", "definition_fingerprint", "create_time", "update_time")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LEARNING_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    description: str
    instructions: str
    source_learning_id: str
    state: SkillState
    definition_fingerprint: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., description: _Optional[str] = ..., instructions: _Optional[str] = ..., source_learning_id: _Optional[str] = ..., state: _Optional[_Union[SkillState, str]] = ..., definition_fingerprint: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PromoteProcedureRequest(_message.Message):
    __slots__ = ("learning_id", "name", "description", "request_id")
    LEARNING_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    learning_id: str
    name: str
    description: str
    request_id: str
    def __init__(self, learning_id: _Optional[str] = ..., name: _Optional[str] = ..., description: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class PromoteProcedureResponse(_message.Message):
    __slots__ = ("skill",)
    SKILL_FIELD_NUMBER: _ClassVar[int]
    skill: Skill
    def __init__(self, skill: _Optional[_Union[Skill, _Mapping]] = ...) -> None: ...

class GetSkillRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetSkillResponse(_message.Message):
    __slots__ = ("skill", "events")
    SKILL_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    skill: Skill
    events: _containers.RepeatedCompositeFieldContainer[SkillEvent]
    def __init__(self, skill: _Optional[_Union[Skill, _Mapping]] = ..., events: _Optional[_Iterable[_Union[SkillEvent, _Mapping]]] = ...) -> None: ...

class SkillEvent(_message.Message):
    __slots__ = ("from_state", "to_state", "reason", "time")
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    from_state: SkillState
    to_state: SkillState
    reason: str
    time: _timestamp_pb2.Timestamp
    def __init__(self, from_state: _Optional[_Union[SkillState, str]] = ..., to_state: _Optional[_Union[SkillState, str]] = ..., reason: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RolloutResult(_message.Message):
    __slots__ = ("id", "skill_id", "stage", "run_id", "succeeded", "definition_fingerprint", "note", "create_time")
    ID_FIELD_NUMBER: _ClassVar[int]
    SKILL_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    id: str
    skill_id: str
    stage: RolloutStage
    run_id: str
    succeeded: bool
    definition_fingerprint: str
    note: str
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., skill_id: _Optional[str] = ..., stage: _Optional[_Union[RolloutStage, str]] = ..., run_id: _Optional[str] = ..., succeeded: _Optional[bool] = ..., definition_fingerprint: _Optional[str] = ..., note: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RecordRolloutResultRequest(_message.Message):
    __slots__ = ("result", "definition_fingerprint", "request_id")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    result: RolloutResult
    definition_fingerprint: str
    request_id: str
    def __init__(self, result: _Optional[_Union[RolloutResult, _Mapping]] = ..., definition_fingerprint: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class RecordRolloutResultResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: RolloutResult
    def __init__(self, result: _Optional[_Union[RolloutResult, _Mapping]] = ...) -> None: ...

class ListRolloutResultsRequest(_message.Message):
    __slots__ = ("skill_id", "page_size", "page_token")
    SKILL_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    skill_id: str
    page_size: int
    page_token: str
    def __init__(self, skill_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRolloutResultsResponse(_message.Message):
    __slots__ = ("results", "next_page_token")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RolloutResult]
    next_page_token: str
    def __init__(self, results: _Optional[_Iterable[_Union[RolloutResult, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AdvanceSkillRequest(_message.Message):
    __slots__ = ("id", "state", "definition_fingerprint", "reason", "request_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: SkillState
    definition_fingerprint: str
    reason: str
    request_id: str
    def __init__(self, id: _Optional[str] = ..., state: _Optional[_Union[SkillState, str]] = ..., definition_fingerprint: _Optional[str] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class AdvanceSkillResponse(_message.Message):
    __slots__ = ("skill",)
    SKILL_FIELD_NUMBER: _ClassVar[int]
    skill: Skill
    def __init__(self, skill: _Optional[_Union[Skill, _Mapping]] = ...) -> None: ...

class RevokeSkillRequest(_message.Message):
    __slots__ = ("id", "reason", "request_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    request_id: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class RevokeSkillResponse(_message.Message):
    __slots__ = ("skill",)
    SKILL_FIELD_NUMBER: _ClassVar[int]
    skill: Skill
    def __init__(self, skill: _Optional[_Union[Skill, _Mapping]] = ...) -> None: ...

class RollbackSkillRequest(_message.Message):
    __slots__ = ("id", "reason", "request_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    request_id: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class RollbackSkillResponse(_message.Message):
    __slots__ = ("revoked", "restored")
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    revoked: Skill
    restored: Skill
    def __init__(self, revoked: _Optional[_Union[Skill, _Mapping]] = ..., restored: _Optional[_Union[Skill, _Mapping]] = ...) -> None: ...

class ListSkillsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "state")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    state: SkillState
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., state: _Optional[_Union[SkillState, str]] = ...) -> None: ...

class ListSkillsResponse(_message.Message):
    __slots__ = ("skills", "next_page_token")
    SKILLS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    skills: _containers.RepeatedCompositeFieldContainer[Skill]
    next_page_token: str
    def __init__(self, skills: _Optional[_Iterable[_Union[Skill, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
