"""Memory rows for tests that write to the store directly, without the service."""

from __future__ import annotations

from mnemo_server.memory.model import Memory, MemoryType, Scope


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
