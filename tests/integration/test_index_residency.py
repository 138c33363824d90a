"""Through gRPC, a server bounded to one tenant's search indices in memory loads the most
recently written tenant at start-up, loads another when a Recall asks for it (the Recall
fails UNAVAILABLE, INDEX_LOADING, while the load runs past index.load_wait_s; retried, it
answers as before), drops the least recently used in the background, and says so in
GetStatus. Real server, DuckDB, LanceDB and embedding model."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from tests.conftest import LiveServer, TenantClient, error_info, provision

FACTS = {
    "tenant-a": ["the staging database moved to eu-west-1", "lunch orders close at eleven on fridays"],
    "tenant-b": ["the quarterly review is on march 3rd", "the office plants are watered on mondays"],
}


def _client(live: LiveServer, tenant: str, token: str | None = None) -> TenantClient:
    return TenantClient(token or provision(live, tenant), live.channel())


def _write(t: TenantClient, facts: list[str]) -> None:
    reqs = [pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=c)) for c in facts]
    t.memory().BatchCreateMemories(
        pb.BatchCreateMemoriesRequest(requests=reqs, wait_for_index=True), metadata=t.md, timeout=60
    )


def _top(t: TenantClient, query: str) -> str:
    hits = t.memory().Recall(pb.RecallRequest(query=query, top_k=1), metadata=t.md, timeout=30).hits
    return hits[0].memory.content


def _top_once_loaded(t: TenantClient, query: str) -> str:
    """The first Recall of a tenant not in memory fails while its load runs (load_wait_s 0);
    retried, it answers."""
    with pytest.raises(grpc.RpcError) as raised:
        _top(t, query)
    err = raised.value
    assert err.code() == grpc.StatusCode.UNAVAILABLE and error_info(err)[0] == "INDEX_LOADING"
    deadline = time.monotonic() + 30
    while not _residency(t).tenant_loaded:
        assert time.monotonic() < deadline, "the tenant was never loaded"
        time.sleep(0.05)
    return _top(t, query)


def _residency(t: TenantClient) -> pb.IndexResidency:
    return t.memory().GetStatus(pb.GetStatusRequest(), metadata=t.md, timeout=10).index_residency


def test_one_tenant_kept_the_other_loaded_by_its_recall_and_the_idle_one_dropped(
    start_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    first = start_server(data)
    tokens = {tenant: provision(first, tenant) for tenant in FACTS}
    for tenant, facts in FACTS.items():  # tenant-b written last
        _write(_client(first, tenant, tokens[tenant]), facts)
        time.sleep(0.05)  # distinct version times
    first.close()

    live = start_server(
        data,
        index={
            "max_resident_tenants": 1,
            "resident_min_idle_s": 0.0,
            "optimize_interval_s": 0.1,
            "load_wait_s": 0.0,
        },
    )
    a, b = (_client(live, tenant, tokens[tenant]) for tenant in FACTS)
    at_start = _residency(a)
    assert not at_start.tenant_loaded and _residency(b).tenant_loaded  # the newest written
    assert (at_start.loads, at_start.max_tenants, at_start.rows) == (1, 1, 2)

    assert _top_once_loaded(a, "which region hosts the staging database") == FACTS["tenant-a"][0]
    loaded = _residency(a)
    assert loaded.tenant_loaded and loaded.loads == 2
    deadline = time.monotonic() + 10
    while _residency(b).tenant_loaded:  # b is now the least recently used
        assert time.monotonic() < deadline, "the idle tenant was never dropped"
        time.sleep(0.1)
    assert _residency(a).drops >= 1 and _residency(a).tenant_loaded
    assert _top_once_loaded(b, "when are the plants watered") == FACTS["tenant-b"][1]  # loaded again
