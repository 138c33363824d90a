"""GetStatus reports each unary method's server-side time through a real server: calls,
failures, a histogram whose windows can be subtracted, and times inside the client's own."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest

from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from tests.conftest import LiveServer, TenantClient, provision

CREATE = "/mnemo.v1.MemoryService/CreateMemory"
GET = "/mnemo.v1.MemoryService/GetMemory"
STATUS = "/mnemo.v1.MemoryService/GetStatus"
MISSING = "00000000-0000-0000-0000-000000000000"


def _status(t: TenantClient) -> pb.GetStatusResponse:
    resp: pb.GetStatusResponse = t.memory().GetStatus(pb.GetStatusRequest(), metadata=t.md, timeout=10)
    return resp


def _by_method(status: pb.GetStatusResponse) -> dict[str, pb.MethodLatency]:
    return {m.method: m for m in status.method_latencies}


def test_each_method_is_counted_with_its_failures_and_server_side_time(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    before = _by_method(_status(tenant_a))
    assert CREATE not in before and GET not in before
    slowest_seen_by_client = 0.0
    for i in range(3):
        started = time.perf_counter()
        stub.CreateMemory(
            pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"fact number {i}")),
            metadata=tenant_a.md,
            timeout=30,
        )
        slowest_seen_by_client = max(slowest_seen_by_client, (time.perf_counter() - started) * 1000.0)
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as err:
            stub.GetMemory(pb.GetMemoryRequest(id=MISSING), metadata=tenant_a.md)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND

    status = _status(tenant_a)
    bounds = list(status.latency_bucket_upper_ms)
    assert bounds == sorted(bounds) and bounds[0] > 0
    after = _by_method(status)
    create, get = after[CREATE], after[GET]
    assert (create.calls, create.failed) == (3, 0)
    assert (get.calls, get.failed) == (2, 2)
    assert after[STATUS].calls >= 1  # the GetStatus before this one
    for m in (create, get):
        assert len(m.bucket_counts) == len(bounds) + 1
        assert sum(m.bucket_counts) == m.calls
        assert 0 < m.p50_ms <= m.p99_ms
        # The estimate stays within the bucket of the longest call.
        assert m.p99_ms <= m.max_ms * 2**0.25
    # Measured inside the server: never longer than the client waited.
    assert 0 < create.max_ms <= slowest_seen_by_client


def test_two_answers_subtract_to_a_window(tenant_a: TenantClient) -> None:
    stub = tenant_a.memory()
    stub.CreateMemory(
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="before the window")), metadata=tenant_a.md
    )
    first = _by_method(_status(tenant_a))[CREATE]
    for i in range(4):
        stub.CreateMemory(
            pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"inside the window {i}")),
            metadata=tenant_a.md,
        )
    second = _by_method(_status(tenant_a))[CREATE]
    window = [b - a for a, b in zip(first.bucket_counts, second.bucket_counts, strict=True)]
    assert min(window) >= 0 and sum(window) == 4
    assert second.calls - first.calls == 4


def test_the_wait_for_the_interpreter_lock_is_measured_and_can_be_turned_off(
    start_server: Callable[..., LiveServer],
) -> None:
    probed = start_server(server={"lock_wait_probe_ms": 5.0})
    unprobed = start_server(server={"lock_wait_probe_ms": 0.0})
    time.sleep(0.3)
    on = _status(TenantClient(provision(probed, "t"), probed.channel()))
    off = _status(TenantClient(provision(unprobed, "t"), unprobed.channel()))

    waits = on.interpreter_lock_wait
    assert waits.interval_ms == 5.0
    assert len(waits.bucket_counts) == len(on.latency_bucket_upper_ms) + 1
    assert waits.samples == sum(waits.bucket_counts) >= 10  # ~60 wake-ups in 0.3 s
    assert 0 < waits.p50_ms <= waits.p99_ms and waits.max_ms > 0
    assert off.interpreter_lock_wait == pb.InterpreterLockWait()
    # A later answer has counted more wake-ups, in the same buckets.
    later = _status(TenantClient(provision(probed, "u"), probed.channel())).interpreter_lock_wait
    assert later.samples > waits.samples
    assert all(b >= a for a, b in zip(waits.bucket_counts, later.bucket_counts, strict=True))
