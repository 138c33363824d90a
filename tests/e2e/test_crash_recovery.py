"""Acknowledged writes survive kill -9, including a crash between commit and indexing, and
acknowledged sessions: what each StartSession injected, each EndSession's end, and the
training pairs it queued for the sidecar."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from google.protobuf import field_mask_pb2

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo.ranking.v1 import ranking_service_pb2_grpc as rpb_grpc
from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo.v1 import memory_service_pb2_grpc as pb_grpc
from mnemo_server.launcher import Launcher
from tests.e2e.conftest import Proc, base_env


def _serve_args(data: Path) -> list[str]:
    return ["serve", "--data-dir", str(data), "--port", "0"]


def _wait_searchable(stub: pb_grpc.MemoryServiceStub, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while stub.GetStatus(pb.GetStatusRequest(), timeout=5).pending_index_count:
        assert time.monotonic() < deadline, "index never caught up"
        time.sleep(0.1)


_CLIENTS = 4


def _kill9_under_load(
    proc: Proc, step: Callable[[pb_grpc.MemoryServiceStub, int, int], None], seconds: float
) -> None:
    """_CLIENTS threads call step(stub, client, i) for i = 0, 1, ... until the server is
    killed with SIGKILL after `seconds`. A client stops at its first failed call: the server
    died during it, so it was never acknowledged."""
    stop = threading.Event()

    def client(w: int) -> None:
        stub = pb_grpc.MemoryServiceStub(grpc.insecure_channel(proc.address))
        i = 0
        while not stop.is_set():
            try:
                step(stub, w, i)
            except grpc.RpcError:
                return
            i += 1

    threads = [threading.Thread(target=client, args=(w,)) for w in range(_CLIENTS)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    proc.kill9()
    stop.set()
    for t in threads:
        t.join(10)


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

    def write(stub: pb_grpc.MemoryServiceStub, w: int, i: int) -> None:
        content = f"writer {w} note {i} about topic {i % 13}"
        r = stub.CreateMemory(pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=content)), timeout=5)
        with lock:
            acked.append(r.memory.id)

    _kill9_under_load(proc, write, seconds=2.0)
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


def test_acknowledged_sessions_and_their_feedback_survive_kill9_under_load(
    spawn: Callable[..., Proc], tmp_path: Path, model_cache: Path
) -> None:
    """Four clients start and end sessions until the server is killed. After a restart every
    acknowledged StartSession is there with what it injected, every acknowledged EndSession
    has ended its session with its feedback, and once a sidecar is reachable it receives
    every ended session's training pairs (the outbox was written with the end)."""
    data = tmp_path / "data"
    proc = spawn(_serve_args(data), env=base_env(model_cache, MNEMO_AUTH__ENABLED="false"))
    stub = pb_grpc.MemoryServiceStub(grpc.insecure_channel(proc.address))
    for i in range(12):
        note = f"release note {i}: the deploy pipeline runs the {i % 4} stage checks"
        stub.CreateMemory(pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=note)), timeout=10)
    started: dict[str, list[str]] = {}  # acknowledged StartSession -> the ids it injected
    ended: dict[str, str] = {}  # acknowledged EndSession -> the memory it marked used
    lock = threading.Lock()

    def start_and_end(stub: pb_grpc.MemoryServiceStub, w: int, i: int) -> None:
        sid = f"w{w}-s{i}"
        r = stub.StartSession(
            pb.StartSessionRequest(session_id=sid, context="how does the deploy pipeline run"), timeout=5
        )
        with lock:
            started[sid] = [m.memory.id for m in r.memories]
        used = r.memories[0].memory.id
        feedback = [pb.MemoryFeedback(memory_id=used, used=True)]
        stub.EndSession(pb.EndSessionRequest(session_id=sid, feedback=feedback), timeout=5)
        with lock:
            ended[sid] = used

    _kill9_under_load(proc, start_and_end, seconds=3.0)
    assert len(ended) > 10 and all(started.values())

    # The server ran without a sidecar, so every ended session's pairs wait in its outbox.
    side_launcher = Launcher(root=tmp_path / "side", keep=True)
    side_launcher.root.mkdir()
    try:
        side = side_launcher.start_sidecar(_sidecar_env(model_cache))
        proc2 = spawn(
            _serve_args(data),
            env=base_env(
                model_cache,
                MNEMO_AUTH__ENABLED="false",
                MNEMO_RANKING__SIDECAR_ADDRESS=side.address,
                MNEMO_RANKING__DELIVERY_INTERVAL_S="0.05",
            ),
        )
        stub2 = pb_grpc.MemoryServiceStub(grpc.insecure_channel(proc2.address))
        for sid, injected in started.items():
            session = stub2.GetSession(pb.GetSessionRequest(session_id=sid), timeout=5).session
            assert [m.memory.id for m in session.injected] == injected, sid
            if sid in ended:
                assert session.state == pb.SESSION_STATE_ENDED, sid
                judged = {c.memory_id: c for c in session.continuity}
                assert judged[ended[sid]].source == "feedback" and judged[ended[sid]].relevance > 0, sid
        deadline = time.monotonic() + 60
        while stub2.GetStatus(pb.GetStatusRequest(), timeout=5).feedback_outbox_pending:
            assert time.monotonic() < deadline, "the outbox was never delivered"
            time.sleep(0.1)
        for sid in ended:
            session = stub2.GetSession(pb.GetSessionRequest(session_id=sid), timeout=5).session
            assert session.feedback_delivered, sid
        ranking = rpb_grpc.RankingServiceStub(grpc.insecure_channel(side.address))
        status = ranking.GetModelStatus(rpb.GetModelStatusRequest(tenant_id="default"), timeout=5)
        stored = status.stored_sessions
        # An EndSession cut off by the kill after its commit is stored but was never acknowledged.
        assert len(ended) <= stored <= len(ended) + _CLIENTS
    finally:
        side_launcher.stop()


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
    stub2.DeleteMemory(pb.DeleteMemoryRequest(id=ids[20]), timeout=10)  # a baking note
    # Indexed after the delete's removal from the table (one queue, in order): the kill finds
    # the table as the store is. (A removal the kill cut short would be made once the next
    # server serves, by its check of the table's rows: test_index_seal.)
    changed = memory_pb2.Memory(id=ids[8], content="Dana sold her pottery wheel to a ceramics studio")
    stub2.UpdateMemory(
        pb.UpdateMemoryRequest(
            memory=changed, update_mask=field_mask_pb2.FieldMask(paths=["content"]), wait_for_index=True
        ),
        timeout=30,
    )
    _wait_searchable(stub2)
    proc2.kill9()

    proc3 = spawn(_serve_args(data), env=env)
    assert "loaded: 40 rows, 2 removed and 2 added" in proc3.log.read_text()
    stub3 = pb_grpc.MemoryServiceStub(grpc.insecure_channel(proc3.address))
    assert stub3.GetStatus(pb.GetStatusRequest(), timeout=5).cache_use.vector_graph_rows == 40
    assert _recall_ids(stub3, "who repaints the lighthouse lamp room")[0] == new
    assert _recall_ids(stub3, "pottery wheel sold to a ceramics studio")[0] == ids[8]
    assert ids[20] not in _recall_ids(stub3, "baking club meets at the old mill", 40)
    # The crash left no seal: the table's rows are compared with the store's once serving.
    assert "ended without an orderly shutdown: every table's rows are checked" in proc3.log.read_text()
    deadline = time.monotonic() + 30
    while stub3.GetStatus(pb.GetStatusRequest(), timeout=5).index_tables_to_check:
        assert time.monotonic() < deadline, "the index check after the crash never ended"
        time.sleep(0.1)
    assert "index rows checked against the store in" in proc3.log.read_text()
    assert ": 0 memories (re)indexed or removed" in proc3.log.read_text()  # the table was as the store
    assert proc3.terminate() == 0


def _children(pid: int) -> dict[int, str]:
    """The live child processes of `pid`, with their command lines."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            found[int(stat.parent.name)] = cmdline
    return found


def test_a_training_process_stops_when_its_sidecar_is_killed(tmp_path: Path, model_cache: Path) -> None:
    """Training runs in a child of the sidecar; killed with SIGKILL, the sidecar cannot stop
    it, so the child notices it has lost its parent and stops, rather than spend minutes of
    the cores on a fine-tune nobody will serve."""
    launcher = Launcher(root=tmp_path / "side", keep=True)
    launcher.root.mkdir()
    try:
        side = launcher.start_sidecar({**_sidecar_env(model_cache), "MNEMO_SIDECAR_TRAINING__AUTO": "false"})
        stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(side.address))
        topics = ["the billing service", "the staging database", "the release train", "the mobile app"]
        for i in range(200):  # ~2,000 pairs: a fine-tune of minutes here
            topic = topics[i % len(topics)]
            stub.SubmitTrainingPairs(
                rpb.SubmitTrainingPairsRequest(
                    tenant_id="default",
                    session=rpb.TrainingSession(
                        session_id=f"s{i}",
                        query=f"who looks after {topic}?",
                        feature_names=["baseline_score"],
                        candidates=[
                            rpb.TrainingCandidate(
                                candidate=rpb.Candidate(
                                    id=f"m{i}-{j}",
                                    text=f"{topics[(i + j) % len(topics)]} is looked after by team {j}",
                                    baseline_score=1.0 - j / 10,
                                    features=[1.0 - j / 10],
                                ),
                                relevance=1.0 if j == 0 else 0.0,
                                baseline_rank=j + 1,
                            )
                            for j in range(10)
                        ],
                    ),
                ),
                timeout=10,
            )
        events = stub.Train(
            rpb.TrainRequest(tenant_id="default", models=[rpb.MODEL_KIND_CROSS_ENCODER], force=True),
            timeout=600,
        )
        for event in events:  # the child sends this once it has started fine-tuning
            if event.stage == "fine-tuning":
                break
        [training] = [pid for pid, cmd in _children(side.pid).items() if "spawn_main" in cmd]
        side.kill9()
        deadline = time.monotonic() + 20  # it checks between steps (well under a second each)
        while Path(f"/proc/{training}").exists() and "spawn_main" in _cmdline(training):
            assert time.monotonic() < deadline, "the training process outlived its sidecar"
            time.sleep(0.2)
    finally:
        launcher.stop()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _sidecar_env(model_cache: Path) -> dict[str, str]:
    """The embedding blend a sidecar prepares at start-up, from the test run's one export."""
    return {"MNEMO_SIDECAR_INFERENCE__EMBEDDER_CACHE_DIR": str(model_cache)}


def test_a_purge_cut_short_by_kill9_is_finished_by_its_retry_with_the_whole_count(
    spawn: Callable[..., Proc], tmp_path: Path, model_cache: Path
) -> None:
    """A forced purge is written a batch a transaction, recording its progress under its
    request_id. Killed midway, its retry after a restart purges the rest of what it was
    bound to (not memories stored since) and answers the whole count, once."""
    data = tmp_path / "data"
    # Small batches make the purge long enough to kill midway; a long index wait keeps the
    # index worker from competing for the lock meanwhile.
    env = base_env(
        model_cache,
        MNEMO_AUTH__ENABLED="false",
        MNEMO_STORAGE__PURGE_BATCH="10",
        MNEMO_INDEX__BATCH_WAIT_MS="60000",
    )
    proc = spawn(_serve_args(data), env=env)
    stub = pb_grpc.MemoryServiceStub(grpc.insecure_channel(proc.address))
    total = 2_000
    for start in range(0, total, 500):
        batch = [
            pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"ticket {i}: a note to purge"))
            for i in range(start, start + 500)
        ]
        stub.BatchCreateMemories(pb.BatchCreateMemoriesRequest(requests=batch), timeout=60)
    purge = pb.PurgeMemoriesRequest(all_memories=True, force=True, request_id="purge-through-a-crash")
    threading.Thread(target=lambda: _call_until_killed(stub.PurgeMemories, purge), daemon=True).start()
    deadline = time.monotonic() + 60
    while stub.GetStatus(pb.GetStatusRequest(), timeout=5).memory_count == total:
        assert time.monotonic() < deadline, "the purge never began"
    proc.kill9()

    proc2 = spawn(_serve_args(data), env=env)
    stub2 = pb_grpc.MemoryServiceStub(grpc.insecure_channel(proc2.address))
    left = stub2.GetStatus(pb.GetStatusRequest(), timeout=5).memory_count
    assert 0 < left < total, left  # killed midway
    kept = stub2.CreateMemory(
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="stored after the crash")), timeout=10
    ).memory
    assert stub2.PurgeMemories(purge, timeout=60).purge_count == total
    assert stub2.PurgeMemories(purge, timeout=60).purge_count == total  # answered from its record
    listed = stub2.ListMemories(pb.ListMemoriesRequest(page_size=10), timeout=10).memories
    assert [m.id for m in listed] == [kept.id]
    page = stub2.ListMemories(pb.ListMemoriesRequest(page_size=1000, show_deleted=True), timeout=10)
    sample = [m.id for m in page.memories if m.id != kept.id][:50]
    for mid in sample:  # each deleted once: no batch was written twice
        history = stub2.GetMemoryHistory(pb.GetMemoryHistoryRequest(id=mid), timeout=5).entries
        assert [e.action for e in history] == ["create", "delete"], mid


def _call_until_killed(call: Callable[..., object], request: object) -> None:
    """The call, whose server is killed during it."""
    with contextlib.suppress(grpc.RpcError):
        call(request, timeout=60)
