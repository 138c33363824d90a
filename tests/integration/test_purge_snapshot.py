"""A dry-run PurgeMemories answers a snapshot token; the forced purge given it deletes only
the memories stored by that count, whatever their times say. A forced purge is written a
batch of memories a transaction (a real server)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.protobuf import timestamp_pb2

from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from tests.conftest import LiveServer, TenantClient, error_info, provision

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


def _create_notes(t: TenantClient, n: int) -> None:
    """n memories, "note 0" to "note n-1", a hundred a call."""
    for start in range(0, n, 100):
        t.memory().BatchCreateMemories(
            pb.BatchCreateMemoriesRequest(
                requests=[
                    pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"note {i}"))
                    for i in range(start, min(n, start + 100))
                ]
            ),
            metadata=t.md,
            timeout=30,
        )


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


def test_a_forced_purge_is_written_a_batch_a_transaction_and_keeps_what_comes_meanwhile(
    start_server: Callable[..., LiveServer],
) -> None:
    """One transaction held the memories write lock for the whole purge (0.6-0.9 s for 77k
    memories), every tenant's writes behind it. Each batch's deletions carry that batch's
    time, so the history shows how the purge was written."""
    live = start_server(storage={"purge_batch": 7})
    t = TenantClient(provision(live, "tenant-a"), live.channel())
    stub = t.memory()
    made = stub.BatchCreateMemories(
        pb.BatchCreateMemoriesRequest(
            requests=[
                pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"note {i}")) for i in range(40)
            ]
        ),
        metadata=t.md,
        timeout=30,
    )
    ids = [r.memory.id for r in made.results]
    request = pb.PurgeMemoriesRequest(all_memories=True, force=True, request_id="purge-in-batches")
    assert stub.PurgeMemories(request, metadata=t.md, timeout=30).purge_count == 40
    deleted_at = []
    for mid in ids:
        entries = stub.GetMemoryHistory(pb.GetMemoryHistoryRequest(id=mid), metadata=t.md, timeout=5).entries
        assert [e.action for e in entries] == ["create", "delete"], mid
        deleted_at.append(entries[1].time.ToNanoseconds())
    # Six transactions (7 x 5 + 5), in insertion order: the batches' times rise with it.
    assert len(set(deleted_at)) == 6
    assert deleted_at == sorted(deleted_at)
    assert [deleted_at.count(at) for at in sorted(set(deleted_at))] == [7, 7, 7, 7, 7, 5]
    # Its retry is answered from the record, and created memories since are kept.
    _create(t, "after the purge")
    assert stub.PurgeMemories(request, metadata=t.md, timeout=30).purge_count == 40
    assert _live(t) == ["after the purge"]


def test_copies_of_a_purge_sent_at_once_purge_once_and_give_one_answer(
    start_server: Callable[..., LiveServer],
) -> None:
    """A client that times out retries while its purge still runs: the retry waits for it
    and is answered from its record, rather than purging beside it batch by batch and
    recording a count of its own."""
    live = start_server(storage={"purge_batch": 7})
    t = TenantClient(provision(live, "tenant-a"), live.channel())
    stub = t.memory()
    _create_notes(t, 300)
    request = pb.PurgeMemoriesRequest(all_memories=True, force=True, request_id="sent-three-times")
    with ThreadPoolExecutor(3) as pool:
        answers = list(
            pool.map(lambda _: stub.PurgeMemories(request, metadata=t.md, timeout=60).purge_count, range(3))
        )
    assert answers == [300, 300, 300]
    page = stub.ListMemories(pb.ListMemoriesRequest(page_size=1000, show_deleted=True), metadata=t.md)
    assert len(page.memories) == 300 and all(m.HasField("delete_time") for m in page.memories)
    for m in page.memories[:40]:
        entries = stub.GetMemoryHistory(pb.GetMemoryHistoryRequest(id=m.id), metadata=t.md, timeout=5).entries
        assert [e.action for e in entries] == ["create", "delete"], m.id


def test_a_copy_of_a_running_purge_waits_only_until_its_own_deadline(
    start_server: Callable[..., LiveServer],
) -> None:
    """A retry of a purge still running waited for it to the end, past its own deadline:
    a purge that outlasts a client's retries held a gRPC worker for each of them. It now
    answers DEADLINE_EXCEEDED (PURGE_IN_PROGRESS) just before its deadline, changing
    nothing, and a retry after the purge has ended gets the purge's count."""
    live = start_server(storage={"purge_batch": 1})
    t = TenantClient(provision(live, "tenant-a"), live.channel())
    stub = t.memory()
    n = 600
    _create_notes(t, n)
    request = pb.PurgeMemoriesRequest(all_memories=True, force=True, request_id="a-long-purge")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(lambda: stub.PurgeMemories(request, metadata=t.md, timeout=120).purge_count)
        deadline = time.monotonic() + 30
        while _purge(t, all_memories=True).purge_count == n:  # until its first batch is written
            assert time.monotonic() < deadline, "the purge never started"
        sent = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            stub.PurgeMemories(request, metadata=t.md, timeout=1.0)
        waited = time.monotonic() - sent
        # The server's answer, not the client's own timer: it names why, and came in time.
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert error_info(err.value)[0] == "PURGE_IN_PROGRESS"
        assert 0.5 < waited < 1.0
        assert not first.done(), f"the purge of {n} memories a batch each ended within a second"
        assert first.result() == n
    assert stub.PurgeMemories(request, metadata=t.md, timeout=10).purge_count == n
    assert _live(t) == []
    page = stub.ListMemories(pb.ListMemoriesRequest(page_size=1000, show_deleted=True), metadata=t.md)
    assert len(page.memories) == n
