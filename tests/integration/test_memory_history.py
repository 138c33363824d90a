"""GetMemoryHistory over gRPC against a real server: what happened to a memory, oldest first,
by whom and why, a page at a time; for deleted, pruned and purged memories too; never another
tenant's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf import field_mask_pb2, json_format

from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from tests.conftest import LiveServer, TenantClient, error_info, provision


def _history(
    client: TenantClient, ident: str, page_size: int = 0, token: str = ""
) -> pb.GetMemoryHistoryResponse:
    return client.memory().GetMemoryHistory(
        pb.GetMemoryHistoryRequest(id=ident, page_size=page_size, page_token=token),
        metadata=client.md,
        timeout=10,
    )


def _entries(client: TenantClient, ident: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    return [
        (e.action, e.actor, e.reason, json_format.MessageToDict(e.details))
        for e in _history(client, ident).entries
    ]


def _create(client: TenantClient, content: str, **fields: Any) -> memory_pb2.Memory:
    req = pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=content, **fields))
    return client.memory().CreateMemory(req, metadata=client.md, timeout=10).memory


def _fails(call: Callable[[], object]) -> tuple[grpc.StatusCode, list[str]]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    err: Any = caught.value
    return err.code(), error_info(err)[1]


def test_a_memorys_history_names_each_change_by_whom_and_why_oldest_first(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    m = _create(
        tenant_a,
        "The staging cluster is rebuilt every monday",
        external_id="ops-7",
        source=common_pb2.Source(who="deploy-bot", why="runbook import"),
    )
    stub.UpdateMemory(
        pb.UpdateMemoryRequest(
            memory=memory_pb2.Memory(
                id=m.id, content="The staging cluster is rebuilt every tuesday", importance=0.9
            ),
            update_mask=field_mask_pb2.FieldMask(paths=["content", "importance"]),
        ),
        metadata=tenant_a.md,
        timeout=10,
    )
    by_external = _history(tenant_a, "external:ops-7")
    assert by_external.memory_id == m.id
    times = [e.time.ToNanoseconds() for e in by_external.entries]
    assert times == sorted(times) and times[0] == m.create_time.ToNanoseconds()
    stub.DeleteMemory(pb.DeleteMemoryRequest(id=m.id), metadata=tenant_a.md, timeout=10)

    expected = [
        ("create", "deploy-bot", "runbook import", {"type": "semantic"}),
        ("update", "api", "", {"paths": ["content", "importance"]}),
        ("delete", "api", "", {}),
    ]
    assert _entries(tenant_a, m.id) == expected  # a deleted memory's history stays readable
    assert len(by_external.entries) == 2


def test_history_pages_give_every_entry_once_and_tokens_belong_to_their_memory(
    tenant_a: TenantClient,
) -> None:
    stub = tenant_a.memory()
    m = _create(tenant_a, "the quarterly budget review moved to friday")
    other = _create(tenant_a, "bob prefers tea over coffee")
    for importance in (0.1, 0.2, 0.3, 0.4):
        stub.UpdateMemory(
            pb.UpdateMemoryRequest(
                memory=memory_pb2.Memory(id=m.id, importance=importance),
                update_mask=field_mask_pb2.FieldMask(paths=["importance"]),
            ),
            metadata=tenant_a.md,
            timeout=10,
        )
    whole = list(_history(tenant_a, m.id).entries)
    assert [e.action for e in whole] == ["create"] + ["update"] * 4
    paged: list[pb.MemoryHistoryEntry] = []
    token = ""
    for _ in range(10):
        page = _history(tenant_a, m.id, page_size=2, token=token)
        assert len(page.entries) <= 2
        paged.extend(page.entries)
        token = page.next_page_token
        if not token:
            break
    assert paged == whole
    first = _history(tenant_a, m.id, page_size=2)
    code, fields = _fails(lambda: _history(tenant_a, other.id, page_size=2, token=first.next_page_token))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fields == ["page_token"]


def test_bad_history_requests_are_refused_by_field_and_other_tenants_memories_are_not_found(
    tenant_a: TenantClient, tenant_b: TenantClient
) -> None:
    m = _create(tenant_a, "alice waters the office plants on thursdays", external_id="plants")
    assert _fails(lambda: _history(tenant_a, "")) == (grpc.StatusCode.INVALID_ARGUMENT, ["id"])
    assert _fails(lambda: _history(tenant_a, m.id, page_size=100_000)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        ["page_size"],
    )
    assert _fails(lambda: _history(tenant_a, m.id, token="zzz")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        ["page_token"],
    )
    assert _fails(lambda: _history(tenant_a, "no-such-memory"))[0] == grpc.StatusCode.NOT_FOUND
    assert _fails(lambda: _history(tenant_b, m.id))[0] == grpc.StatusCode.NOT_FOUND
    assert _fails(lambda: _history(tenant_b, "external:plants"))[0] == grpc.StatusCode.NOT_FOUND
    assert [e.action for e in _history(tenant_a, m.id).entries] == ["create"]  # nothing changed


def test_the_servers_own_decisions_are_in_the_history_of_pruned_and_purged_memories(
    start_server: Callable[..., LiveServer],
) -> None:
    live = start_server(caps={"semantic": 2}, retention={"interval_s": 0, "tombstone_days": 0})
    client = TenantClient(provision(live, "tenant-a"), live.channel())
    scope = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="p1")
    oldest, _, _ = (
        _create(client, text, scope=scope) for text in ("first note", "second note", "third note")
    )
    assert _entries(client, oldest.id) == [
        ("create", "api", "", {"type": "semantic"}),
        ("prune", "mnemo", "semantic cap 2 reached", {}),
    ]
    # Purged for good (tombstone_days 0): the memory is gone, its history is kept.
    live.server.core.retention.sweep()
    assert (
        _fails(
            lambda: client.memory().GetMemory(
                pb.GetMemoryRequest(id=oldest.id), metadata=client.md, timeout=10
            )
        )[0]
        == grpc.StatusCode.NOT_FOUND
    )
    assert [e.action for e in _history(client, oldest.id).entries] == ["create", "prune"]
