"""Export is everything needed to restore; import of an export round-trips exactly."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import grpc
import pytest
from google.protobuf import json_format, struct_pb2, timestamp_pb2

from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo_server.store import index_marks
from tests.conftest import LiveServer, TenantClient, error_info, provision


def _export(t: TenantClient, include_deleted: bool = True) -> list[memory_pb2.Memory]:
    responses = list(
        t.memory().ExportMemories(
            pb.ExportMemoriesRequest(include_deleted=include_deleted), metadata=t.md, timeout=30
        )
    )
    assert responses[-1].exported_count == responses[-1].total_count
    return [m for r in responses for m in r.memories]


def _wait_indexed(t: TenantClient) -> None:
    deadline = time.monotonic() + 30
    while t.memory().GetStatus(pb.GetStatusRequest(), metadata=t.md, timeout=5).pending_index_count:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _seed(t: TenantClient) -> None:
    stub = t.memory()
    meta = struct_pb2.Struct()
    meta.update({"trigger": "cron", "tags": ["a", "b"], "nested": {"k": 1}})
    reqs = []
    for i in range(1203):  # more than two export batches
        m = memory_pb2.Memory(
            content=f"memory {i}: the deploy of service {i % 7} {'failed' if i % 3 else 'worked'}",
            type=(
                common_pb2.MEMORY_TYPE_EPISODIC,
                common_pb2.MEMORY_TYPE_SEMANTIC,
                common_pb2.MEMORY_TYPE_PROCEDURAL,
            )[i % 3],
            category=f"cat{i % 4}",
            importance=(i % 10) / 10,
            pinned=i % 50 == 0,
            scope=common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id=f"p{i % 3}"),
            source=common_pb2.Source(who="agent", why="test", run_id=f"run{i}", session_id=f"s{i % 5}"),
            # The epoch is a time like any other (one memory has it).
            event_time=timestamp_pb2.Timestamp(seconds=1_600_000_000 + i, nanos=123_456_789)
            if i != 7
            else timestamp_pb2.Timestamp(),
            external_id=f"ext-{i}" if i % 2 else "",
        )
        if i % 10 == 0:
            m.metadata.CopyFrom(meta)
        reqs.append(pb.CreateMemoryRequest(memory=m))
    for start in range(0, len(reqs), 500):
        stub.BatchCreateMemories(
            pb.BatchCreateMemoriesRequest(requests=reqs[start : start + 500]), metadata=t.md, timeout=30
        )
    victims = stub.ListMemories(pb.ListMemoriesRequest(page_size=5), metadata=t.md, timeout=5).memories
    for v in victims:
        stub.DeleteMemory(pb.DeleteMemoryRequest(id=v.id), metadata=t.md, timeout=5)


def test_round_trip_into_another_tenant_is_exact(tenant_a: TenantClient, tenant_b: TenantClient) -> None:
    _seed(tenant_a)
    _wait_indexed(tenant_a)
    original = _export(tenant_a)
    assert len(original) == 1203 and sum(m.HasField("delete_time") for m in original) == 5
    # Through JSON, as the CLI writes it.
    lines = [json_format.MessageToJson(m, preserving_proto_field_name=True, indent=None) for m in original]
    parsed = [json_format.Parse(line, memory_pb2.Memory()) for line in lines]
    batches = [parsed[i : i + 300] for i in range(0, len(parsed), 300)]
    progress = list(
        tenant_b.memory().ImportMemories(
            iter(pb.ImportMemoriesRequest(memories=b) for b in batches), metadata=tenant_b.md, timeout=60
        )
    )
    assert [p.received_count for p in progress] == [300, 600, 900, 1200, 1203]
    assert progress[-1].imported_count == 1203 and progress[-1].skipped_count == 0
    _wait_indexed(tenant_b)
    restored = _export(tenant_b)
    assert restored == original
    # Restored memories are searchable like the originals.
    hit = (
        tenant_b.memory()
        .Recall(pb.RecallRequest(query="deploy of service 3 worked"), metadata=tenant_b.md, timeout=10)
        .hits
    )
    assert hit and "service 3 worked" in hit[0].memory.content


def test_reimport_is_skipped_and_clear_then_import_restores(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    for i in range(3):
        stub.CreateMemory(
            pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"keep {i}")),
            metadata=tenant_a.md,
            timeout=5,
        )
    _wait_indexed(tenant_a)
    before = _export(tenant_a, include_deleted=False)
    again = list(
        stub.ImportMemories(
            iter([pb.ImportMemoriesRequest(memories=before)]), metadata=tenant_a.md, timeout=10
        )
    )
    assert again[-1].imported_count == 0 and again[-1].skipped_count == 3
    assert (
        stub.PurgeMemories(
            pb.PurgeMemoriesRequest(all_memories=True, force=True), metadata=tenant_a.md, timeout=5
        ).purge_count
        == 3
    )
    assert _export(tenant_a, include_deleted=False) == []
    back = list(
        stub.ImportMemories(
            iter([pb.ImportMemoriesRequest(memories=before)]), metadata=tenant_a.md, timeout=10
        )
    )
    assert back[-1].imported_count == 3
    _wait_indexed(tenant_a)
    assert _export(tenant_a, include_deleted=False) == before


def test_an_import_restores_a_tombstoned_id_unless_its_content_lives_on_elsewhere(
    tenant_a: TenantClient,
) -> None:
    stub = tenant_a.memory()

    def create(content: str) -> memory_pb2.Memory:
        m: memory_pb2.Memory = stub.CreateMemory(
            pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=content)), metadata=tenant_a.md, timeout=5
        ).memory
        return m

    def import_one(m: memory_pb2.Memory) -> tuple[int, int]:
        batches = iter([pb.ImportMemoriesRequest(memories=[m])])
        done = list(stub.ImportMemories(batches, metadata=tenant_a.md, timeout=10))
        return done[-1].imported_count, done[-1].skipped_count

    def get(memory_id: str) -> memory_pb2.Memory:
        m: memory_pb2.Memory = stub.GetMemory(
            pb.GetMemoryRequest(id=memory_id), metadata=tenant_a.md, timeout=5
        ).memory
        return m

    restored = create("the VPN config lives in the wiki")
    [snapshot] = [m for m in _export(tenant_a) if m.id == restored.id]
    stub.DeleteMemory(pb.DeleteMemoryRequest(id=restored.id), metadata=tenant_a.md, timeout=5)
    assert import_one(snapshot) == (1, 0)  # a tombstone gives way to its export
    assert not get(restored.id).HasField("delete_time")

    kept = create("standup moved to 9:30")
    [snapshot] = [m for m in _export(tenant_a) if m.id == kept.id]
    stub.DeleteMemory(pb.DeleteMemoryRequest(id=kept.id), metadata=tenant_a.md, timeout=5)
    again = create("Standup moved to 9:30.")  # the same content, live under a new id
    assert again.id != kept.id
    assert import_one(snapshot) == (0, 1)
    # Skipped for its content: the tombstone and its history are still there.
    assert get(kept.id).HasField("delete_time")
    history = stub.GetMemoryHistory(
        pb.GetMemoryHistoryRequest(id=kept.id), metadata=tenant_a.md, timeout=5
    ).entries
    assert [e.action for e in history] == ["create", "delete"]


def test_one_import_message_keeps_one_of_its_entries_with_the_same_content(tenant_a: TenantClient) -> None:
    """Entries of one message are checked against each other, as a batch create's are: three
    unnamed entries with the same content in a scope were all imported (live duplicates no
    other write makes), while one per message imported one."""
    stub = tenant_a.memory()
    when = timestamp_pb2.Timestamp(seconds=1_700_000_000)
    project = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="p1")
    same = ["Ship the release on Friday", "ship the release on friday.", "Ship  the release on Friday!"]
    entries = [memory_pb2.Memory(id=str(uuid.uuid4()), content=c, create_time=when) for c in same]
    entries.append(memory_pb2.Memory(id=str(uuid.uuid4()), content=same[0], create_time=when, scope=project))
    done = list(
        stub.ImportMemories(
            iter([pb.ImportMemoriesRequest(memories=entries)]), metadata=tenant_a.md, timeout=10
        )
    )
    assert (done[-1].imported_count, done[-1].skipped_count) == (2, 2)
    live = _export(tenant_a, include_deleted=False)
    assert sorted(m.id for m in live) == sorted([entries[0].id, entries[3].id])


def test_one_id_twice_in_a_message_is_refused_and_a_time_before_1970_is_taken(tenant_a: TenantClient) -> None:
    """The same id twice in one message stored a memory neither entry described (the first
    one's fields, the second one's content): now INVALID_ARGUMENT on the repeat, nothing
    written. And a create_time before 1970, within the documented range, was refused as
    "is required"; only an unset one is."""
    stub = tenant_a.memory()
    when = timestamp_pb2.Timestamp(seconds=1_700_000_000)
    twice = str(uuid.uuid4())
    entries = [
        memory_pb2.Memory(id=twice, content="first text", category="one", create_time=when),
        memory_pb2.Memory(id=twice, content="second text", category="two", create_time=when),
    ]
    with pytest.raises(grpc.RpcError) as err:
        list(
            stub.ImportMemories(
                iter([pb.ImportMemoriesRequest(memories=entries)]), metadata=tenant_a.md, timeout=10
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(err.value)[1] == ["messages[0].memories[1].id"]
    assert _export(tenant_a) == []
    unset = memory_pb2.Memory(id=str(uuid.uuid4()), content="when was this?")
    with pytest.raises(grpc.RpcError) as err:
        list(
            stub.ImportMemories(
                iter([pb.ImportMemoriesRequest(memories=[unset])]), metadata=tenant_a.md, timeout=10
            )
        )
    assert error_info(err.value)[1] == ["messages[0].memories[0].create_time"]
    old = memory_pb2.Memory(
        id=str(uuid.uuid4()),
        content="the moon landing",
        create_time=timestamp_pb2.Timestamp(seconds=-14_182_940),
    )
    list(
        stub.ImportMemories(
            iter([pb.ImportMemoriesRequest(memories=[old])]), metadata=tenant_a.md, timeout=10
        )
    )
    [back] = _export(tenant_a)
    assert back.create_time.seconds == -14_182_940 and back.content == "the moon landing"


def test_streamed_calls_past_max_streams_are_refused_and_leave_workers_for_the_rest(
    start_server: Callable[..., LiveServer], caplog: pytest.LogCaptureFixture
) -> None:
    """Each export or import holds a worker thread while its client reads or sends; past
    server.max_streams (or a tenant's share of them) they are RESOURCE_EXHAUSTED, so unary
    calls keep their workers (36 slow export readers took all 32, GetStatus and the health
    check included) and other tenants their streams. A client stream cancelled half way is
    no incident in the log."""
    live = start_server(server={"max_workers": 5, "max_streams": 3, "max_streams_per_tenant": 2})
    t = TenantClient(provision(live, "tenant-a"), live.channel())
    other = TenantClient(provision(live, "tenant-b"), live.channel())
    stub = t.memory()
    reqs = [
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"note {i} {'x' * 400}")) for i in range(500)
    ]
    for _ in range(4):  # 2,000 memories: four export messages of 500, more than the window holds
        stub.BatchCreateMemories(pb.BatchCreateMemoriesRequest(requests=reqs), metadata=t.md, timeout=30)
        reqs = [
            pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=r.memory.content + " more")) for r in reqs
        ]
    held = [stub.ExportMemories(pb.ExportMemoriesRequest(), metadata=t.md, timeout=60) for _ in range(2)]
    for call in held:
        next(call)  # started, and read no further: its worker waits for the client
    with pytest.raises(grpc.RpcError) as err:
        list(stub.ExportMemories(pb.ExportMemoriesRequest(), metadata=t.md, timeout=10))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(err.value)[0] == "TOO_MANY_STREAMS" and "server.max_streams" in err.value.details()
    # Another tenant still has a stream of its own: one tenant's cannot take them all.
    assert list(other.memory().ExportMemories(pb.ExportMemoriesRequest(), metadata=other.md, timeout=10))
    for _ in range(5):  # the two workers left answer unary calls
        assert stub.GetStatus(pb.GetStatusRequest(), metadata=t.md, timeout=5).memory_count == 2_000
    held[0].cancel()
    deadline = time.monotonic() + 10
    codes, exported = [], 0
    while time.monotonic() < deadline:  # its slot comes back once its handler sees the cancel
        try:
            export = stub.ExportMemories(pb.ExportMemoriesRequest(), metadata=t.md, timeout=30)
            exported = sum(len(r.memories) for r in export)
            break
        except grpc.RpcError as again:
            codes.append(again.code())
            time.sleep(0.1)
    assert exported == 2_000 and set(codes) <= {grpc.StatusCode.RESOURCE_EXHAUSTED}
    held[1].cancel()

    sent = threading.Event()

    def batches() -> Iterator[pb.ImportMemoriesRequest]:
        yield pb.ImportMemoriesRequest(
            memories=[
                memory_pb2.Memory(
                    id=str(uuid.uuid4()), content="kept", create_time=timestamp_pb2.Timestamp(seconds=1)
                )
            ]
        )
        sent.set()
        time.sleep(30)  # the client cancels while the server waits for the next message

    with caplog.at_level(logging.DEBUG, logger="mnemo_server"):
        call = stub.ImportMemories(batches(), metadata=t.md, timeout=60)
        assert sent.wait(10)
        time.sleep(0.5)
        call.cancel()
        time.sleep(1.0)
    incidents = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert incidents == [], [r.getMessage() for r in incidents]


def test_a_restored_memory_is_not_marked_indexed_by_its_deleted_texts_indexing(
    server: LiveServer, tenant_a: TenantClient
) -> None:
    """The index worker marks a row indexed by (id, revision) once LanceDB holds the text
    it read. A restore numbered revision 1 took the mark of the deleted text's indexing,
    still under way, so it showed INDEXED while LanceDB held the old text, and never became
    findable (probe: 7 of 40 restores)."""
    stub = tenant_a.memory()
    core = server.server.core
    assert core.indexer.stop()  # what the worker does is played by hand below
    old = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="the backup runs at noon")),
        metadata=tenant_a.md,
        timeout=5,
    ).memory
    stub.DeleteMemory(pb.DeleteMemoryRequest(id=old.id), metadata=tenant_a.md, timeout=5)
    restored = memory_pb2.Memory(id=old.id, content="the backup runs at midnight")
    restored.create_time.CopyFrom(old.create_time)
    done = list(
        stub.ImportMemories(iter([pb.ImportMemoriesRequest(memories=[restored])]), metadata=tenant_a.md)
    )
    assert done[-1].imported_count == 1
    # The worker, done with the text it read before the delete, marks revision 1.
    with core.db.transaction() as cur:
        index_marks.mark_indexed(cur, [("tenant-a", old.id, 1)], core.memories.embedding_model)
    got = stub.GetMemory(pb.GetMemoryRequest(id=old.id), metadata=tenant_a.md, timeout=5).memory
    assert got.content == "the backup runs at midnight"
    assert got.index_state == memory_pb2.INDEX_STATE_PENDING


def test_an_export_holds_what_was_stored_when_it_started(tenant_a: TenantClient) -> None:
    """Memories restored by an import while an export runs are numbered anew; read with no
    upper bound, the export sent them twice (as tombstones, then restored), and its file
    could not be imported again (probe)."""
    stub = tenant_a.memory()
    # The export reads 500 rows at a time and sends ~160 of these a message: more rows are
    # read after the import below.
    big = "x" * 19_000
    ids = []
    for start in range(0, 600, 100):  # answers a default client takes
        batch = pb.BatchCreateMemoriesRequest(
            requests=[
                pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"{i} {big}"))
                for i in range(start, start + 100)
            ]
        )
        ids += [
            r.memory.id for r in stub.BatchCreateMemories(batch, metadata=tenant_a.md, timeout=60).results
        ]
    first_half = _export(tenant_a)[:50]
    for m in first_half:
        stub.DeleteMemory(pb.DeleteMemoryRequest(id=m.id), metadata=tenant_a.md, timeout=5)
    stream = stub.ExportMemories(
        pb.ExportMemoriesRequest(include_deleted=True), metadata=tenant_a.md, timeout=60
    )
    parts = [next(stream)]
    assert parts[0].exported_count < len(ids)  # more messages follow
    done = list(
        stub.ImportMemories(iter([pb.ImportMemoriesRequest(memories=first_half)]), metadata=tenant_a.md)
    )
    assert done[-1].imported_count == 50
    parts += list(stream)
    exported = [m.id for p in parts for m in p.memories]
    assert len(exported) == len(set(exported)) == len(ids)
    assert parts[-1].exported_count == parts[-1].total_count == len(ids)
