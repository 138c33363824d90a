"""Per-type caps: the oldest unpinned memories of a scope are pruned first (InitRunner)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

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


def _episodic(content: str, scope: common_pb2.Scope) -> pb.CreateMemoryRequest:
    return pb.CreateMemoryRequest(
        memory=memory_pb2.Memory(content=content, type=common_pb2.MEMORY_TYPE_EPISODIC, scope=scope)
    )


def _live_in(t: TenantClient, scope: common_pb2.Scope) -> list[str]:
    listed = (
        t.memory()
        .ListMemories(
            pb.ListMemoriesRequest(filter=memory_pb2.MemoryFilter(scopes=[scope])), metadata=t.md, timeout=5
        )
        .memories
    )
    return sorted(m.content for m in listed)


def test_a_write_answers_with_what_its_caps_pruned(start_server: Callable[..., LiveServer]) -> None:
    live = start_server(caps={"episodic": 3})
    t = TenantClient(provision(live, "capped-writes"), live.channel())
    stub = t.memory()
    scope = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="batch")

    def batch(*contents: str) -> Sequence[pb.CreateMemoryResponse]:
        answers = stub.BatchCreateMemories(
            pb.BatchCreateMemoriesRequest(requests=[_episodic(c, scope) for c in contents]),
            metadata=t.md,
            timeout=10,
        ).results
        for r in answers:  # as GetMemory has it
            stored = stub.GetMemory(pb.GetMemoryRequest(id=r.memory.id), metadata=t.md, timeout=5).memory
            assert (stored.delete_time, stored.update_time) == (r.memory.delete_time, r.memory.update_time)
        return answers

    # The two oldest of the five went at once.
    first = batch("b0", "b1", "b2", "b3", "b4")
    assert [(r.memory.content, r.memory.HasField("delete_time")) for r in first] == [
        ("b0", True),
        ("b1", True),
        ("b2", False),
        ("b3", False),
        ("b4", False),
    ]
    # A duplicate of the scope's oldest memory names it, and the new one beside it prunes it.
    again = batch("b2", "b5")
    assert [(r.memory.content, r.deduplicated, r.memory.HasField("delete_time")) for r in again] == [
        ("b2", True, True),
        ("b5", False, False),
    ]
    assert _live_in(t, scope) == ["b3", "b4", "b5"]


def test_an_import_past_a_cap_prunes_the_oldest_and_keeps_the_counts(
    start_server: Callable[..., LiveServer],
) -> None:
    live = start_server(caps={"episodic": 3})
    source = TenantClient(provision(live, "exporter"), live.channel())
    t = TenantClient(provision(live, "importer"), live.channel())
    scope = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="imported")
    for i in range(6):
        source.memory().CreateMemory(_episodic(f"i{i}", scope), metadata=source.md, timeout=5)
    # The exporter's own cap kept three of the six: exported with their tombstones and made
    # live again, they bring six live memories.
    exported = [
        m
        for r in source.memory().ExportMemories(
            pb.ExportMemoriesRequest(include_deleted=True), metadata=source.md, timeout=10
        )
        for m in r.memories
    ]
    assert len(exported) == 6
    for m in exported:
        m.ClearField("delete_time")
    batches = iter([pb.ImportMemoriesRequest(memories=exported)])
    assert list(t.memory().ImportMemories(batches, metadata=t.md, timeout=10))[-1].imported_count == 6
    assert _live_in(t, scope) == ["i3", "i4", "i5"]
    history = (
        t.memory()
        .GetMemoryHistory(pb.GetMemoryHistoryRequest(id=exported[0].id), metadata=t.md, timeout=5)
        .entries
    )
    assert [e.action for e in history] == ["import", "prune"]
    # The counts the import left are exact: one more create prunes one, the oldest.
    t.memory().CreateMemory(_episodic("i6", scope), metadata=t.md, timeout=5)
    assert _live_in(t, scope) == ["i4", "i5", "i6"]
