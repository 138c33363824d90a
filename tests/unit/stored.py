"""Memory and session rows for tests that write to the store directly, without the service."""

from __future__ import annotations

from pathlib import Path

from mnemo_server.memory.model import Memory, MemoryType, Scope
from mnemo_server.store import memory_repo, session_candidates
from mnemo_server.store.database import Database
from mnemo_server.store.session_candidates import SessionMemoryRow
from mnemo_server.store.session_repo import SessionRow


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


def session_row(sid: str) -> SessionRow:
    """An active session of tenant "t", started at 1 ns."""
    return SessionRow(
        tenant_id="t",
        id=sid,
        agent_id="a",
        persona_id="",
        project_id="",
        context=f"context of {sid}",
        state="active",
        request_fingerprint=f"fp-{sid}",
        ranking_path="baseline",
        fallback_reason="cold_start",
        model_version="",
        predictor_weight=0.0,
        sidecar_ms=0.0,
        sidecar_deadline_ms=120,
        took_ms=1.0,
        token_budget=100,
        tokens_used=10,
        dropped_count=0,
        feature_names=["x"],
        start_time_ns=1,
    )


def packed_candidates(sid: str, n: int) -> bytes:
    """n candidates of the session, packed as StartSession records them."""
    rows = [
        SessionMemoryRow(f"{sid}-m{i}", i, i + 1, "vector", 1.0, i + 1, 0.0, 0, 1.0, 5, [0.5])
        for i in range(n)
    ]
    return session_candidates.pack(rows)
