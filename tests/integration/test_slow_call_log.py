"""The slow-call log: a call over `server.slow_call_ms` is logged with its stages and outcome,
through a real server; with the threshold at 0 nothing is logged."""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
import pytest

from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from tests.conftest import LiveServer, TenantClient, provision

LOGGER = "mnemo_server.api.interceptor"


def _slow_lines(caplog: pytest.LogCaptureFixture, method: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.getMessage().startswith(f"slow call /mnemo.v1.MemoryService/{method} ")
    ]


def _client(live: LiveServer) -> TenantClient:
    return TenantClient(provision(live, "tenant-a"), live.channel())


def _stage_names(line: str) -> list[str]:
    stages = line.split(" ms: ", 1)[1].removesuffix(" ms").split(", ")
    return [s.rsplit(" ", 1)[0] for s in stages]


def test_a_slow_call_is_logged_with_its_stages(
    start_server: Callable[..., LiveServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    t = _client(start_server(server={"slow_call_ms": 0.001}))
    mem = t.memory()
    mem.CreateMemory(
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="The deploy runs on Fridays")),
        metadata=t.md,
        timeout=30,
    )
    mem.Recall(pb.RecallRequest(query="when does the deploy run", top_k=5), metadata=t.md, timeout=30)
    with pytest.raises(grpc.RpcError) as err:
        mem.Recall(
            pb.RecallRequest(query="x", options=pb.RecallOptions(rerank_deadline_ms=-1)),
            metadata=t.md,
            timeout=30,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    created = _slow_lines(caplog, "CreateMemory")
    assert len(created) == 1 and "(ok)" in created[0]
    names = _stage_names(created[0])
    assert names.index("write_lock_wait") < names.index("transaction") < names.index("rest")

    recalls = _slow_lines(caplog, "Recall")
    assert len(recalls) == 2
    ok = [line for line in recalls if "(ok)" in line]
    assert len(ok) == 1
    names = _stage_names(ok[0])
    # The compute gate first, then Recall's stages in pipeline order: the full-text search
    # runs while the query is embedded, then the wait for its vector, then the vector search.
    expected = ["gate", "recall.full_text", "recall.embedding", "recall.vector", "recall.hydration"]
    assert [n for n in names if n in expected] == expected
    failed = [line for line in recalls if "(INVALID_ARGUMENT)" in line]
    assert len(failed) == 1 and "recall.vector" not in failed[0]


def test_no_log_below_the_threshold_or_when_off(
    start_server: Callable[..., LiveServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    for threshold in (0.0, 60_000.0):
        live = start_server(server={"slow_call_ms": threshold})
        t = TenantClient(provision(live, f"tenant-{int(threshold)}"), live.channel())
        t.memory().Recall(pb.RecallRequest(query="anything", top_k=3), metadata=t.md, timeout=30)
    assert not [r for r in caplog.records if r.name == LOGGER and "slow call" in r.getMessage()]
