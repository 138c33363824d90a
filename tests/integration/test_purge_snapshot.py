"""A dry-run PurgeMemories answers a snapshot token; the forced purge given it deletes only
the memories stored by that count, whatever their times say (a real server)."""

from __future__ import annotations

import time
import uuid

import grpc
import pytest
from google.protobuf import timestamp_pb2

from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from tests.conftest import TenantClient, error_info

_DAY_NS = 86_400 * 10**9


def _create(t: TenantClient, content: str, category: str = "notes") -> memory_pb2.Memory:
    req = pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=content, category=category))
    created: memory_pb2.Memory = t.memory().CreateMemory(req, metadata=t.md, timeout=10).memory
    return created


def _import_dated(t: TenantClient, content: str, create_ns: int, category: str = "notes") -> None:
    """A memory stored now but created (by its own account) at create_ns: an import."""
    stamp = timestamp_pb2.Timestamp()
    stamp.FromNanoseconds(create_ns)
    m = memory_pb2.Memory(
        id=str(uuid.uuid4()), content=content, category=category, create_time=stamp, update_time=stamp
    )
    answers = list(
        t.memory().ImportMemories(iter([pb.ImportMemoriesRequest(memories=[m])]), metadata=t.md, timeout=10)
    )
    assert answers[-1].imported_count == 1


def _purge(t: TenantClient, **kw: object) -> pb.PurgeMemoriesResponse:
    answer: pb.PurgeMemoriesResponse = t.memory().PurgeMemories(
        pb.PurgeMemoriesRequest(**kw),
        metadata=t.md,
        timeout=10,  # type: ignore[arg-type]
    )
    return answer


def _live(t: TenantClient) -> list[str]:
    listed = t.memory().ListMemories(pb.ListMemoriesRequest(page_size=100), metadata=t.md, timeout=10)
    return sorted(m.content for m in listed.memories)


def test_a_purge_with_the_dry_runs_token_keeps_what_was_stored_after_the_count(
    tenant_a: TenantClient,
) -> None:
    for i in range(3):
        _create(tenant_a, f"counted note {i}")
    _create(tenant_a, "another category", category="other")
    notes = memory_pb2.MemoryFilter(categories=["notes"])
    counted = _purge(tenant_a, filter=notes)
    assert counted.purge_count == 3 and counted.snapshot_token
    # Stored after the count: a new memory, and imports dated a day and a year before it
    # (a create_time bound, as `memory clear` had, deleted these two).
    _create(tenant_a, "late note")
    _import_dated(tenant_a, "imported note, dated yesterday", time.time_ns() - _DAY_NS)
    _import_dated(tenant_a, "imported note, dated last year", time.time_ns() - 365 * _DAY_NS)
    # A dry run given the token counts what the token's count saw, and answers it again.
    again = _purge(tenant_a, filter=notes, snapshot_token=counted.snapshot_token)
    assert (again.purge_count, again.snapshot_token) == (3, counted.snapshot_token)

    purged = _purge(tenant_a, filter=notes, force=True, snapshot_token=counted.snapshot_token)
    assert purged.purge_count == 3 and not purged.snapshot_token
    assert _live(tenant_a) == [
        "another category",
        "imported note, dated last year",
        "imported note, dated yesterday",
        "late note",
    ]
    # Without a token a forced purge takes every match, as before.
    assert _purge(tenant_a, filter=notes, force=True).purge_count == 3
    assert _live(tenant_a) == ["another category"]


def test_the_token_bounds_a_purge_of_all_memories_and_of_an_empty_tenant(
    tenant_a: TenantClient, tenant_b: TenantClient
) -> None:
    empty = _purge(tenant_b, all_memories=True)
    assert empty.purge_count == 0 and empty.snapshot_token
    _create(tenant_b, "stored after an empty count")
    assert (
        _purge(tenant_b, all_memories=True, force=True, snapshot_token=empty.snapshot_token).purge_count == 0
    )
    assert _live(tenant_b) == ["stored after an empty count"]

    _create(tenant_a, "first")
    counted = _purge(tenant_a, all_memories=True)
    _create(tenant_a, "second")
    # Another tenant's writes in between do not move A's bound.
    _create(tenant_b, "b's second")
    done = _purge(tenant_a, all_memories=True, force=True, snapshot_token=counted.snapshot_token)
    assert (counted.purge_count, done.purge_count) == (1, 1)
    assert _live(tenant_a) == ["second"]
    assert _live(tenant_b) == ["b's second", "stored after an empty count"]


@pytest.mark.parametrize(
    "token", ["x", "s1.", "s1.-1", "s1.01", "s1.1 ", "s2.5", "S1.5", "s1.9223372036854775808", "s1.1e3"]
)
def test_a_token_that_is_not_a_dry_runs_is_invalid_and_deletes_nothing(
    tenant_a: TenantClient, token: str
) -> None:
    _create(tenant_a, "kept")
    for force in (False, True):
        with pytest.raises(grpc.RpcError) as err:
            _purge(tenant_a, all_memories=True, force=force, snapshot_token=token)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(err.value)[1] == ["snapshot_token"]
    assert _live(tenant_a) == ["kept"]
