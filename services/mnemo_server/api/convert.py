"""Protobuf <-> domain conversion for the shared memory types. Pure functions; the only
place that knows both shapes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, TypeVar

from google.protobuf import json_format, struct_pb2, timestamp_pb2
from google.protobuf.message import Message

from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import learning_service_pb2 as lpb
from mnemo.v1 import memory_service_pb2 as mpb
from mnemo.v1 import skill_service_pb2 as spb
from mnemo_server.errors import InvalidArgument
from mnemo_server.memory.model import (
    DEFAULT_CONFIDENCE,
    DEFAULT_IMPORTANCE,
    IdempotencyKey,
    Memory,
    MemoryDraft,
    MemoryFilter,
    MemoryType,
    Scope,
    ScopeKind,
    Source,
    TimeRange,
)
from mnemo_server.memory.normalize import sanitize_category

_TYPE_TO_PB = {
    MemoryType.SEMANTIC: common_pb2.MEMORY_TYPE_SEMANTIC,
    MemoryType.EPISODIC: common_pb2.MEMORY_TYPE_EPISODIC,
    MemoryType.PROCEDURAL: common_pb2.MEMORY_TYPE_PROCEDURAL,
    MemoryType.DOCUMENT_CHUNK: common_pb2.MEMORY_TYPE_DOCUMENT_CHUNK,
}
_TYPE_FROM_PB = {v: k for k, v in _TYPE_TO_PB.items()}
_SCOPE_TO_PB = {
    ScopeKind.SESSION: common_pb2.SCOPE_KIND_SESSION,
    ScopeKind.PERSONA: common_pb2.SCOPE_KIND_PERSONA,
    ScopeKind.PROJECT: common_pb2.SCOPE_KIND_PROJECT,
    ScopeKind.WORKSPACE: common_pb2.SCOPE_KIND_WORKSPACE,
}
_SCOPE_FROM_PB = {v: k for k, v in _SCOPE_TO_PB.items()}


# --- primitives ----------------------------------------------------------------------


# Times are stored as nanoseconds since 1970 in 64-bit integers: 1677-09-21 to 2262-04-11.
_MIN_NS, _MAX_NS = -(2**63), 2**63 - 1


def ts_to_ns(ts: timestamp_pb2.Timestamp, field: str) -> int:
    if not 0 <= ts.nanos < 1_000_000_000:
        raise InvalidArgument(field, "nanos must be between 0 and 999,999,999")
    ns = int(ts.seconds) * 1_000_000_000 + int(ts.nanos)
    if not _MIN_NS <= ns <= _MAX_NS:
        raise InvalidArgument(
            field, "must lie between 1677-09-21T00:12:43.145224192Z and 2262-04-11T23:47:16.854775807Z"
        )
    return ns


def ns_to_ts(ns: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ns // 1_000_000_000, nanos=ns % 1_000_000_000)


def opt_ts(msg: Message, name: str, prefix: str) -> int | None:
    """The time in field `name` of `msg` (API path `prefix.name`), None when unset."""
    return ts_to_ns(getattr(msg, name), f"{prefix}.{name}") if msg.HasField(name) else None


def struct_to_dict(s: struct_pb2.Struct, field: str) -> dict[str, Any]:
    try:
        d: dict[str, Any] = json_format.MessageToDict(s)
    except ValueError:  # NaN or an infinity: JSON has no spelling for them
        raise InvalidArgument(field, "numbers must be finite (JSON has no NaN or Infinity)") from None
    return d


T = TypeVar("T")


def dict_to_struct(d: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    if d:
        s.update(d)
    return s


_DELIVERY_FIELDS = ("request_id", "wait_for_index")
# Memory's fields marked output-only: a create ignores them (memory.proto).
_OUTPUT_ONLY = (
    "id",
    "content_hash",
    "create_time",
    "update_time",
    "delete_time",
    "supersedes_id",
    "superseded_by_id",
    "embedding_model",
    "index_state",
)


def idempotency_key(method: str, request: Message, request_id: str) -> IdempotencyKey | None:
    """The request's fingerprint covers what the write is, not how it is delivered nor
    what the server ignores: the request_id itself and wait_for_index are left out (a retry
    may change the latter), and so are a create's output-only fields (of a memory, a learning
    candidate or a rollout result) and a batch entry's own request_id and wait_for_index. A
    retry that differs only there was refused as another request: a client that re-sends
    what a first answer filled in, a batch rebuilt with fresh per-entry ids (probes)."""
    if not request_id:
        return None
    clone = type(request)()
    clone.CopyFrom(request)
    _clear_ignored(clone)
    digest = hashlib.sha256(clone.SerializeToString(deterministic=True)).hexdigest()
    return IdempotencyKey(method, request_id, digest)


# Per request type: the message it carries and that message's output-only fields (as the
# proto marks them), which a create ignores and so its fingerprint must too.
_OUTPUT_ONLY_BY_REQUEST: dict[type[Message], tuple[str, tuple[str, ...]]] = {
    mpb.CreateMemoryRequest: ("memory", _OUTPUT_ONLY),
    lpb.CreateLearningCandidateRequest: (
        "candidate",
        ("id", "state", "review_reason", "learning_id", "create_time", "review_time"),
    ),
    spb.RecordRolloutResultRequest: ("result", ("id", "definition_fingerprint", "create_time")),
}


# Sub-messages whose presence the server does not read: empty is the same as unset.
_PRESENCE_IGNORED = ("source", "metadata")


def _clear_ignored(request: Message) -> None:
    for name in _DELIVERY_FIELDS:
        if name in request.DESCRIPTOR.fields_by_name:
            request.ClearField(name)
    carried = _OUTPUT_ONLY_BY_REQUEST.get(type(request))
    if carried is not None and request.HasField(carried[0]):
        inner = getattr(request, carried[0])
        for name in carried[1]:
            inner.ClearField(name)
        # Read the same set or not, and an answer echoes them set when empty ("source {}").
        for name in _PRESENCE_IGNORED:
            if name in inner.DESCRIPTOR.fields_by_name and not getattr(inner, name).ByteSize():
                inner.ClearField(name)
    elif isinstance(request, mpb.BatchCreateMemoriesRequest):
        for entry in request.requests:
            _clear_ignored(entry)


# --- enums and small messages ----------------------------------------------------------


def memory_type_from_pb(
    value: int, field: str, *, default: MemoryType | None = MemoryType.SEMANTIC
) -> MemoryType:
    if value == common_pb2.MEMORY_TYPE_UNSPECIFIED and default is not None:
        return default
    try:
        return _TYPE_FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgument(field, f"unknown memory type {value}") from None


def memory_type_to_pb(t: MemoryType) -> common_pb2.MemoryType:
    return _TYPE_TO_PB[t]


def scope_from_pb(s: common_pb2.Scope, field: str, *, present: bool = True) -> Scope:
    if not present:
        return Scope.workspace()
    if s.kind == common_pb2.SCOPE_KIND_UNSPECIFIED:
        raise InvalidArgument(f"{field}.kind", "is required (session, persona, project or workspace)")
    try:
        kind = _SCOPE_FROM_PB[s.kind]
    except KeyError:
        raise InvalidArgument(f"{field}.kind", f"unknown scope kind {s.kind}") from None
    if kind is ScopeKind.WORKSPACE and not s.id:
        return Scope.workspace()
    return Scope(kind, s.id)


def scope_to_pb(s: Scope) -> common_pb2.Scope:
    return common_pb2.Scope(kind=_SCOPE_TO_PB[s.kind], id=s.id)


def source_from_pb(s: common_pb2.Source) -> Source:
    return Source(s.who, s.why, s.run_id, s.session_id)


def source_to_pb(s: Source) -> common_pb2.Source:
    return common_pb2.Source(who=s.who, why=s.why, run_id=s.run_id, session_id=s.session_id)


def time_range_from_pb(msg: Message, name: str, prefix: str) -> TimeRange:
    if not msg.HasField(name):
        return TimeRange()
    tr: common_pb2.TimeRange = getattr(msg, name)
    field = f"{prefix}.{name}"
    return TimeRange(opt_ts(tr, "start_time", field), opt_ts(tr, "end_time", field))


# --- memories --------------------------------------------------------------------------


def draft_from_pb(m: memory_pb2.Memory, field: str) -> MemoryDraft:
    return MemoryDraft(
        content=m.content,
        scope=scope_from_pb(m.scope, f"{field}.scope", present=m.HasField("scope")),
        type=memory_type_from_pb(m.type, f"{field}.type"),
        category=m.category or "general",
        external_id=m.external_id,
        importance=m.importance if m.HasField("importance") else DEFAULT_IMPORTANCE,
        confidence=m.confidence if m.HasField("confidence") else DEFAULT_CONFIDENCE,
        pinned=m.pinned,
        source=source_from_pb(m.source),
        metadata=struct_to_dict(m.metadata, f"{field}.metadata"),
        event_time_ns=opt_ts(m, "event_time", field),
    )


def memory_to_pb(m: Memory) -> memory_pb2.Memory:
    pb = memory_pb2.Memory(
        id=m.id,
        external_id=m.external_id,
        scope=scope_to_pb(m.scope),
        type=memory_type_to_pb(m.type),
        category=m.category,
        content=m.content,
        content_hash=m.content_hash,
        importance=m.importance,
        confidence=m.confidence,
        pinned=m.pinned,
        source=source_to_pb(m.source),
        metadata=dict_to_struct(m.metadata),
        event_time=ns_to_ts(m.event_time_ns),
        create_time=ns_to_ts(m.create_time_ns),
        update_time=ns_to_ts(m.update_time_ns),
        supersedes_id=m.supersedes_id,
        superseded_by_id=m.superseded_by_id,
        embedding_model=m.embedding_model,
        index_state=memory_pb2.INDEX_STATE_INDEXED if m.indexed else memory_pb2.INDEX_STATE_PENDING,
    )
    if m.delete_time_ns is not None:
        pb.delete_time.CopyFrom(ns_to_ts(m.delete_time_ns))
    return pb


def exported_memory_from_pb(m: memory_pb2.Memory, field: str) -> Memory:
    """A full memory from an export, server-owned fields included. An event time left unset
    is the create time, as CreateMemory gives it (an export always sets it; the epoch is a
    time like any other)."""
    if not m.HasField("create_time"):
        # Required, and any time of the range (one before 1970 too; 0 or less read as unset).
        raise InvalidArgument(f"{field}.create_time", "is required")
    create_time_ns = ts_to_ns(m.create_time, f"{field}.create_time")
    event_time_ns = opt_ts(m, "event_time", field)
    return Memory(
        id=m.id,
        tenant_id="",
        scope=scope_from_pb(m.scope, f"{field}.scope", present=m.HasField("scope")),
        type=memory_type_from_pb(m.type, f"{field}.type"),
        category=m.category or "general",
        content=m.content,
        content_hash="",
        external_id=m.external_id,
        importance=m.importance if m.HasField("importance") else DEFAULT_IMPORTANCE,
        confidence=m.confidence if m.HasField("confidence") else DEFAULT_CONFIDENCE,
        pinned=m.pinned,
        source=source_from_pb(m.source),
        metadata=struct_to_dict(m.metadata, f"{field}.metadata"),
        event_time_ns=create_time_ns if event_time_ns is None else event_time_ns,
        create_time_ns=create_time_ns,
        update_time_ns=ts_to_ns(m.update_time, f"{field}.update_time"),
        delete_time_ns=opt_ts(m, "delete_time", field),
        supersedes_id=m.supersedes_id,
        superseded_by_id=m.superseded_by_id,
    )


def filter_from_pb(msg: Message, name: str = "filter") -> MemoryFilter:
    if not msg.HasField(name):
        return MemoryFilter()
    f: memory_pb2.MemoryFilter = getattr(msg, name)
    # Each value once (dict.fromkeys keeps the order): a scope named twice, or the workspace
    # as "" and as "default", listed its memories twice on ListMemories' first page (probe).
    return MemoryFilter(
        scopes=_once(scope_from_pb(s, f"{name}.scopes[{i}]") for i, s in enumerate(f.scopes)),
        types=_once(
            memory_type_from_pb(t, f"{name}.types[{i}]", default=None) for i, t in enumerate(f.types)
        ),
        # As a category is stored, so "Ops" finds what was created as "Ops" (stored "ops").
        categories=_once(sanitize_category(c) for c in f.categories),
        create_time=time_range_from_pb(f, "create_time", name),
        event_time=time_range_from_pb(f, "event_time", name),
        pinned_only=f.pinned_only,
        source_session_ids=_once(f.source_session_ids),
    )


def _once(values: Iterable[T]) -> tuple[T, ...]:
    return tuple(dict.fromkeys(values))
