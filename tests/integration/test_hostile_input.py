"""Input a careless or hostile client sends: over-long ids, messages nested past what protobuf
parses, restores that would duplicate a memory under another spelling or name. Each gets a
clear status and writes nothing; what is accepted stays readable by every client."""

from __future__ import annotations

import uuid

import grpc
import pytest
from google.protobuf import field_mask_pb2, struct_pb2, timestamp_pb2

from mnemo.v1 import admin_service_pb2 as admin_pb
from mnemo.v1 import admin_service_pb2_grpc as admin_grpc
from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from tests.conftest import ADMIN_KEY, LiveServer, TenantClient, bearer, error_info

M = memory_pb2.Memory
WHEN = timestamp_pb2.Timestamp(seconds=1_700_000_000)


def _nested(levels: int) -> struct_pb2.Struct:
    value: object = "leaf"
    for _ in range(levels - 1):
        value = {"k": value}
    s = struct_pb2.Struct()
    s.update({"k": value})
    return s


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (payloads here stay under 2**14 bytes)."""
    size = len(payload)
    varint = bytes([size]) if size < 0x80 else bytes([size & 0x7F | 0x80, size >> 7])
    return bytes([number << 3 | 2]) + varint + payload


def _raw_nested_struct(levels: int) -> bytes:
    """A Struct serialized by hand: the Python runtime refuses to build one this deep."""
    struct = b""
    for _ in range(levels):
        value = _field(5, struct)  # Value.struct_value
        struct = _field(1, _field(1, b"k") + _field(2, value))  # Struct.fields["k"]
    return struct


def _raw_memory(content: str, levels: int) -> bytes:
    return _field(6, content.encode()) + _field(12, _raw_nested_struct(levels))  # content, metadata


def _contents(t: TenantClient) -> list[str]:
    listed = t.memory().ListMemories(pb.ListMemoriesRequest(show_deleted=True), metadata=t.md, timeout=5)
    return sorted(m.content for m in listed.memories)


def _import(t: TenantClient, *memories: memory_pb2.Memory) -> pb.ImportMemoriesResponse:
    request = pb.ImportMemoriesRequest(memories=list(memories))
    responses = list(t.memory().ImportMemories(iter([request]), metadata=t.md, timeout=10))
    return responses[-1]


def _refused(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return err.value


def test_metadata_at_the_depth_limit_is_stored_and_recalled(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    made = stub.CreateMemory(
        pb.CreateMemoryRequest(
            memory=M(content="the deploy key rotates on mondays", metadata=_nested(16)), wait_for_index=True
        ),
        metadata=tenant_a.md,
        timeout=30,
    ).memory
    hits = stub.Recall(
        pb.RecallRequest(query="when does the deploy key rotate"), metadata=tenant_a.md, timeout=10
    )
    assert [h.memory.id for h in hits.hits][:1] == [made.id]
    assert hits.hits[0].memory.metadata == _nested(16)


def test_messages_nested_past_protobufs_limit_are_invalid_argument(
    tenant_a: TenantClient, server: LiveServer
) -> None:
    channel = server.channel()
    create = channel.unary_unary(
        "/mnemo.v1.MemoryService/CreateMemory",
        request_serializer=lambda raw: raw,
        response_deserializer=pb.CreateMemoryResponse.FromString,
    )
    request = _field(1, _raw_memory("deep", 40))  # CreateMemoryRequest.memory
    err = _refused(lambda: create(request, metadata=tenant_a.md, timeout=5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert error_info(err)[1] == ["request"]
    # A client stream's messages are refused the same way as they are read.
    restore = channel.stream_stream(
        "/mnemo.v1.MemoryService/ImportMemories",
        request_serializer=lambda raw: raw,
        response_deserializer=pb.ImportMemoriesResponse.FromString,
    )
    message = _field(1, _field(1, str(uuid.uuid4()).encode()) + _raw_memory("deep", 40))
    err = _refused(lambda: list(restore(iter([message]), metadata=tenant_a.md, timeout=5)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert _contents(tenant_a) == []


def test_over_long_ids_are_answered_with_a_short_echo(tenant_a: TenantClient, server: LiveServer) -> None:
    stub = tenant_a.memory()
    err = _refused(
        lambda: stub.GetMemory(pb.GetMemoryRequest(id="x" * 10_000), metadata=tenant_a.md, timeout=5)
    )
    assert err.code() == grpc.StatusCode.NOT_FOUND, err.details()
    assert len(err.details()) < 1_100 and "more characters" in err.details()
    admin = admin_grpc.AdminServiceStub(server.channel())
    err = _refused(
        lambda: admin.GetTenant(
            admin_pb.GetTenantRequest(id="t" * 10_000), metadata=bearer(ADMIN_KEY), timeout=5
        )
    )
    assert err.code() == grpc.StatusCode.NOT_FOUND, err.details()


@pytest.mark.parametrize("char", ["\U0001f600", "\u4e2d", "x"])
def test_an_echoed_id_is_cut_by_its_bytes_so_the_status_arrives(tenant_a: TenantClient, char: str) -> None:
    """1,000 emoji are 4,000 bytes, percent-encoded in the message to 12,000, and again in the
    status: cut by characters they passed the client's 16 KB of trailers, and the client saw
    a RESOURCE_EXHAUSTED that its own gRPC made up instead of the server's NOT_FOUND."""
    stub = tenant_a.memory()
    for ident in (char * 1_000, char * 5_000):
        err = _refused(lambda: stub.GetMemory(pb.GetMemoryRequest(id=ident), metadata=tenant_a.md, timeout=5))  # noqa: B023
        assert err.code() == grpc.StatusCode.NOT_FOUND, (len(ident), err.details()[:200])
        assert len(err.details().encode()) < 1_100 and "more characters" in err.details()
        assert error_info(err)[0] == "MEMORY_NOT_FOUND"


def test_an_import_with_hundreds_of_bad_entries_lists_the_first(tenant_a: TenantClient) -> None:
    bad = [M(id=f"not-a-uuid-{i}", content=f"m{i}", create_time=WHEN) for i in range(300)]
    err = _refused(lambda: _import(tenant_a, *bad))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    fields = error_info(err)[1]
    assert fields == [f"messages[0].memories[{i}].id" for i in range(20)]
    assert err.details().startswith("300 fields are invalid, the first 20:")
    assert _contents(tenant_a) == []


@pytest.mark.parametrize(
    "spelling", [str.upper, lambda i: "{" + i + "}", lambda i: "urn:uuid:" + i, lambda i: i.replace("-", "")]
)
def test_import_takes_only_the_ids_exports_carry(tenant_a: TenantClient, spelling: object) -> None:
    stored = (
        tenant_a.memory()
        .CreateMemory(pb.CreateMemoryRequest(memory=M(content="original")), metadata=tenant_a.md, timeout=10)
        .memory
    )
    other = M(id=spelling(stored.id), content="a copy under another spelling", create_time=WHEN)  # type: ignore[operator]
    err = _refused(lambda: _import(tenant_a, other))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert error_info(err)[1] == ["messages[0].memories[0].id"]
    assert _contents(tenant_a) == ["original"]


@pytest.mark.parametrize("link", ["supersedes_id", "superseded_by_id"])
def test_import_takes_only_memory_ids_as_the_links_between_memories(
    tenant_a: TenantClient, link: str
) -> None:
    """Stored as given, a link of a million characters, or one holding a NUL, made every
    listing of the scope too large for a client to read."""
    for bad in ("x" * 1_000_000, "a\x00b", str(uuid.uuid4()).upper()):
        entry = M(id=str(uuid.uuid4()), content="a memory with a link", create_time=WHEN, **{link: bad})
        err = _refused(lambda entry=entry: _import(tenant_a, entry))  # type: ignore[misc]
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert error_info(err)[1] == [f"messages[0].memories[0].{link}"]
    assert _contents(tenant_a) == []
    linked = str(uuid.uuid4())
    _import(tenant_a, M(id=str(uuid.uuid4()), content="linked", create_time=WHEN, **{link: linked}))
    listed = tenant_a.memory().ListMemories(pb.ListMemoriesRequest(), metadata=tenant_a.md, timeout=10)
    assert [getattr(m, link) for m in listed.memories] == [linked]


def test_import_keeps_external_ids_unique(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    scope = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="p")
    held = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=M(content="ship on fridays", external_id="E1", scope=scope)),
        metadata=tenant_a.md,
        timeout=10,
    ).memory
    gone = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=M(content="to revive")), metadata=tenant_a.md, timeout=10
    ).memory
    stub.DeleteMemory(pb.DeleteMemoryRequest(id=gone.id), metadata=tenant_a.md, timeout=10)
    before = _contents(tenant_a)

    # Another memory under a taken name fails the whole message, the revival beside it too.
    revived = M(id=gone.id, content="to revive", create_time=WHEN)
    rival = M(
        id=str(uuid.uuid4()), content="never ship on fridays", external_id="E1", scope=scope, create_time=WHEN
    )
    err = _refused(lambda: _import(tenant_a, revived, rival))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS, err.details()
    assert "messages[0].memories[1].external_id" in err.details()
    assert _contents(tenant_a) == before
    assert stub.GetMemory(pb.GetMemoryRequest(id=gone.id), metadata=tenant_a.md, timeout=5).memory.HasField(
        "delete_time"
    )

    # Two live entries naming one external id in one message.
    twins = [
        M(id=str(uuid.uuid4()), content=f"twin {i}", external_id="E2", create_time=WHEN) for i in range(2)
    ]
    err = _refused(lambda: _import(tenant_a, *twins))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert error_info(err)[1] == ["messages[0].memories[1].external_id"]

    # The same memory under another id (same name, scope and content) is skipped, as a retry.
    same = M(id=str(uuid.uuid4()), content="ship on fridays", external_id="E1", scope=scope, create_time=WHEN)
    done = _import(tenant_a, same)
    assert (done.imported_count, done.skipped_count) == (0, 1)
    named = stub.GetMemory(pb.GetMemoryRequest(id="external:E1"), metadata=tenant_a.md, timeout=5).memory
    assert named.id == held.id
    assert _contents(tenant_a) == before


def test_a_masked_field_left_unset_takes_the_create_default(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    made = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=M(content="weights", importance=0.9, confidence=0.2)),
        metadata=tenant_a.md,
        timeout=10,
    ).memory
    updated = stub.UpdateMemory(
        pb.UpdateMemoryRequest(
            memory=M(id=made.id), update_mask=field_mask_pb2.FieldMask(paths=["importance", "confidence"])
        ),
        metadata=tenant_a.md,
        timeout=10,
    ).memory
    assert (updated.importance, updated.confidence) == (0.5, 1.0)


def test_fields_the_update_mask_does_not_name_are_ignored_not_checked(tenant_a: TenantClient) -> None:
    """A NaN in the metadata, a 65-character category or an event time out of range refused
    an update of `pinned` alone, though the mask says they are not part of it."""
    stub = tenant_a.memory()
    made = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=M(content="keep me", category="notes")),
        metadata=tenant_a.md,
        timeout=10,
    ).memory
    nan = struct_pb2.Struct()
    nan.update({"x": float("nan")})
    unmasked = M(
        id=made.id,
        pinned=True,
        metadata=nan,
        category="c" * 65,
        importance=float("nan"),
        event_time=timestamp_pb2.Timestamp(seconds=10**11),
    )
    mask = field_mask_pb2.FieldMask(paths=["pinned"])
    updated = stub.UpdateMemory(
        pb.UpdateMemoryRequest(memory=unmasked, update_mask=mask), metadata=tenant_a.md, timeout=10
    ).memory
    assert updated.pinned and updated.category == "notes" and updated.importance == made.importance
    assert updated.event_time == made.event_time and not updated.metadata.fields
    # Named by the mask, each is still checked.
    for path, field in (("metadata", "memory.metadata"), ("category", "memory.category")):
        err = _refused(
            lambda path=path: stub.UpdateMemory(  # type: ignore[misc]
                pb.UpdateMemoryRequest(memory=unmasked, update_mask=field_mask_pb2.FieldMask(paths=[path])),
                metadata=tenant_a.md,
                timeout=10,
            )
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and error_info(err)[1][0].startswith(field), (
            path
        )


def test_admin_checks_request_ids_and_page_sizes(server: LiveServer) -> None:
    admin = admin_grpc.AdminServiceStub(server.channel())
    md = bearer(ADMIN_KEY)
    for call, field in [
        (
            lambda: admin.CreateTenant(
                admin_pb.CreateTenantRequest(tenant=admin_pb.Tenant(id="t1"), request_id="a b"),
                metadata=md,
                timeout=5,
            ),
            "request_id",
        ),
        (
            lambda: admin.ListTenants(admin_pb.ListTenantsRequest(page_size=-1), metadata=md, timeout=5),
            "page_size",
        ),
        (
            lambda: admin.ListTenants(admin_pb.ListTenantsRequest(page_size=1_001), metadata=md, timeout=5),
            "page_size",
        ),
    ]:
        err = _refused(call)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert error_info(err)[1] == [field]
    assert [
        t.id for t in admin.ListTenants(admin_pb.ListTenantsRequest(), metadata=md, timeout=5).tenants
    ] == []
