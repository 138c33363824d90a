"""No MemoryService call made with tenant B's key can read or change tenant A's rows."""

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


@pytest.fixture
def a_memory(tenant_a: TenantClient) -> memory_pb2.Memory:
    created: memory_pb2.Memory = (
        tenant_a.memory()
        .CreateMemory(
            pb.CreateMemoryRequest(
                memory=memory_pb2.Memory(content="Tenant A's launch codename is BLUEBIRD", external_id="a-1"),
                wait_for_index=True,
            ),
            metadata=tenant_a.md,
            timeout=30,
        )
        .memory
    )
    return created


def _assert_a_untouched(tenant_a: TenantClient, m: memory_pb2.Memory) -> None:
    again = tenant_a.memory().GetMemory(pb.GetMemoryRequest(id=m.id), metadata=tenant_a.md, timeout=5).memory
    assert again == m


def _not_found(call: object) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_get_update_delete_by_id(
    tenant_a: TenantClient, tenant_b: TenantClient, a_memory: memory_pb2.Memory
) -> None:
    b = tenant_b.memory()
    _not_found(lambda: b.GetMemory(pb.GetMemoryRequest(id=a_memory.id), metadata=tenant_b.md, timeout=5))
    _not_found(lambda: b.GetMemory(pb.GetMemoryRequest(id="external:a-1"), metadata=tenant_b.md, timeout=5))
    _not_found(
        lambda: b.UpdateMemory(
            pb.UpdateMemoryRequest(
                memory=memory_pb2.Memory(id=a_memory.id, content="hijacked"),
                update_mask=field_mask_pb2.FieldMask(paths=["content"]),
            ),
            metadata=tenant_b.md,
            timeout=5,
        )
    )
    _not_found(
        lambda: b.DeleteMemory(pb.DeleteMemoryRequest(id=a_memory.id), metadata=tenant_b.md, timeout=5)
    )
    _assert_a_untouched(tenant_a, a_memory)


def test_list_recall_export_status(
    tenant_a: TenantClient, tenant_b: TenantClient, a_memory: memory_pb2.Memory
) -> None:
    b = tenant_b.memory()
    assert not b.ListMemories(
        pb.ListMemoriesRequest(show_deleted=True), metadata=tenant_b.md, timeout=5
    ).memories
    assert not b.Recall(
        pb.RecallRequest(query="launch codename BLUEBIRD"), metadata=tenant_b.md, timeout=5
    ).hits
    exported = [
        m
        for r in b.ExportMemories(
            pb.ExportMemoriesRequest(include_deleted=True), metadata=tenant_b.md, timeout=5
        )
        for m in r.memories
    ]
    assert exported == []
    status = b.GetStatus(pb.GetStatusRequest(), metadata=tenant_b.md, timeout=5)
    assert status.memory_count == 0 and status.deleted_count == 0
    # B has no search structures; the row cache is the server's, shared and counted as such.
    use = status.cache_use
    assert use.index_session_bytes == use.scope_vector_bytes == use.text_posting_bytes == 0
    assert use.index_row_id_bytes == use.vector_graph_bytes == use.vector_graph_rows == 0
    # ...while A sees its own.
    assert (
        tenant_a.memory()
        .Recall(pb.RecallRequest(query="launch codename BLUEBIRD"), metadata=tenant_a.md, timeout=5)
        .hits[0]
        .memory.id
        == a_memory.id
    )
    use = tenant_a.memory().GetStatus(pb.GetStatusRequest(), metadata=tenant_a.md, timeout=5).cache_use
    assert use.index_session_bytes > 0 and use.text_posting_bytes > 0 and use.scope_vector_bytes > 0
    # The unscoped Recall's vector search went to A's graph (a new table's graph is built at once).
    assert use.vector_graph_bytes > 0 and use.vector_graph_rows == 1
    assert use.row_cache_rows >= 1 and use.row_cache_hits + use.row_cache_misses >= 1


def test_purge_and_create_stay_in_their_tenant(
    tenant_a: TenantClient, tenant_b: TenantClient, a_memory: memory_pb2.Memory
) -> None:
    b = tenant_b.memory()
    n = b.PurgeMemories(
        pb.PurgeMemoriesRequest(all_memories=True, force=True), metadata=tenant_b.md, timeout=5
    ).purge_count
    assert n == 0
    # Identical content and external id in B is B's own memory, not a duplicate of A's.
    created = b.CreateMemory(
        pb.CreateMemoryRequest(
            memory=memory_pb2.Memory(content="Tenant A's launch codename is BLUEBIRD", external_id="a-1")
        ),
        metadata=tenant_b.md,
        timeout=5,
    )
    assert not created.deduplicated and created.memory.id != a_memory.id
    _assert_a_untouched(tenant_a, a_memory)


def test_import_of_anothers_ids_lands_in_the_callers_tenant(
    tenant_a: TenantClient, tenant_b: TenantClient, a_memory: memory_pb2.Memory
) -> None:
    b = tenant_b.memory()
    forged = memory_pb2.Memory()
    forged.CopyFrom(a_memory)
    forged.content = "overwritten through import"
    progress = list(
        b.ImportMemories(
            iter([pb.ImportMemoriesRequest(memories=[forged])]), metadata=tenant_b.md, timeout=10
        )
    )
    assert progress[-1].imported_count == 1
    assert b.GetMemory(
        pb.GetMemoryRequest(id=a_memory.id), metadata=tenant_b.md, timeout=5
    ).memory.content == ("overwritten through import")
    _assert_a_untouched(tenant_a, a_memory)


def test_idempotency_keys_are_per_tenant(tenant_a: TenantClient, tenant_b: TenantClient) -> None:
    a = tenant_a.memory().CreateMemory(
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="from a"), request_id="same-id"),
        metadata=tenant_a.md,
        timeout=5,
    )
    b = tenant_b.memory().CreateMemory(
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="from b"), request_id="same-id"),
        metadata=tenant_b.md,
        timeout=5,
    )
    assert a.memory.id != b.memory.id and b.memory.content == "from b"


def test_a_page_token_is_refused_in_another_tenant(tenant_a: TenantClient, tenant_b: TenantClient) -> None:
    """A token carries a position in one tenant's listing: in another it would silently
    page B's rows from A's position (or end B's paging with an empty page)."""
    a, b = tenant_a.memory(), tenant_b.memory()
    for who, stub, md in (("a", a, tenant_a.md), ("b", b, tenant_b.md)):
        reqs = [pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"{who} note {i}")) for i in range(3)]
        stub.BatchCreateMemories(pb.BatchCreateMemoriesRequest(requests=reqs), metadata=md, timeout=10)
    token = a.ListMemories(
        pb.ListMemoriesRequest(page_size=1), metadata=tenant_a.md, timeout=5
    ).next_page_token
    assert token
    with pytest.raises(grpc.RpcError) as err:
        b.ListMemories(pb.ListMemoriesRequest(page_size=1, page_token=token), metadata=tenant_b.md, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error_info(err.value)[1] == ["page_token"]


def test_a_tenants_write_is_indexed_while_another_tenants_bulk_load_waits(
    tenant_a: TenantClient, tenant_b: TenantClient
) -> None:
    """One worker indexes every tenant: with one line for all, B's create waited behind A's
    whole backlog (20k rows: still pending after 5 s, unsearchable for minutes). Tenants take
    turns, so B's memory is searchable within a batch or two of A's."""
    stub_a = tenant_a.memory()
    for b in range(6):  # 3,000 rows for the worker: several seconds of embedding here
        reqs = [
            pb.CreateMemoryRequest(
                memory=memory_pb2.Memory(content=f"bulk note {b}-{i}: the nightly job moved {i} files")
            )
            for i in range(500)
        ]
        stub_a.BatchCreateMemories(
            pb.BatchCreateMemoriesRequest(requests=reqs), metadata=tenant_a.md, timeout=60
        )
    started = time.monotonic()
    created = tenant_b.memory().CreateMemory(
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="B's one note"), wait_for_index=True),
        metadata=tenant_b.md,
        timeout=30,
    )
    took = time.monotonic() - started
    backlog = stub_a.GetStatus(pb.GetStatusRequest(), metadata=tenant_a.md, timeout=5).pending_index_count
    assert created.memory.index_state == memory_pb2.INDEX_STATE_INDEXED and took < 3.0, (took, backlog)
    assert backlog > 0  # B's note did not wait for A's backlog to drain


def test_wait_for_index_calls_past_max_index_waits_answer_at_once_pending(
    start_server: Callable[..., LiveServer],
) -> None:
    """A blocked wait_for_index holds a gRPC worker: 40 of one tenant's took all 32 and
    another tenant's GetMemory timed out. Past index.max_index_waits they answer at once,
    written and pending, and are indexed as ever."""
    live = start_server(index={"max_index_waits": 1})
    t = TenantClient(provision(live, "tenant-a"), live.channel())
    stub = t.memory()
    indexer = live.server.core.indexer
    indexer.stop()  # nothing is indexed until it starts again: a wait lasts its deadline

    def create(content: str, timeout: float) -> tuple[pb.CreateMemoryResponse, float]:
        started = time.monotonic()
        req = pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=content), wait_for_index=True)
        return stub.CreateMemory(req, metadata=t.md, timeout=timeout), time.monotonic() - started

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(create, "the first note waits", 3.0)
        time.sleep(0.5)
        second, took = create("the second note does not", 3.0)
        assert took < 1.0 and second.memory.index_state == memory_pb2.INDEX_STATE_PENDING
        waited, first_took = first.result()
        assert first_took > 2.0 and waited.memory.index_state == memory_pb2.INDEX_STATE_PENDING
    indexer.start()
    assert indexer.wait_idle(30)
    for m in (second.memory, waited.memory):
        got = stub.GetMemory(pb.GetMemoryRequest(id=m.id), metadata=t.md, timeout=5).memory
        assert got.index_state == memory_pb2.INDEX_STATE_INDEXED
