"""Acknowledged writes survive kill -9, including a crash between commit and indexing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo.v1 import memory_service_pb2_grpc as pb_grpc
from tests.e2e.conftest import Proc, base_env


def _serve_args(data: Path) -> list[str]:
    return ["serve", "--data-dir", str(data), "--port", "0"]


def _wait_searchable(stub: pb_grpc.MemoryServiceStub, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while stub.GetStatus(pb.GetStatusRequest(), timeout=5).pending_index_count:
        assert time.monotonic() < deadline, "index never caught up"
        time.sleep(0.1)


def test_crash_between_commit_and_index(
    spawn: Callable[..., Proc], tmp_path: Path, model_cache: Path
) -> None:
    data = tmp_path / "data"
    # A long micro-batch wait holds acknowledged memories in the commit→index window.
    slow = base_env(model_cache, MNEMO_AUTH__ENABLED="false", MNEMO_INDEX__BATCH_WAIT_MS="20000")
    proc = spawn(_serve_args(data), env=slow)
    stub = pb_grpc.MemoryServiceStub(grpc.insecure_channel(proc.address))
    facts = [f"Incident {i}: the {c} cluster ran out of disk" for i, c in enumerate(["red", "green", "blue"])]
    ids = [
        stub.CreateMemory(pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f)), timeout=10).memory.id
        for f in facts
    ]
    status = stub.GetStatus(pb.GetStatusRequest(), timeout=5)
    assert status.memory_count == 3 and status.pending_index_count == 3  # acknowledged, not yet indexed
    assert not stub.Recall(pb.RecallRequest(query="green cluster disk"), timeout=5).hits
    proc.kill9()

    proc2 = spawn(_serve_args(data), env=base_env(model_cache, MNEMO_AUTH__ENABLED="false"))
    stub2 = pb_grpc.MemoryServiceStub(grpc.insecure_channel(proc2.address))
    for i, mid in enumerate(ids):
        assert stub2.GetMemory(pb.GetMemoryRequest(id=mid), timeout=5).memory.content == facts[i]
    _wait_searchable(stub2)
    hit = stub2.Recall(pb.RecallRequest(query="green cluster disk", top_k=1), timeout=5).hits[0]
    assert hit.memory.id == ids[1]
    assert proc2.terminate() == 0  # SIGTERM drains and exits cleanly


def test_every_acknowledged_write_survives_kill9_under_load(
    spawn: Callable[..., Proc], tmp_path: Path, model_cache: Path
) -> None:
    data = tmp_path / "data"
    env = base_env(model_cache, MNEMO_AUTH__ENABLED="false")
    proc = spawn(_serve_args(data), env=env)
    acked: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def writer(w: int) -> None:
        stub = pb_grpc.MemoryServiceStub(grpc.insecure_channel(proc.address))
        i = 0
        while not stop.is_set():
            try:
                r = stub.CreateMemory(
                    pb.CreateMemoryRequest(
                        memory=memory_pb2.Memory(content=f"writer {w} note {i} about topic {i % 13}")
                    ),
                    timeout=5,
                )
            except grpc.RpcError:
                return  # the server died mid-call: that write was never acknowledged
            with lock:
                acked.append(r.memory.id)
            i += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    proc.kill9()
    stop.set()
    for t in threads:
        t.join(10)
    assert len(acked) > 20

    proc2 = spawn(_serve_args(data), env=env)
    stub = pb_grpc.MemoryServiceStub(grpc.insecure_channel(proc2.address))
    present: set[str] = set()
    token = ""
    while True:
        page = stub.ListMemories(pb.ListMemoriesRequest(page_size=1000, page_token=token), timeout=10)
        present.update(m.id for m in page.memories)
        token = page.next_page_token
        if not token:
            break
    missing = set(acked) - present
    assert not missing, f"{len(missing)} acknowledged writes lost"
    _wait_searchable(stub)
    assert stub.GetStatus(pb.GetStatusRequest(), timeout=5).memory_count == len(present)
