"""Acknowledged writes survive kill -9, including a crash between commit and indexing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from google.protobuf import field_mask_pb2

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


def _recall_ids(stub: pb_grpc.MemoryServiceStub, query: str, k: int = 5) -> list[str]:
    return [h.memory.id for h in stub.Recall(pb.RecallRequest(query=query, top_k=k), timeout=10).hits]


def test_the_vector_graph_saved_at_shutdown_is_put_right_after_a_kill9(
    spawn: Callable[..., Proc], tmp_path: Path, model_cache: Path
) -> None:
    """SIGTERM saves the vector graph and the next start reads it instead of building it; a
    kill -9 after more writes leaves that older save, which the next start checks against the
    table and puts right: new and changed memories found, deleted ones never."""
    data = tmp_path / "data"
    env = base_env(model_cache, MNEMO_AUTH__ENABLED="false")
    topics = ["sailing", "pottery", "chess", "baking", "cycling", "astronomy", "gardening", "jazz"]
    proc = spawn(_serve_args(data), env=env)
    stub = pb_grpc.MemoryServiceStub(grpc.insecure_channel(proc.address))
    batch = pb.BatchCreateMemoriesRequest(
        requests=[
            pb.CreateMemoryRequest(
                memory=memory_pb2.Memory(content=f"Note {i}: Dana's {topic} club meets at the old mill")
            )
            for i, topic in enumerate(t for t in topics for _ in range(5))
        ],
        wait_for_index=True,
    )
    ids = [r.memory.id for r in stub.BatchCreateMemories(batch, timeout=60).results]
    assert proc.terminate() == 0
    assert "vector graph of" in proc.log.read_text() and (data / "vector_graphs" / "t_default").is_dir()

    proc2 = spawn(_serve_args(data), env=env)
    assert "loaded: 40 rows, 0 removed and 0 added" in proc2.log.read_text()
    stub2 = pb_grpc.MemoryServiceStub(grpc.insecure_channel(proc2.address))
    new = stub2.CreateMemory(
        pb.CreateMemoryRequest(
            memory=memory_pb2.Memory(content="The lighthouse keeper repaints the lamp room every spring"),
            wait_for_index=True,
        ),
        timeout=30,
    ).memory.id
    changed = memory_pb2.Memory(id=ids[8], content="Dana sold her pottery wheel to a ceramics studio")
    stub2.UpdateMemory(
        pb.UpdateMemoryRequest(
            memory=changed, update_mask=field_mask_pb2.FieldMask(paths=["content"]), wait_for_index=True
        ),
        timeout=30,
    )
    stub2.DeleteMemory(pb.DeleteMemoryRequest(id=ids[20]), timeout=10)  # a baking note
    _wait_searchable(stub2)
    proc2.kill9()

    proc3 = spawn(_serve_args(data), env=env)
    assert "loaded: 40 rows, 2 removed and 2 added" in proc3.log.read_text()
    stub3 = pb_grpc.MemoryServiceStub(grpc.insecure_channel(proc3.address))
    assert stub3.GetStatus(pb.GetStatusRequest(), timeout=5).cache_use.vector_graph_rows == 40
    assert _recall_ids(stub3, "who repaints the lighthouse lamp room")[0] == new
    assert _recall_ids(stub3, "pottery wheel sold to a ceramics studio")[0] == ids[8]
    assert ids[20] not in _recall_ids(stub3, "baking club meets at the old mill", 40)
    assert proc3.terminate() == 0
