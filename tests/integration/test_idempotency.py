"""request_id: a retried write takes effect once; a reused id with another request is refused."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.protobuf import field_mask_pb2

from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from tests.conftest import LiveServer, TenantClient, error_info, provision


def _count(t: TenantClient, show_deleted: bool = False) -> int:
    return len(
        t.memory()
        .ListMemories(
            pb.ListMemoriesRequest(page_size=1000, show_deleted=show_deleted), metadata=t.md, timeout=5
        )
        .memories
    )


def test_create_retry_returns_the_first_result(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    req = pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="charge the card once"), request_id="r-1")
    first = stub.CreateMemory(req, metadata=tenant_a.md, timeout=5)
    second = stub.CreateMemory(req, metadata=tenant_a.md, timeout=5)
    assert second.memory.id == first.memory.id and second.deduplicated == first.deduplicated is False
    assert _count(tenant_a) == 1
    other = pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="something else"), request_id="r-1")
    with pytest.raises(grpc.RpcError) as err:
        stub.CreateMemory(other, metadata=tenant_a.md, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(err.value) == ("REQUEST_ID_REUSED", ["request_id"])
    assert _count(tenant_a) == 1


def test_keyed_creates_sent_at_once_each_keep_their_own_result(tenant_a: TenantClient) -> None:
    """Creates sent together may share a transaction (group commit), which records all their
    request ids in one statement: each retry still returns its own first result, and a
    request id is bound to its own request only."""
    stub = tenant_a.memory()
    requests = [
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"grouped fact {i}"), request_id=f"g-{i}")
        for i in range(12)
    ]
    with ThreadPoolExecutor(len(requests)) as pool:
        first = list(pool.map(lambda r: stub.CreateMemory(r, metadata=tenant_a.md, timeout=10), requests))
        again = list(pool.map(lambda r: stub.CreateMemory(r, metadata=tenant_a.md, timeout=10), requests))
    assert [a.memory.id for a in again] == [f.memory.id for f in first]
    assert [f.memory.content for f in first] == [f"grouped fact {i}" for i in range(12)]
    assert not any(f.deduplicated for f in first) and _count(tenant_a) == 12
    swapped = pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="grouped fact 1"), request_id="g-0")
    with pytest.raises(grpc.RpcError) as err:
        stub.CreateMemory(swapped, metadata=tenant_a.md, timeout=5)
    assert error_info(err.value) == ("REQUEST_ID_REUSED", ["request_id"])


def test_batch_retry(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    req = pb.BatchCreateMemoriesRequest(
        requests=[pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"m{i}")) for i in range(5)],
        request_id="batch-1",
    )
    first = [r.memory.id for r in stub.BatchCreateMemories(req, metadata=tenant_a.md, timeout=5).results]
    again = [r.memory.id for r in stub.BatchCreateMemories(req, metadata=tenant_a.md, timeout=5).results]
    assert first == again and _count(tenant_a) == 5


def test_update_delete_and_purge_retries(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    m = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="v1")), metadata=tenant_a.md, timeout=5
    ).memory
    upd = pb.UpdateMemoryRequest(
        memory=memory_pb2.Memory(id=m.id, importance=0.8),
        update_mask=field_mask_pb2.FieldMask(paths=["importance"]),
        request_id="u-1",
    )
    u1 = stub.UpdateMemory(upd, metadata=tenant_a.md, timeout=5).memory
    u2 = stub.UpdateMemory(upd, metadata=tenant_a.md, timeout=5).memory
    assert u1.update_time == u2.update_time  # applied once
    dreq = pb.DeleteMemoryRequest(id=m.id, request_id="d-1")
    d1 = stub.DeleteMemory(dreq, metadata=tenant_a.md, timeout=5).memory
    d2 = stub.DeleteMemory(dreq, metadata=tenant_a.md, timeout=5).memory  # a retry succeeds, no NOT_FOUND
    assert d1.delete_time == d2.delete_time
    for i in range(3):
        stub.CreateMemory(
            pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"p{i}")), metadata=tenant_a.md, timeout=5
        )
    preq = pb.PurgeMemoriesRequest(all_memories=True, force=True, request_id="p-1")
    assert stub.PurgeMemories(preq, metadata=tenant_a.md, timeout=5).purge_count == 3
    stub.CreateMemory(
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="after purge")),
        metadata=tenant_a.md,
        timeout=5,
    )
    assert stub.PurgeMemories(preq, metadata=tenant_a.md, timeout=5).purge_count == 3  # replayed, not re-run
    assert _count(tenant_a) == 1


def test_an_update_retry_returns_the_first_result_after_later_writes(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    m = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="rate limit is 100/s")),
        metadata=tenant_a.md,
        timeout=5,
    ).memory

    def set_importance(value: float, request_id: str = "") -> memory_pb2.Memory:
        return stub.UpdateMemory(
            pb.UpdateMemoryRequest(
                memory=memory_pb2.Memory(id=m.id, importance=value),
                update_mask=field_mask_pb2.FieldMask(paths=["importance"]),
                request_id=request_id,
            ),
            metadata=tenant_a.md,
            timeout=5,
        ).memory

    first = set_importance(0.7, "raise-it")
    later = set_importance(0.1)
    assert later.importance == pytest.approx(0.1) and later.update_time != first.update_time
    retried = set_importance(0.7, "raise-it")
    assert retried.importance == pytest.approx(0.7) and retried.update_time == first.update_time
    stub.DeleteMemory(pb.DeleteMemoryRequest(id=m.id), metadata=tenant_a.md, timeout=5)
    after_delete = set_importance(0.7, "raise-it")  # still the first call's answer, not re-applied
    assert after_delete.update_time == first.update_time and not after_delete.HasField("delete_time")
    now = stub.GetMemory(pb.GetMemoryRequest(id=m.id), metadata=tenant_a.md, timeout=5).memory
    assert now.HasField("delete_time") and now.importance == pytest.approx(0.1)


def test_a_delete_retry_answers_with_the_tombstone_after_an_import_restored_the_memory(
    tenant_a: TenantClient,
) -> None:
    stub = tenant_a.memory()
    m = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="the cache TTL is 5 minutes")),
        metadata=tenant_a.md,
        timeout=5,
    ).memory
    delete = pb.DeleteMemoryRequest(id=m.id, request_id="drop-ttl")
    first = stub.DeleteMemory(delete, metadata=tenant_a.md, timeout=5).memory
    assert first.HasField("delete_time")
    restored = memory_pb2.Memory()
    restored.CopyFrom(m)
    list(
        stub.ImportMemories(
            iter([pb.ImportMemoriesRequest(memories=[restored])]), metadata=tenant_a.md, timeout=10
        )
    )
    live = stub.GetMemory(pb.GetMemoryRequest(id=m.id), metadata=tenant_a.md, timeout=5).memory
    assert not live.HasField("delete_time")
    retried = stub.DeleteMemory(delete, metadata=tenant_a.md, timeout=5).memory
    assert retried == first  # what the delete did, not the restored memory
    assert not stub.GetMemory(pb.GetMemoryRequest(id=m.id), metadata=tenant_a.md, timeout=5).memory.HasField(
        "delete_time"
    )  # and not done again


def _sweep_until(live: LiveServer, t: TenantClient, left: int) -> None:
    """Retention sweeps until `left` memories, tombstones included, remain. A tombstone is
    purged once the index has dropped its row, which the index worker does in the
    background: a single sweep raced it under load."""
    deadline = time.monotonic() + 30
    live.server.core.retention.sweep()
    while _count(t, show_deleted=True) != left:
        assert time.monotonic() < deadline, _count(t, show_deleted=True)
        time.sleep(0.05)
        live.server.core.retention.sweep()


def test_an_update_or_delete_retry_after_its_memory_was_purged_for_good_is_not_found(
    start_server: Callable[..., LiveServer],
) -> None:
    """Once purged, "no call returns it": a retried UpdateMemory or DeleteMemory answered
    with the purged memory's content, kept with its request_id, for the record's 24 h."""
    live = start_server(retention={"interval_s": 0, "tombstone_days": 0})
    client = TenantClient(provision(live, "tenant-a"), live.channel())
    stub = client.memory()
    mid = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="the vault code is 4711")), metadata=client.md
    ).memory.id
    update = pb.UpdateMemoryRequest(
        memory=memory_pb2.Memory(id=mid, content="the vault code is 4712"),
        update_mask=field_mask_pb2.FieldMask(paths=["content"]),
        request_id="r-u1",
    )
    delete = pb.DeleteMemoryRequest(id=mid, request_id="r-d1")
    stub.UpdateMemory(update, metadata=client.md, timeout=5)
    stub.DeleteMemory(delete, metadata=client.md, timeout=5)
    assert stub.DeleteMemory(delete, metadata=client.md, timeout=5).memory.HasField("delete_time")  # kept
    _sweep_until(live, client, 0)
    for call, req in ((stub.UpdateMemory, update), (stub.DeleteMemory, delete)):
        with pytest.raises(grpc.RpcError) as err:
            call(req, metadata=client.md, timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, err.value.details()
        assert "4711" not in (err.value.details() or "") and "4712" not in (err.value.details() or "")


def test_a_create_retry_after_its_memory_was_purged_for_good_is_not_found(
    start_server: Callable[..., LiveServer],
) -> None:
    """A tombstone window shorter than the request_id's: the retry's memory is gone, and the
    retry said INTERNAL (a KeyError) instead of NOT_FOUND. A batch retry likewise, and a
    group of creates written together still writes the others."""
    live = start_server(retention={"interval_s": 0, "tombstone_days": 0})
    client = TenantClient(provision(live, "tenant-a"), live.channel())
    stub = client.memory()
    one = pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="a note to purge"), request_id="r-p1")
    batch = pb.BatchCreateMemoriesRequest(
        requests=[
            pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"batch note {i}")) for i in range(3)
        ],
        request_id="r-p2",
    )
    mid = stub.CreateMemory(one, metadata=client.md, timeout=5).memory.id
    batch_ids = [r.memory.id for r in stub.BatchCreateMemories(batch, metadata=client.md, timeout=5).results]
    for gone in (mid, batch_ids[1]):
        stub.DeleteMemory(pb.DeleteMemoryRequest(id=gone), metadata=client.md, timeout=5)
    _sweep_until(live, client, 2)
    for call, req, gone in ((stub.CreateMemory, one, mid), (stub.BatchCreateMemories, batch, batch_ids[1])):
        with pytest.raises(grpc.RpcError) as err:
            call(req, metadata=client.md, timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, err.value.details()
        assert error_info(err.value)[0] == "MEMORY_NOT_FOUND"
        assert err.value.details().startswith(f"request_id: memory '{gone}' not found")
    # Sent at once, the retry and fresh creates may share one write: the fresh ones are written.
    fresh = [pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"fresh {i}")) for i in range(6)]
    with ThreadPoolExecutor(7) as pool:
        retry = pool.submit(stub.CreateMemory, one, metadata=client.md, timeout=5)
        made = [pool.submit(stub.CreateMemory, r, metadata=client.md, timeout=5) for r in fresh]
        assert all(f.result().memory.id for f in made)
        with pytest.raises(grpc.RpcError) as err:
            retry.result()
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert _count(client) == 2 + 6


def test_a_retry_differing_only_in_what_the_server_ignores_is_the_same_request(
    tenant_a: TenantClient,
) -> None:
    """A create's output-only fields and a batch entry's own request_id and wait_for_index
    are ignored (the contract), yet they made a retry "a different request": a client that
    re-sends the memory its first answer filled in, or rebuilds a batch with fresh entry ids."""
    stub = tenant_a.memory()
    req = pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="renew the domain"), request_id="o-1")
    first = stub.CreateMemory(req, metadata=tenant_a.md, timeout=5)
    filled = pb.CreateMemoryRequest(request_id="o-1", wait_for_index=True)
    filled.memory.CopyFrom(req.memory)
    # What the first answer filled in, sent back with it: all of it output-only.
    out = first.memory
    filled.memory.id, filled.memory.content_hash = out.id, out.content_hash
    filled.memory.embedding_model, filled.memory.index_state = out.embedding_model, out.index_state
    filled.memory.create_time.CopyFrom(out.create_time)
    filled.memory.update_time.CopyFrom(out.update_time)
    assert filled.memory.id and filled.memory.content_hash and filled.memory.HasField("create_time")
    again = stub.CreateMemory(filled, metadata=tenant_a.md, timeout=5)
    assert again.memory.id == first.memory.id and _count(tenant_a) == 1

    def batch(entry_ids: list[str]) -> pb.BatchCreateMemoriesResponse:
        entries = [
            pb.CreateMemoryRequest(
                memory=memory_pb2.Memory(content=f"batch entry {i}"), request_id=rid, wait_for_index=bool(rid)
            )
            for i, rid in enumerate(entry_ids)
        ]
        answer: pb.BatchCreateMemoriesResponse = stub.BatchCreateMemories(
            pb.BatchCreateMemoriesRequest(requests=entries, request_id="b-1"),
            metadata=tenant_a.md,
            timeout=10,
        )
        return answer

    made = batch(["", ""])
    replayed = batch(["entry-a", "entry-b"])
    assert [r.memory.id for r in replayed.results] == [r.memory.id for r in made.results]
    assert _count(tenant_a) == 3
    # What the write is still counts: another content under the same key is refused.
    changed = pb.CreateMemoryRequest(memory=filled.memory, request_id="o-1")
    changed.memory.content = "renew the certificate"
    with pytest.raises(grpc.RpcError) as err:
        stub.CreateMemory(changed, metadata=tenant_a.md, timeout=5)
    assert error_info(err.value) == ("REQUEST_ID_REUSED", ["request_id"])
