"""Per-type caps: the oldest unpinned memories of a scope are pruned first (InitRunner)."""

from __future__ import annotations

from collections.abc import Callable

from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from tests.conftest import LiveServer, TenantClient, provision


def test_oldest_unpinned_are_pruned_per_scope_and_type(start_server: Callable[..., LiveServer]) -> None:
    live = start_server(caps={"semantic": 3, "episodic": 2})
    t = TenantClient(provision(live, "capped"), live.channel())
    stub = t.memory()

    def add(content: str, **kw: object) -> memory_pb2.Memory:
        m: memory_pb2.Memory = stub.CreateMemory(
            pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=content, **kw)), metadata=t.md, timeout=5
        ).memory  # type: ignore[arg-type]
        return m

    add("s0 pinned", pinned=True)
    for i in range(1, 5):
        add(f"s{i}")
    add("e0", type=common_pb2.MEMORY_TYPE_EPISODIC)
    add("e1", type=common_pb2.MEMORY_TYPE_EPISODIC)
    other_scope = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="elsewhere")
    add("x0", scope=other_scope)
    live_contents = {
        m.content for m in stub.ListMemories(pb.ListMemoriesRequest(), metadata=t.md, timeout=5).memories
    }
    # semantic cap 3 in the workspace scope: pinned s0 kept, s1 and s2 (oldest) pruned.
    assert live_contents == {"s0 pinned", "s3", "s4", "e0", "e1", "x0"}
    deleted = [
        m
        for m in stub.ListMemories(
            pb.ListMemoriesRequest(show_deleted=True), metadata=t.md, timeout=5
        ).memories
        if m.HasField("delete_time")
    ]
    assert sorted(m.content for m in deleted) == ["s1", "s2"]
    add("e2", type=common_pb2.MEMORY_TYPE_EPISODIC)
    episodic = stub.ListMemories(
        pb.ListMemoriesRequest(filter=memory_pb2.MemoryFilter(types=[common_pb2.MEMORY_TYPE_EPISODIC])),
        metadata=t.md,
        timeout=5,
    ).memories
    assert [m.content for m in episodic] == ["e2", "e1"]
