"""Plain domain types for memories. Times are integer nanoseconds since the Unix epoch (UTC),
which round-trip exactly through protobuf Timestamps."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


def now_ns() -> int:
    return time.time_ns()


class MemoryType(StrEnum):
    SEMANTIC = "semantic"
    EPISODIC = "episodic"
    PROCEDURAL = "procedural"
    DOCUMENT_CHUNK = "document_chunk"


class ScopeKind(StrEnum):
    SESSION = "session"
    PERSONA = "persona"
    PROJECT = "project"
    WORKSPACE = "workspace"


WORKSPACE_DEFAULT_ID = "default"


@dataclass(frozen=True)
class Scope:
    kind: ScopeKind
    id: str

    @property
    def key(self) -> str:
        """One string that identifies the scope inside a tenant (used by the index)."""
        return f"{self.kind.value}:{self.id}"

    @classmethod
    def workspace(cls) -> Scope:
        return cls(ScopeKind.WORKSPACE, WORKSPACE_DEFAULT_ID)


@dataclass(frozen=True)
class Source:
    who: str = ""
    why: str = ""
    run_id: str = ""
    session_id: str = ""


@dataclass(frozen=True)
class TimeRange:
    """Half-open [start_ns, end_ns); None is unbounded."""

    start_ns: int | None = None
    end_ns: int | None = None

    def contains(self, t: int) -> bool:
        return (self.start_ns is None or t >= self.start_ns) and (self.end_ns is None or t < self.end_ns)

    @property
    def is_set(self) -> bool:
        return self.start_ns is not None or self.end_ns is not None


# What an unset importance or confidence means, on create and on a masked update alike.
DEFAULT_IMPORTANCE = 0.5
DEFAULT_CONFIDENCE = 1.0


@dataclass
class MemoryDraft:
    """What a caller asks to store; server-owned fields are absent."""

    content: str
    scope: Scope = field(default_factory=Scope.workspace)
    type: MemoryType = MemoryType.SEMANTIC
    category: str = "general"
    external_id: str = ""
    importance: float = DEFAULT_IMPORTANCE
    confidence: float = DEFAULT_CONFIDENCE
    pinned: bool = False
    source: Source = field(default_factory=Source)
    metadata: dict[str, Any] = field(default_factory=dict)
    event_time_ns: int | None = None


@dataclass
class Memory:
    id: str
    tenant_id: str
    scope: Scope
    type: MemoryType
    category: str
    content: str
    content_hash: str
    external_id: str = ""
    importance: float = DEFAULT_IMPORTANCE
    confidence: float = DEFAULT_CONFIDENCE
    pinned: bool = False
    source: Source = field(default_factory=Source)
    metadata: dict[str, Any] = field(default_factory=dict)
    event_time_ns: int = 0
    create_time_ns: int = 0
    update_time_ns: int = 0
    delete_time_ns: int | None = None
    supersedes_id: str = ""
    superseded_by_id: str = ""
    embedding_model: str = ""
    indexed: bool = False
    # Internal: global insertion order (adjacency, stable paging) and change counter.
    seq: int = 0
    revision: int = 0
    # Internal: how many sessions it was injected into (a ranker feature).
    access_count: int = 0

    @property
    def deleted(self) -> bool:
        return self.delete_time_ns is not None


@dataclass(frozen=True)
class MemoryFilter:
    scopes: tuple[Scope, ...] = ()
    types: tuple[MemoryType, ...] = ()
    categories: tuple[str, ...] = ()
    create_time: TimeRange = TimeRange()
    event_time: TimeRange = TimeRange()
    pinned_only: bool = False
    source_session_ids: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not (
            self.scopes
            or self.types
            or self.categories
            or self.create_time.is_set
            or self.event_time.is_set
            or self.pinned_only
            or self.source_session_ids
        )

    @property
    def scopes_only(self) -> bool:
        """Nothing but scopes (if any) is filtered on: what the in-memory indexes answer."""
        return self == MemoryFilter(scopes=self.scopes)

    def matches(self, m: Memory) -> bool:
        """The filter evaluated in Python, on the source of truth."""
        return (
            (not self.scopes or m.scope in self.scopes)
            and (not self.types or m.type in self.types)
            and (not self.categories or m.category in self.categories)
            and self.create_time.contains(m.create_time_ns)
            and self.event_time.contains(m.event_time_ns)
            and (not self.pinned_only or m.pinned)
            and (not self.source_session_ids or m.source.session_id in self.source_session_ids)
        )


@dataclass(frozen=True)
class CreateResult:
    memory: Memory
    deduplicated: bool


@dataclass(frozen=True)
class HistoryEntry:
    """One decision about a memory, from its audit history (memory_history)."""

    action: str  # create, import, update, delete, prune
    actor: str
    reason: str
    details: dict[str, Any]
    time_ns: int


@dataclass(frozen=True)
class IdempotencyKey:
    """A caller's request_id plus a fingerprint of the request it came with."""

    method: str
    request_id: str
    fingerprint: str
