"""Bad input: INVALID_ARGUMENT naming the field, and nothing written."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from google.protobuf import field_mask_pb2, struct_pb2, timestamp_pb2

from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from tests.conftest import TenantClient, error_info

M = memory_pb2.Memory
PROJECT = common_pb2.SCOPE_KIND_PROJECT


def _big_metadata() -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update({"blob": "x" * 20_000})
    return s


def _metadata(value: object) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update({"k": value})
    return s


def _nested(levels: int) -> struct_pb2.Struct:
    """Metadata with `levels` objects one inside the other."""
    value: object = "leaf"
    for _ in range(levels - 1):
        value = {"k": value}
    return _metadata(value)


def _at(seconds: int, nanos: int = 0) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)


def _listed_from(start: timestamp_pb2.Timestamp) -> Callable[[object], object]:
    return lambda s: s.ListMemories(  # type: ignore[attr-defined]
        pb.ListMemoriesRequest(
            filter=memory_pb2.MemoryFilter(create_time=common_pb2.TimeRange(start_time=start))
        )
    )


def _create(memory: memory_pb2.Memory, **kw: object) -> Callable[[object], object]:
    return lambda stub: stub.CreateMemory(pb.CreateMemoryRequest(memory=memory, **kw))  # type: ignore[arg-type]


CASES: list[tuple[str, Callable[[object], object], list[str]]] = [
    ("empty content", _create(M(content="")), ["memory.content"]),
    ("whitespace content", _create(M(content=" \n\t ")), ["memory.content"]),
    ("content too long", _create(M(content="x" * 20_001)), ["memory.content"]),
    ("importance > 1", _create(M(content="ok", importance=1.5)), ["memory.importance"]),
    ("confidence < 0", _create(M(content="ok", confidence=-0.1)), ["memory.confidence"]),
    ("scope without kind", _create(M(content="ok", scope=common_pb2.Scope(id="p"))), ["memory.scope.kind"]),
    (
        "project scope without id",
        _create(M(content="ok", scope=common_pb2.Scope(kind=PROJECT))),
        ["memory.scope.id"],
    ),
    (
        "unknown scope kind",
        _create(M(content="ok", scope=common_pb2.Scope(kind=99, id="x"))),  # type: ignore[arg-type]
        ["memory.scope.kind"],
    ),
    ("unknown type", _create(M(content="ok", type=42)), ["memory.type"]),  # type: ignore[arg-type]
    ("external id with spaces", _create(M(content="ok", external_id="a b")), ["memory.external_id"]),
    ("metadata too large", _create(M(content="ok", metadata=_big_metadata())), ["memory.metadata"]),
    ("bad request id", _create(M(content="ok"), request_id="has spaces"), ["request_id"]),
    ("NaN in metadata", _create(M(content="ok", metadata=_metadata(float("nan")))), ["memory.metadata"]),
    (
        "infinity in metadata",
        _create(M(content="ok", metadata=_metadata(float("-inf")))),
        ["memory.metadata"],
    ),
    ("metadata nested 17 deep", _create(M(content="ok", metadata=_nested(17))), ["memory.metadata"]),
    ("event time in year 1", _create(M(content="ok", event_time=_at(-62135596800))), ["memory.event_time"]),
    ("event time in 2286", _create(M(content="ok", event_time=_at(10_000_000_000))), ["memory.event_time"]),
    ("negative nanos", _create(M(content="ok", event_time=_at(1_700_000_000, -1))), ["memory.event_time"]),
    ("filter time past 2262", _listed_from(_at(2**62)), ["filter.create_time.start_time"]),
    ("filter nanos of 2 s", _listed_from(_at(1, 2_000_000_000)), ["filter.create_time.start_time"]),
    (
        "update with NaN metadata",
        lambda s: s.UpdateMemory(  # type: ignore[attr-defined]
            pb.UpdateMemoryRequest(
                memory=M(id="00000000-0000-0000-0000-000000000000", metadata=_metadata(float("nan"))),
                update_mask=field_mask_pb2.FieldMask(paths=["metadata"]),
            )
        ),
        ["memory.metadata"],
    ),
    (
        "batch too large",
        lambda s: s.BatchCreateMemories(
            pb.BatchCreateMemoriesRequest(  # type: ignore[attr-defined]
                requests=[pb.CreateMemoryRequest(memory=M(content=f"m{i}")) for i in range(501)]
            )
        ),
        ["requests"],
    ),
    (
        "empty batch",
        lambda s: s.BatchCreateMemories(pb.BatchCreateMemoriesRequest()),  # type: ignore[attr-defined]
        ["requests"],
    ),
    (
        "bad entries fail the whole batch, each named",
        lambda s: s.BatchCreateMemories(  # type: ignore[attr-defined]
            pb.BatchCreateMemoriesRequest(
                requests=[
                    pb.CreateMemoryRequest(memory=M(content="")),
                    pb.CreateMemoryRequest(memory=M(content="fine")),
                    pb.CreateMemoryRequest(memory=M(content="too important", importance=5)),
                    pb.CreateMemoryRequest(memory=M(content="x", external_id="e")),
                    pb.CreateMemoryRequest(memory=M(content="y", external_id="e")),
                ]
            )
        ),
        ["requests[0].memory.content", "requests[2].memory.importance", "requests[4].memory.external_id"],
    ),
    ("recall without query", lambda s: s.Recall(pb.RecallRequest(query="  ")), ["query"]),  # type: ignore[attr-defined]
    (
        "recall query too long",
        lambda s: s.Recall(pb.RecallRequest(query="q" * 4001)),  # type: ignore[attr-defined]
        ["query"],
    ),
    ("top_k too large", lambda s: s.Recall(pb.RecallRequest(query="q", top_k=101)), ["top_k"]),  # type: ignore[attr-defined]
    (
        "unknown stage",
        lambda s: s.Recall(
            pb.RecallRequest(  # type: ignore[attr-defined]
                query="q", options=pb.RecallOptions(disabled_stages=[77])
            )
        ),
        ["options.disabled_stages[0]"],
    ),  # type: ignore[list-item]
    (
        "page_size too large",
        lambda s: s.ListMemories(pb.ListMemoriesRequest(page_size=5000)),  # type: ignore[attr-defined]
        ["page_size"],
    ),
    (
        "inverted time range",
        lambda s: s.ListMemories(
            pb.ListMemoriesRequest(  # type: ignore[attr-defined]
                filter=memory_pb2.MemoryFilter(
                    create_time=common_pb2.TimeRange(
                        start_time=timestamp_pb2.Timestamp(seconds=20),
                        end_time=timestamp_pb2.Timestamp(seconds=10),
                    )
                )
            )
        ),
        ["filter.create_time.end_time"],
    ),
    (
        "garbage page token",
        lambda s: s.ListMemories(pb.ListMemoriesRequest(page_token="zzz")),  # type: ignore[attr-defined]
        ["page_token"],
    ),
    ("get without id", lambda s: s.GetMemory(pb.GetMemoryRequest()), ["id"]),  # type: ignore[attr-defined]
    (
        "update with empty mask",
        lambda s: s.UpdateMemory(
            pb.UpdateMemoryRequest(  # type: ignore[attr-defined]
                memory=M(id="00000000-0000-0000-0000-000000000000")
            )
        ),
        ["update_mask"],
    ),
    (
        "update to empty content",
        lambda s: s.UpdateMemory(
            pb.UpdateMemoryRequest(  # type: ignore[attr-defined]
                memory=M(id="00000000-0000-0000-0000-000000000000", content=""),
                update_mask=field_mask_pb2.FieldMask(paths=["content"]),
            )
        ),
        ["memory.content"],
    ),
    (
        "purge of all memories and a filter",
        lambda s: s.PurgeMemories(  # type: ignore[attr-defined]
            pb.PurgeMemoriesRequest(
                all_memories=True, force=True, filter=memory_pb2.MemoryFilter(categories=["x"])
            )
        ),
        ["all_memories"],
    ),
    (
        "too many session ids in a filter",
        lambda s: s.Recall(  # type: ignore[attr-defined]
            pb.RecallRequest(
                query="q",
                filter=memory_pb2.MemoryFilter(source_session_ids=[f"s{i}" for i in range(101)]),
            )
        ),
        ["filter.source_session_ids"],
    ),
    (
        "purge with a token that is not a dry run's",
        lambda s: s.PurgeMemories(  # type: ignore[attr-defined]
            pb.PurgeMemoriesRequest(all_memories=True, force=True, snapshot_token="s1.x")
        ),
        ["snapshot_token"],
    ),
    (
        "purge without criteria",
        lambda s: s.PurgeMemories(pb.PurgeMemoriesRequest(force=True)),  # type: ignore[attr-defined]
        ["filter"],
    ),
]


@pytest.mark.parametrize(("name", "call", "fields"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_invalid_argument_and_writes_nothing(
    tenant_a: TenantClient, name: str, call: Callable[[object], object], fields: list[str]
) -> None:
    stub = tenant_a.memory()
    stub.CreateMemory(
        pb.CreateMemoryRequest(memory=M(content="pre-existing")), metadata=tenant_a.md, timeout=5
    )

    class Bound:
        def __getattr__(self, rpc: str) -> Callable[..., object]:
            return lambda req: getattr(stub, rpc)(req, metadata=tenant_a.md, timeout=10)

    with pytest.raises(grpc.RpcError) as err:
        call(Bound())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    reason, violated = error_info(err.value)
    assert violated == fields and reason
    assert fields[0].split("[")[0] in err.value.details()
    after = stub.ListMemories(
        pb.ListMemoriesRequest(show_deleted=True), metadata=tenant_a.md, timeout=5
    ).memories
    assert [m.content for m in after] == ["pre-existing"]


def test_import_rejects_entries_without_ids(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    bad = M(content="no id", create_time=timestamp_pb2.Timestamp(seconds=1))
    with pytest.raises(grpc.RpcError) as err:
        list(
            stub.ImportMemories(
                iter([pb.ImportMemoriesRequest(memories=[bad])]), metadata=tenant_a.md, timeout=5
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(err.value)[1] == ["messages[0].memories[0].id"]
    assert not stub.ListMemories(pb.ListMemoriesRequest(), metadata=tenant_a.md, timeout=5).memories
