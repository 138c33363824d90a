"""MemoryService over gRPC against a real server: create, dedupe, get, list, update, delete."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.protobuf import field_mask_pb2, struct_pb2, timestamp_pb2

from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from tests.conftest import LiveServer, TenantClient, error_info, provision


def _mem(content: str, **kw: object) -> memory_pb2.Memory:
    return memory_pb2.Memory(content=content, **kw)  # type: ignore[arg-type]


def test_create_normalises_and_dedupes(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    first = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=_mem("  The user prefers   dark mode.  ", category="UI Prefs!")),
        metadata=tenant_a.md,
        timeout=10,
    )
    assert not first.deduplicated
    assert first.memory.content == "The user prefers dark mode."
    assert first.memory.category == "ui_prefs_"
    assert first.memory.scope.kind == common_pb2.SCOPE_KIND_WORKSPACE and first.memory.scope.id == "default"
    assert first.memory.type == common_pb2.MEMORY_TYPE_SEMANTIC
    assert first.memory.importance == pytest.approx(0.5)
    assert len(first.memory.content_hash) == 64
    again = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=_mem("the user prefers dark mode")), metadata=tenant_a.md, timeout=10
    )
    assert again.deduplicated and again.memory.id == first.memory.id
    # Same content in another scope is a different memory.
    other = stub.CreateMemory(
        pb.CreateMemoryRequest(
            memory=_mem(
                "the user prefers dark mode",
                scope=common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="p1"),
            )
        ),
        metadata=tenant_a.md,
        timeout=10,
    )
    assert not other.deduplicated and other.memory.id != first.memory.id


def test_get_by_id_and_external_id(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    meta = struct_pb2.Struct()
    meta.update({"source": "unit", "n": 3})
    created = stub.CreateMemory(
        pb.CreateMemoryRequest(
            memory=_mem(
                "Deployed v2.1 to staging",
                external_id="ext-1",
                type=common_pb2.MEMORY_TYPE_EPISODIC,
                importance=0.9,
                metadata=meta,
                event_time=timestamp_pb2.Timestamp(seconds=1_700_000_000),
            )
        ),
        metadata=tenant_a.md,
        timeout=10,
    ).memory
    got = stub.GetMemory(pb.GetMemoryRequest(id=created.id), metadata=tenant_a.md, timeout=10).memory
    assert got == created
    assert got.importance == pytest.approx(0.9)
    assert dict(got.metadata) == {"source": "unit", "n": 3.0}
    assert got.event_time.seconds == 1_700_000_000
    by_ext = stub.GetMemory(pb.GetMemoryRequest(id="external:ext-1"), metadata=tenant_a.md, timeout=10).memory
    assert by_ext.id == created.id
    with pytest.raises(grpc.RpcError) as err:
        stub.GetMemory(
            pb.GetMemoryRequest(id="00000000-0000-0000-0000-000000000000"), metadata=tenant_a.md, timeout=10
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(err.value)[0] == "MEMORY_NOT_FOUND"


def test_external_id_must_be_unique(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    stub.CreateMemory(
        pb.CreateMemoryRequest(memory=_mem("one", external_id="x")), metadata=tenant_a.md, timeout=10
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.CreateMemory(
            pb.CreateMemoryRequest(memory=_mem("two", external_id="x")), metadata=tenant_a.md, timeout=10
        )
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert error_info(err.value)[0] == "EXTERNAL_ID_TAKEN"


def test_list_filters_and_pagination(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    reqs = [
        pb.CreateMemoryRequest(
            memory=_mem(
                f"fact number {i}",
                category="even" if i % 2 == 0 else "odd",
                type=common_pb2.MEMORY_TYPE_SEMANTIC if i < 7 else common_pb2.MEMORY_TYPE_PROCEDURAL,
            )
        )
        for i in range(10)
    ]
    stub.BatchCreateMemories(pb.BatchCreateMemoriesRequest(requests=reqs), metadata=tenant_a.md, timeout=10)
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = stub.ListMemories(
            pb.ListMemoriesRequest(page_size=3, page_token=token), metadata=tenant_a.md, timeout=10
        )
        seen.extend(m.content for m in page.memories)
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert pages == 4
    assert seen == [f"fact number {i}" for i in reversed(range(10))]  # newest first, no repeats
    evens = stub.ListMemories(
        pb.ListMemoriesRequest(filter=memory_pb2.MemoryFilter(categories=["even"])),
        metadata=tenant_a.md,
        timeout=10,
    )
    assert sorted(m.content for m in evens.memories) == sorted(f"fact number {i}" for i in range(0, 10, 2))
    procs = stub.ListMemories(
        pb.ListMemoriesRequest(filter=memory_pb2.MemoryFilter(types=[common_pb2.MEMORY_TYPE_PROCEDURAL])),
        metadata=tenant_a.md,
        timeout=10,
    )
    assert len(procs.memories) == 3
    # A token from one filter cannot be used with another.
    first = stub.ListMemories(pb.ListMemoriesRequest(page_size=2), metadata=tenant_a.md, timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        stub.ListMemories(
            pb.ListMemoriesRequest(
                page_size=2,
                page_token=first.next_page_token,
                filter=memory_pb2.MemoryFilter(categories=["odd"]),
            ),
            metadata=tenant_a.md,
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(err.value)[1] == ["page_token"]


def test_first_pages_by_scope_follow_every_write_and_page_on_into_duckdb(tenant_a: TenantClient) -> None:
    """A first page filtered by scopes alone comes from the in-memory newest-ids lists; it
    must show a delete or a create at once and hand over to DuckDB's pages seamlessly."""
    stub = tenant_a.memory()
    scopes = [common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id=p) for p in ("a", "b")]
    made = [
        stub.CreateMemory(
            pb.CreateMemoryRequest(memory=_mem(f"scoped fact {i}", scope=scopes[i % 2])),
            metadata=tenant_a.md,
            timeout=10,
        ).memory
        for i in range(25)
    ]
    both = memory_pb2.MemoryFilter(scopes=scopes)

    def listed(size: int) -> list[str]:
        ids: list[str] = []
        token = ""
        while True:
            page = stub.ListMemories(
                pb.ListMemoriesRequest(filter=both, page_size=size, page_token=token), metadata=tenant_a.md
            )
            ids += [m.id for m in page.memories]
            if not (token := page.next_page_token):
                return ids

    newest_first = [m.id for m in reversed(made)]
    assert listed(10) == newest_first
    stub.DeleteMemory(pb.DeleteMemoryRequest(id=made[-2].id), metadata=tenant_a.md, timeout=5)
    assert listed(7) == [i for i in newest_first if i != made[-2].id]
    later = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=_mem("a later scoped fact", scope=scopes[1])), metadata=tenant_a.md
    ).memory
    assert listed(30) == [later.id] + [i for i in newest_first if i != made[-2].id]
    use = stub.GetStatus(pb.GetStatusRequest(), metadata=tenant_a.md, timeout=5).cache_use
    assert use.recent_id_scopes >= 2 and use.recent_id_hits >= 1


def test_update_with_field_mask(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    m = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=_mem("original text"), wait_for_index=True),
        metadata=tenant_a.md,
        timeout=30,
    ).memory
    updated = stub.UpdateMemory(
        pb.UpdateMemoryRequest(
            memory=memory_pb2.Memory(
                id=m.id, importance=0.95, pinned=True, category="Ops", content="rewritten text"
            ),
            update_mask=field_mask_pb2.FieldMask(paths=["importance", "pinned", "category", "content"]),
            wait_for_index=True,
        ),
        metadata=tenant_a.md,
        timeout=30,
    ).memory
    assert updated.importance == pytest.approx(0.95) and updated.pinned and updated.category == "ops"
    assert updated.content == "rewritten text" and updated.content_hash != m.content_hash
    assert updated.index_state == memory_pb2.INDEX_STATE_INDEXED
    # Fields not in the mask are untouched.
    assert updated.confidence == pytest.approx(m.confidence)
    hits = stub.Recall(pb.RecallRequest(query="rewritten"), metadata=tenant_a.md, timeout=10).hits
    assert [h.memory.id for h in hits][:1] == [m.id]
    # The new content is what a later create deduplicates to (the old is free again).
    again = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=_mem("Rewritten text.")), metadata=tenant_a.md, timeout=10
    )
    assert again.deduplicated and again.memory.id == m.id
    old = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=_mem("original text")), metadata=tenant_a.md, timeout=10
    )
    assert not old.deduplicated and old.memory.id != m.id
    with pytest.raises(grpc.RpcError) as err:
        stub.UpdateMemory(
            pb.UpdateMemoryRequest(
                memory=memory_pb2.Memory(id=m.id), update_mask=field_mask_pb2.FieldMask(paths=["tenant_id"])
            ),
            metadata=tenant_a.md,
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(err.value)[1] == ["update_mask"]


def test_an_update_waiting_for_the_index_returns_once_its_own_revision_is_searchable(
    tenant_a: TenantClient,
) -> None:
    """An index batch that read the memory before this update indexes the older revision;
    its completion must not end the wait (found by probing: the wait returned PENDING in 27
    of 30 rounds)."""
    stub = tenant_a.memory()
    m = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=_mem("first draft"), wait_for_index=True),
        metadata=tenant_a.md,
        timeout=30,
    ).memory

    def update(content: str, wait: bool) -> memory_pb2.Memory:
        req = pb.UpdateMemoryRequest(
            memory=memory_pb2.Memory(id=m.id, content=content),
            update_mask=field_mask_pb2.FieldMask(paths=["content"]),
            wait_for_index=wait,
        )
        memory: memory_pb2.Memory = stub.UpdateMemory(req, metadata=tenant_a.md, timeout=30).memory
        return memory

    text_only = pb.RecallOptions(disabled_stages=[pb.RECALL_STAGE_VECTOR])
    for n in range(12):
        update(f"interim wording zqa{n}", False)  # the worker picks this revision up...
        done = update(f"final wording zqb{n}", True)  # ...while this one waits
        assert done.index_state == memory_pb2.INDEX_STATE_INDEXED, n
        hits = stub.Recall(
            pb.RecallRequest(query=f"zqb{n}", options=text_only), metadata=tenant_a.md, timeout=10
        ).hits
        assert [h.memory.id for h in hits if h.scores.text_rank > 0] == [m.id], n


def test_concurrent_updates_each_answer_with_their_own_write_in_time_order(tenant_a: TenantClient) -> None:
    """Six callers set one memory's category at once: each answer shows its own write (not a
    read after the commit, which could show another's), and the times follow the order the
    writes took the lock, so the one left standing is the newest."""
    stub = tenant_a.memory()
    m = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=_mem("shared knob")), metadata=tenant_a.md, timeout=10
    ).memory

    def set_category(name: str) -> memory_pb2.Memory:
        req = pb.UpdateMemoryRequest(
            memory=memory_pb2.Memory(id=m.id, category=name),
            update_mask=field_mask_pb2.FieldMask(paths=["category"]),
        )
        memory: memory_pb2.Memory = stub.UpdateMemory(req, metadata=tenant_a.md, timeout=30).memory
        return memory

    with ThreadPoolExecutor(6) as pool:
        for n in range(8):
            names = [f"writer{n}x{w}" for w in range(6)]
            answers = list(pool.map(set_category, names))
            assert [a.category for a in answers] == names, n
            final = stub.GetMemory(pb.GetMemoryRequest(id=m.id), metadata=tenant_a.md, timeout=5).memory
            newest = max(answers, key=lambda a: (a.update_time.seconds, a.update_time.nanos))
            assert final.category == newest.category, n


def test_delete_hides_at_once(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    m = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=_mem("ephemeral secret plan"), wait_for_index=True),
        metadata=tenant_a.md,
        timeout=30,
    ).memory
    assert stub.Recall(pb.RecallRequest(query="ephemeral secret plan"), metadata=tenant_a.md, timeout=10).hits
    deleted = stub.DeleteMemory(pb.DeleteMemoryRequest(id=m.id), metadata=tenant_a.md, timeout=10).memory
    assert deleted.HasField("delete_time")
    # Hidden immediately, whatever the index worker has done so far.
    assert not stub.Recall(
        pb.RecallRequest(query="ephemeral secret plan"), metadata=tenant_a.md, timeout=10
    ).hits
    assert not stub.ListMemories(pb.ListMemoriesRequest(), metadata=tenant_a.md, timeout=10).memories
    shown = stub.ListMemories(pb.ListMemoriesRequest(show_deleted=True), metadata=tenant_a.md, timeout=10)
    assert [x.id for x in shown.memories] == [m.id]
    with pytest.raises(grpc.RpcError) as err:
        stub.DeleteMemory(pb.DeleteMemoryRequest(id=m.id), metadata=tenant_a.md, timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_external_ids_name_distinct_memories_with_equal_content(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    reqs = [
        pb.CreateMemoryRequest(memory=_mem("Thanks!", external_id="turn-1")),
        pb.CreateMemoryRequest(memory=_mem("thanks", external_id="turn-2")),
        pb.CreateMemoryRequest(memory=_mem("thanks!")),  # no name: deduplicated by content
    ]
    res = stub.BatchCreateMemories(
        pb.BatchCreateMemoriesRequest(requests=reqs), metadata=tenant_a.md, timeout=10
    )
    ids = [r.memory.id for r in res.results]
    assert [r.deduplicated for r in res.results] == [False, False, True]
    assert ids[0] != ids[1] and ids[2] == ids[0]
    repeat = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=_mem("Thanks!", external_id="turn-1")), metadata=tenant_a.md, timeout=10
    )
    assert repeat.deduplicated and repeat.memory.id == ids[0]
    with pytest.raises(grpc.RpcError) as err:
        stub.CreateMemory(
            pb.CreateMemoryRequest(memory=_mem("other text", external_id="turn-2")),
            metadata=tenant_a.md,
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    # An update follows the same rules: a named memory may take content another holds...
    third = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=_mem("you're welcome", external_id="turn-3")),
        metadata=tenant_a.md,
        timeout=10,
    ).memory
    mask = field_mask_pb2.FieldMask(paths=["content"])
    updated = stub.UpdateMemory(
        pb.UpdateMemoryRequest(memory=memory_pb2.Memory(id=third.id, content="thanks!"), update_mask=mask),
        metadata=tenant_a.md,
        timeout=10,
    ).memory
    assert updated.content == "thanks!" and updated.external_id == "turn-3"
    # ...and an unnamed one may not (a create of it would have returned the other).
    plain = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=_mem("no thanks")), metadata=tenant_a.md, timeout=10
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.UpdateMemory(
            pb.UpdateMemoryRequest(
                memory=memory_pb2.Memory(id=plain.memory.id, content="Thanks"), update_mask=mask
            ),
            metadata=tenant_a.md,
            timeout=10,
        )
    assert (
        err.value.code() == grpc.StatusCode.ALREADY_EXISTS and error_info(err.value)[0] == "DUPLICATE_CONTENT"
    )


def test_concurrent_creates_are_each_written_once_and_counted(tenant_a: TenantClient) -> None:
    """Creates sent at once may share a transaction (group commit): each call is answered
    as if alone, equal content dedups to one memory, a taken external id fails only its
    own call, and GetStatus counts every call and the transactions they took."""
    stub = tenant_a.memory()
    status = stub.GetStatus(pb.GetStatusRequest(), metadata=tenant_a.md, timeout=10)
    before, cpu_before = status.create_group_commit, status.process_cpu_seconds
    stub.CreateMemory(
        pb.CreateMemoryRequest(memory=_mem("owned text", external_id="owned")),
        metadata=tenant_a.md,
        timeout=10,
    )
    requests = [_mem(f"parallel fact {i}") for i in range(12)]
    requests += [_mem("said twice at once"), _mem("said twice at once")]
    requests.append(_mem("other text", external_id="owned"))

    def create(m: memory_pb2.Memory) -> pb.CreateMemoryResponse | grpc.RpcError:
        try:
            return stub.CreateMemory(pb.CreateMemoryRequest(memory=m), metadata=tenant_a.md, timeout=10)
        except grpc.RpcError as err:
            return err

    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(create, requests))
    created = [a for a in answers[:12] if isinstance(a, pb.CreateMemoryResponse)]
    assert len(created) == 12 and not any(a.deduplicated for a in created)
    assert sorted(a.memory.content for a in created) == sorted(m.content for m in requests[:12])
    twice = [a for a in answers[12:14] if isinstance(a, pb.CreateMemoryResponse)]
    assert len(twice) == 2 and twice[0].memory.id == twice[1].memory.id
    assert sorted(a.deduplicated for a in twice) == [False, True]
    taken = answers[14]
    assert isinstance(taken, grpc.RpcError) and taken.code() == grpc.StatusCode.ALREADY_EXISTS
    assert error_info(taken)[0] == "EXTERNAL_ID_TAKEN"
    listed = stub.ListMemories(pb.ListMemoriesRequest(page_size=100), metadata=tenant_a.md, timeout=10)
    contents = [m.content for m in listed.memories]
    assert contents.count("said twice at once") == 1 and "other text" not in contents
    status = stub.GetStatus(pb.GetStatusRequest(), metadata=tenant_a.md, timeout=10)
    after = status.create_group_commit
    calls, groups = after.calls - before.calls, after.groups - before.groups
    assert calls == 1 + len(requests), (before, after)
    assert 1 <= groups <= calls and 1 <= after.largest_group <= calls
    # The server's CPU since it started grows with the work it did (the bench reads it).
    assert 0 < cpu_before < status.process_cpu_seconds


def test_fields_named_in_the_mask_and_left_unset_take_the_create_defaults(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    m = stub.CreateMemory(
        pb.CreateMemoryRequest(
            memory=_mem(
                "the offsite moved to May",
                importance=0.9,
                confidence=0.4,
                event_time=timestamp_pb2.Timestamp(seconds=1_600_000_000),
            )
        ),
        metadata=tenant_a.md,
        timeout=10,
    ).memory
    reset = stub.UpdateMemory(
        pb.UpdateMemoryRequest(
            memory=memory_pb2.Memory(id=m.id),
            update_mask=field_mask_pb2.FieldMask(paths=["importance", "confidence", "event_time"]),
        ),
        metadata=tenant_a.md,
        timeout=10,
    ).memory
    assert reset.importance == pytest.approx(0.5) and reset.confidence == pytest.approx(1.0)
    # CreateMemory dates a memory sent without an event time at its creation.
    assert reset.event_time == m.create_time and reset.event_time.seconds != 1_600_000_000


def test_a_category_filter_matches_as_categories_are_stored(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    m = stub.CreateMemory(
        pb.CreateMemoryRequest(
            memory=_mem("rotate the on-call pager weekly", category="On-Call"), wait_for_index=True
        ),
        metadata=tenant_a.md,
        timeout=30,
    ).memory
    assert m.category == "on_call"
    for asked in ("On-Call", "ON_CALL", "on_call"):
        f = memory_pb2.MemoryFilter(categories=[asked])
        listed = stub.ListMemories(pb.ListMemoriesRequest(filter=f), metadata=tenant_a.md, timeout=5).memories
        assert [x.id for x in listed] == [m.id], asked
        hits = stub.Recall(pb.RecallRequest(query="pager", filter=f), metadata=tenant_a.md, timeout=10).hits
        assert [h.memory.id for h in hits] == [m.id], asked


def test_a_scope_named_twice_in_a_filter_lists_each_memory_once(tenant_a: TenantClient) -> None:
    """The workspace as "" and as "default" (or any scope twice): ListMemories' first page,
    read from each scope's newest ids, held each memory once per naming (probe: 8 entries
    for 6 memories)."""
    stub = tenant_a.memory()
    for i in range(6):
        stub.CreateMemory(
            pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"note number {i}")),
            metadata=tenant_a.md,
            timeout=10,
        )
    workspace = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_WORKSPACE)
    named = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_WORKSPACE, id="default")
    for scopes in ([workspace, workspace], [workspace, named]):
        listed, token = [], ""
        while True:
            page = stub.ListMemories(
                pb.ListMemoriesRequest(
                    filter=memory_pb2.MemoryFilter(scopes=scopes), page_size=4, page_token=token
                ),
                metadata=tenant_a.md,
                timeout=10,
            )
            listed += [m.content for m in page.memories]
            if not (token := page.next_page_token):
                break
        assert sorted(listed) == [f"note number {i}" for i in range(6)]


def test_calls_waiting_for_the_index_do_not_hold_an_orderly_stop_past_its_grace(
    start_server: Callable[..., LiveServer],
) -> None:
    """CreateMemory with wait_for_index waited up to index.max_wait_for_index_s (30 s) when
    the server stopped, whatever server.shutdown_grace_s said (shutdown probe: a stop with
    a 3 s grace took 30 s). Past the grace, such waits end."""
    live = start_server()
    t = TenantClient(provision(live, "t"), live.channel())
    assert live.server.core.indexer.stop()  # nothing gets indexed: the creates wait
    answers: list[object] = []

    def create(i: int) -> None:
        try:
            answers.append(
                t.memory().CreateMemory(
                    pb.CreateMemoryRequest(
                        memory=memory_pb2.Memory(content=f"waits for the index {i}"), wait_for_index=True
                    ),
                    metadata=t.md,
                    timeout=60,
                )
            )
        except grpc.RpcError as err:
            answers.append(err.code())

    callers = [threading.Thread(target=create, args=(i,)) for i in range(3)]
    for c in callers:
        c.start()
    time.sleep(1.0)  # the three are written and waiting
    started = time.monotonic()
    live.server.stop(grace_s=0.5)
    took = time.monotonic() - started
    for c in callers:
        c.join(10)
    # The grace, gRPC's second, and the handlers returning: no 5 s wait for them to let go
    # (after which the stores were closed under them, and the process could not exit).
    assert took < 4.0, took
    assert len(answers) == 3
