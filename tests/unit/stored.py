"""Memory rows for tests that write to the store directly, without the service."""

from __future__ import annotations

from pathlib import Path

from mnemo_server.memory.model import Memory, MemoryType, Scope
from mnemo_server.store import memory_repo
from mnemo_server.store.database import Database


def stored_memory(i: int, created: int) -> Memory:
    """Memory m<i> in tenant "t", workspace scope, created (and event time) at `created`."""
    return Memory(
        id=f"m{i}",
        tenant_id="t",
        scope=Scope.workspace(),
        type=MemoryType.SEMANTIC,
        category="general",
        content=f"memory {i}",
        content_hash=f"h{i}",
        seq=i,
        revision=1,
        create_time_ns=created,
        update_time_ns=created,
        event_time_ns=created,
        embedding_model="m",
    )


def database_with_memories(path: Path, count: int = 3) -> Database:
    """A store file holding memories m0 .. m<count - 1> (see stored_memory)."""
    database = Database(path)
    with database.transaction() as cur:
        memory_repo.insert_many(
            cur, [(stored_memory(i, i), f"memory {i}") for i in range(count)], database.stored
        )
    return database
