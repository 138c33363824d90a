"""Authentication and the admin/tenant split, over real gRPC."""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Callable, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mnemo.v1 import admin_service_pb2 as admin_pb
from mnemo.v1 import admin_service_pb2_grpc as admin_grpc
from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo.v1 import memory_service_pb2_grpc as pb_grpc
from mnemo_server.errors import FailedPrecondition
from tests.conftest import ADMIN_KEY, LiveServer, TenantClient, bearer, error_info


def _code_and_reason(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), error_info(err.value)[0]


def test_data_calls_need_a_valid_key(server: LiveServer, tenant_a: TenantClient) -> None:
    stub = pb_grpc.MemoryServiceStub(server.channel())
    req = pb.ListMemoriesRequest()
    assert _code_and_reason(lambda: stub.ListMemories(req, timeout=5)) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "MISSING_CREDENTIALS",
    )
    assert _code_and_reason(lambda: stub.ListMemories(req, metadata=bearer("nonsense"), timeout=5)) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "INVALID_API_KEY",
    )
    forged = tenant_a.token[:-4] + ("AAAA" if not tenant_a.token.endswith("AAAA") else "BBBB")
    assert _code_and_reason(lambda: stub.ListMemories(req, metadata=bearer(forged), timeout=5)) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "INVALID_API_KEY",
    )
    assert _code_and_reason(
        lambda: stub.ListMemories(req, metadata=(("authorization", "Basic abc"),), timeout=5)
    ) == (grpc.StatusCode.UNAUTHENTICATED, "BAD_AUTH_SCHEME")
    two = (*tenant_a.md, ("authorization", "Bearer nonsense"))  # which one is meant?
    assert _code_and_reason(lambda: stub.ListMemories(req, metadata=two, timeout=5)) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "BAD_AUTH_SCHEME",
    )
    stub.ListMemories(req, metadata=tenant_a.md, timeout=5)  # the real key works


def test_revoked_key_stops_working_at_once(server: LiveServer, tenant_a: TenantClient) -> None:
    mem = pb_grpc.MemoryServiceStub(server.channel())
    mem.ListMemories(pb.ListMemoriesRequest(), metadata=tenant_a.md, timeout=5)
    admin = admin_grpc.AdminServiceStub(server.channel())
    keys = admin.ListApiKeys(
        admin_pb.ListApiKeysRequest(tenant_id="tenant-a"), metadata=bearer(ADMIN_KEY), timeout=5
    ).api_keys
    assert len(keys) == 1 and tenant_a.token.startswith(f"mnemo_{keys[0].id}.")
    revoked = admin.RevokeApiKey(
        admin_pb.RevokeApiKeyRequest(id=keys[0].id), metadata=bearer(ADMIN_KEY), timeout=5
    ).api_key
    assert revoked.HasField("revoke_time")
    assert _code_and_reason(
        lambda: mem.ListMemories(pb.ListMemoriesRequest(), metadata=tenant_a.md, timeout=5)
    ) == (grpc.StatusCode.UNAUTHENTICATED, "API_KEY_REVOKED")


def _fed(requests: queue.Queue[pb.ImportMemoriesRequest | None]) -> Iterator[pb.ImportMemoriesRequest]:
    while (request := requests.get()) is not None:
        yield request


def _one_memory(text: str) -> pb.ImportMemoriesRequest:
    memory = memory_pb2.Memory(id=str(uuid.uuid4()), content=text)
    memory.create_time.GetCurrentTime()
    return pb.ImportMemoriesRequest(memories=[memory])


def test_revoking_a_key_ends_the_streams_it_opened(server: LiveServer, tenant_a: TenantClient) -> None:
    """Each message of a stream is checked against its key, and the streams a revoked key
    holds open are ended, freeing their slots (probe: an import opened before the
    revocation went on importing, and four idle ones locked the tenant's new key out of
    exports and imports until a restart)."""
    admin = admin_grpc.AdminServiceStub(server.channel())
    fresh = admin.CreateApiKey(
        admin_pb.CreateApiKeyRequest(tenant_id="tenant-a"), metadata=bearer(ADMIN_KEY), timeout=5
    ).secret
    leaked_id = tenant_a.token.removeprefix("mnemo_").split(".")[0]
    mem = pb_grpc.MemoryServiceStub(server.channel())
    feeds: list[queue.Queue[pb.ImportMemoriesRequest | None]] = [queue.Queue() for _ in range(4)]
    streams = [mem.ImportMemories(_fed(f), metadata=tenant_a.md, timeout=30) for f in feeds]
    feeds[0].put(_one_memory("imported before the revocation"))
    assert next(streams[0]).imported_count == 1
    # The tenant's four stream slots are all held: its other key is turned away.
    busy = lambda: list(mem.ExportMemories(pb.ExportMemoriesRequest(), metadata=bearer(fresh), timeout=5))  # noqa: E731
    assert _code_and_reason(busy) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS")

    admin.RevokeApiKey(admin_pb.RevokeApiKeyRequest(id=leaked_id), metadata=bearer(ADMIN_KEY), timeout=5)
    feeds[0].put(_one_memory("sent after the revocation"))
    for stream in streams:
        with pytest.raises(grpc.RpcError) as ended:
            list(stream)
        assert ended.value.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.CANCELLED)
    deadline = time.monotonic() + 10
    codes = []
    while True:  # the slots are given back as each cancelled handler returns
        try:
            exported = busy()
            break
        except grpc.RpcError as err:
            codes.append(err.code())
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    assert set(codes) <= {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert [m.content for part in exported for m in part.memories] == ["imported before the revocation"]
    for f in feeds:
        f.put(None)


def test_admin_and_tenant_keys_are_not_interchangeable(server: LiveServer, tenant_a: TenantClient) -> None:
    admin = admin_grpc.AdminServiceStub(server.channel())
    mem = pb_grpc.MemoryServiceStub(server.channel())
    assert _code_and_reason(
        lambda: admin.CreateTenant(
            admin_pb.CreateTenantRequest(tenant=admin_pb.Tenant(id="evil")), metadata=tenant_a.md, timeout=5
        )
    ) == (grpc.StatusCode.PERMISSION_DENIED, "ADMIN_ONLY")
    assert _code_and_reason(
        lambda: mem.ListMemories(pb.ListMemoriesRequest(), metadata=bearer(ADMIN_KEY), timeout=5)
    ) == (grpc.StatusCode.PERMISSION_DENIED, "TENANT_KEY_REQUIRED")


def test_tenant_admin_validation(server: LiveServer) -> None:
    admin = admin_grpc.AdminServiceStub(server.channel())
    md = bearer(ADMIN_KEY)
    with pytest.raises(grpc.RpcError) as err:
        admin.CreateTenant(
            admin_pb.CreateTenantRequest(tenant=admin_pb.Tenant(id="Bad Name")), metadata=md, timeout=5
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error_info(err.value)[1] == ["tenant.id"]
    admin.CreateTenant(admin_pb.CreateTenantRequest(tenant=admin_pb.Tenant(id="t1")), metadata=md, timeout=5)
    assert _code_and_reason(
        lambda: admin.CreateTenant(
            admin_pb.CreateTenantRequest(tenant=admin_pb.Tenant(id="t1")), metadata=md, timeout=5
        )
    ) == (grpc.StatusCode.ALREADY_EXISTS, "TENANT_EXISTS")
    assert _code_and_reason(
        lambda: admin.CreateApiKey(admin_pb.CreateApiKeyRequest(tenant_id="ghost"), metadata=md, timeout=5)
    ) == (grpc.StatusCode.NOT_FOUND, "TENANT_NOT_FOUND")
    tenants = admin.ListTenants(admin_pb.ListTenantsRequest(), metadata=md, timeout=5).tenants
    assert [t.id for t in tenants] == ["t1"]


def test_health_and_reflection_need_no_key(server: LiveServer) -> None:
    health = health_pb2_grpc.HealthStub(server.channel())
    for service in ("", "mnemo.v1.MemoryService", "mnemo.v1.AdminService"):
        resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_local_mode_needs_no_key_and_binds_only_loopback(
    start_server: Callable[..., LiveServer], tmp_path: object
) -> None:
    live = start_server(auth={"enabled": False})
    stub = pb_grpc.MemoryServiceStub(live.channel())
    created = stub.CreateMemory(
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="local note")), timeout=10
    )
    assert stub.GetMemory(pb.GetMemoryRequest(id=created.memory.id), timeout=5).memory.content == "local note"
    with pytest.raises(FailedPrecondition, match="loopback"):
        start_server(auth={"enabled": False}, server={"host": "0.0.0.0"})


@pytest.mark.parametrize("name", ["a\x00b", "line\nbreak", "\x1b[2Jcleared", "acme\u202eevil"])
def test_names_and_descriptions_refuse_nul_and_control_characters(server: LiveServer, name: str) -> None:
    """NUL, line breaks, terminal escapes and bidirectional overrides, which can make one
    name pass for another in a listing, are refused in the labels shown back to people."""
    admin = admin_grpc.AdminServiceStub(server.channel())
    with pytest.raises(grpc.RpcError) as err:
        admin.CreateTenant(
            admin_pb.CreateTenantRequest(tenant=admin_pb.Tenant(id="nul", display_name=name)),
            metadata=bearer(ADMIN_KEY),
            timeout=5,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(err.value)[1] == ["tenant.display_name"]
    admin.CreateTenant(
        admin_pb.CreateTenantRequest(tenant=admin_pb.Tenant(id="nul")), metadata=bearer(ADMIN_KEY), timeout=5
    )
    with pytest.raises(grpc.RpcError) as err:
        admin.CreateApiKey(
            admin_pb.CreateApiKeyRequest(tenant_id="nul", description=f"x{name}"),
            metadata=bearer(ADMIN_KEY),
            timeout=5,
        )
    assert error_info(err.value)[1] == ["description"]
    keys = admin.ListApiKeys(
        admin_pb.ListApiKeysRequest(tenant_id="nul"), metadata=bearer(ADMIN_KEY), timeout=5
    )
    assert not keys.api_keys  # nothing written
