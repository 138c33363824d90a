"""StartSession / EndSession against a real server and a real sidecar (both on port 0)."""

from __future__ import annotations

import gc
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf import field_mask_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo.ranking.v1 import ranking_service_pb2_grpc as rpb_grpc
from mnemo.v1 import admin_service_pb2 as admin_pb
from mnemo.v1 import admin_service_pb2_grpc as admin_grpc
from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo_server.store import session_repo
from mnemo_server.store.database import WriteDomain
from mnemo_sidecar.config import SidecarConfig
from tests.conftest import ADMIN_KEY, LiveServer, TenantClient, bearer, error_info, provision

FACTS = [
    "The deploy pipeline runs on Thursdays at 14:00 UTC",
    "Release 4.2 was rolled back because of a slow migration",
    "Always tag releases with the ticket number",
    "The staging database is db-7 in eu-west-1",
    "Ana owns the billing service",
    "Customers in the EU must not see the beta banner",
    "The mobile app uses feature flags from the flag service",
    "Postgres upgrades need a maintenance window announced a week ahead",
]


def seed(t: TenantClient, project: str = "p") -> list[memory_pb2.Memory]:
    scope = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id=project)
    reqs = [
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f, scope=scope, pinned=i == 5))
        for i, f in enumerate(FACTS)
    ]
    res = t.memory().BatchCreateMemories(
        pb.BatchCreateMemoriesRequest(requests=reqs, wait_for_index=True), metadata=t.md, timeout=60
    )
    return [r.memory for r in res.results]


def start(t: TenantClient, sid: str, context: str, **kw: Any) -> pb.StartSessionResponse:
    resp: pb.StartSessionResponse = t.memory().StartSession(
        pb.StartSessionRequest(session_id=sid, project_id="p", context=context, **kw),
        metadata=t.md,
        timeout=10,
    )
    return resp


def tenant(live: LiveServer, name: str = "acme") -> TenantClient:
    return TenantClient(provision(live, name), live.channel())


def test_calls_without_a_deadline_queue_for_the_compute_gate(start_server: Callable[..., LiveServer]) -> None:
    """Recall and StartSession pass the compute gate; calls with no deadline at all (what
    grpc.aio clients send by default) that find every slot taken must wait, not fail."""
    live = start_server(server={"compute_slots": 1})
    t = tenant(live)
    seed(t)
    stub = t.memory()

    def recall(i: int) -> int:
        return len(stub.Recall(pb.RecallRequest(query=f"deploy pipeline {i}"), metadata=t.md).hits)

    def session(i: int) -> int:
        req = pb.StartSessionRequest(session_id=f"no-deadline-{i}", project_id="p", context="deploy")
        return len(stub.StartSession(req, metadata=t.md).memories)

    with futures.ThreadPoolExecutor(8) as pool:
        counts = list(pool.map(lambda i: (recall if i % 2 else session)(i), range(24)))
    assert all(n > 0 for n in counts)


def test_bundle_without_sidecar_is_baseline_packed_and_recorded(
    server: LiveServer, tenant_a: TenantClient
) -> None:
    seed(tenant_a)
    r = start(tenant_a, "s1", "why was the release rolled back?", token_budget=40, max_memories=5)
    assert r.ranking.path == pb.RANKING_PATH_BASELINE and r.ranking.fallback_reason == "no_sidecar"
    assert "rolled back" in r.memories[0].memory.content
    assert r.tokens_used <= 40 and r.dropped_count > 0 and len(r.memories) <= 5
    assert [m.rank for m in r.memories] == list(range(1, len(r.memories) + 1))
    assert (
        any("pinned" in m.origin for m in r.memories) or r.dropped_count
    )  # the pinned memory was a candidate
    assert r.context_text.startswith("## Relevant memories\n- [semantic:general] Release 4.2")
    got = (
        tenant_a.memory()
        .GetSession(pb.GetSessionRequest(session_id="s1"), metadata=tenant_a.md, timeout=5)
        .session
    )
    assert got.state == pb.SESSION_STATE_ACTIVE and [m.memory.id for m in got.injected] == [
        m.memory.id for m in r.memories
    ]


def _access_counts(live: LiveServer, ids: Sequence[str]) -> dict[str, int]:
    marks = ", ".join("?" * len(ids))
    sql = f"SELECT id, access_count FROM memories WHERE id IN ({marks})"
    rows = live.server.core.db.reader().execute(sql, list(ids)).fetchall()
    return {str(i): int(n) for i, n in rows}


def test_a_memory_pinned_later_is_a_pinned_candidate_of_the_next_session(
    server: LiveServer, tenant_a: TenantClient
) -> None:
    """A tenant that never pinned anything skips the pinned query; pinning one of its
    memories through UpdateMemory must bring the query (and the memory) back at once."""
    scope = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="p")
    stub = tenant_a.memory()
    made = [
        stub.CreateMemory(
            pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f, scope=scope)), metadata=tenant_a.md
        ).memory
        for f in FACTS
    ]
    before = start(tenant_a, "before-pin", "", max_memories=20)
    assert before.memories and not any("pinned" in m.origin for m in before.memories)
    oldest = made[0]
    stub.UpdateMemory(
        pb.UpdateMemoryRequest(
            memory=memory_pb2.Memory(id=oldest.id, pinned=True),
            update_mask=field_mask_pb2.FieldMask(paths=["pinned"]),
        ),
        metadata=tenant_a.md,
        timeout=10,
    )
    after = start(tenant_a, "after-pin", "", max_memories=20)
    origins = {m.memory.id: m.origin for m in after.memories}
    assert "pinned" in origins[oldest.id].split("+")
    assert [i for i, o in origins.items() if "pinned" in o] == [oldest.id]


def test_every_pinned_memory_is_a_candidate_even_when_newer_ones_fill_the_recent_list(
    server: LiveServer, tenant_a: TenantClient
) -> None:
    """Pinned memories are always candidates (memory.proto); 30 of them, older than a dozen
    unpinned notes, are all injected when the budget has room, each for being pinned."""
    scope = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="p")

    def create(content: str, pinned: bool) -> memory_pb2.Memory:
        req = pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=content, scope=scope, pinned=pinned))
        return tenant_a.memory().CreateMemory(req, metadata=tenant_a.md, timeout=10).memory

    pins = [create(f"Pinned rule {i}: run linter variant {i} before merging", True) for i in range(30)]
    for i in range(12):
        create(f"Unrelated recent note {i}", False)
    r = start(tenant_a, "all-pins", "", max_memories=100, token_budget=100_000)
    origins = {m.memory.id: m.origin.split("+") for m in r.memories}
    assert [p.id for p in pins if "pinned" not in origins.get(p.id, [])] == []
    assert r.dropped_count == 0


def test_recent_candidates_follow_every_acknowledged_write(
    server: LiveServer, tenant_a: TenantClient
) -> None:
    """StartSession's recent candidates come from lists of each scope's newest ids kept in
    memory: a memory deleted or created just before must be gone or there in the next
    session at once, and the lists, not DuckDB, answer once they are filled."""
    scope = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="p")
    stub = tenant_a.memory()

    def create(text: str) -> memory_pb2.Memory:
        req = pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=text, scope=scope))
        made: memory_pb2.Memory = stub.CreateMemory(req, metadata=tenant_a.md, timeout=10).memory
        return made

    def recent(sid: str) -> set[str]:
        r = start(tenant_a, sid, "", max_memories=20)  # no context: pinned and recent only
        return {m.memory.id for m in r.memories if "recent" in m.origin.split("+")}

    made = [create(f"Weekly report number {i} went out on time") for i in range(12)]
    assert recent("r1") == {m.id for m in made[-10:]}  # ranking.pool_recent = 10
    stub.DeleteMemory(pb.DeleteMemoryRequest(id=made[-1].id), metadata=tenant_a.md, timeout=5)
    assert recent("r2") == {m.id for m in made[-11:-1]}
    later = create("A later note on the weekly report")
    assert recent("r3") == {later.id} | {m.id for m in made[-10:-1]}
    use = stub.GetStatus(pb.GetStatusRequest(), metadata=tenant_a.md, timeout=5).cache_use
    assert use.recent_id_scopes >= 1 and use.recent_id_hits >= 2 and use.recent_id_misses >= 1
    # One call at a time, and nothing in the background adds or removes memories here: no
    # write raced a fill of the lists.
    assert use.recent_id_fills_skipped == 0


def test_injections_are_counted_as_accesses_in_batches_and_at_stop(
    start_server: Callable[..., LiveServer], tmp_path: Any
) -> None:
    live = start_server(tmp_path / "d", ranking={"access_flush_interval_s": 0.05})
    t = tenant(live)
    seed(t)
    first = [m.memory.id for m in start(t, "s1", "who owns billing?").memories]
    second = [m.memory.id for m in start(t, "s2", "who owns billing?").memories]
    assert first and set(first) & set(second)
    want = {i: first.count(i) + second.count(i) for i in set(first) | set(second)}
    wait_for(lambda: _access_counts(live, list(want)) == want, timeout=10)
    live.close()

    # A long interval: the counts not written yet are written when the server stops.
    live = start_server(tmp_path / "d", ranking={"access_flush_interval_s": 3600})
    t = TenantClient(t.token, live.channel())  # keys are stored: the same tenant
    third = [m.memory.id for m in start(t, "s3", "who owns billing?").memories]
    assert _access_counts(live, third) == {i: want.get(i, 0) for i in third}  # not yet
    live.close()
    live = start_server(tmp_path / "d")
    assert _access_counts(live, third) == {i: want.get(i, 0) + 1 for i in third}


def test_end_session_scores_continuity_and_validates(server: LiveServer, tenant_a: TenantClient) -> None:
    seed(tenant_a)
    r = start(tenant_a, "s1", "how do releases work here?", max_memories=4)
    first, second = r.memories[0].memory.id, r.memories[1].memory.id
    stub = tenant_a.memory()
    with pytest.raises(grpc.RpcError) as err:
        stub.EndSession(
            pb.EndSessionRequest(
                session_id="s1",
                feedback=[pb.MemoryFeedback(memory_id="00000000-0000-0000-0000-000000000000", used=True)],
            ),
            metadata=tenant_a.md,
            timeout=5,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(err.value)[1] == ["feedback[0].memory_id"]
    with pytest.raises(grpc.RpcError) as err:
        stub.EndSession(
            pb.EndSessionRequest(session_id="s1", feedback=[pb.MemoryFeedback(memory_id=first, relevance=2)]),
            metadata=tenant_a.md,
            timeout=5,
        )
    assert error_info(err.value)[1] == ["feedback[0].relevance"]
    with pytest.raises(grpc.RpcError) as err:  # two verdicts on one memory: which is meant?
        stub.EndSession(
            pb.EndSessionRequest(
                session_id="s1",
                feedback=[
                    pb.MemoryFeedback(memory_id=first, relevance=1),
                    pb.MemoryFeedback(memory_id=first, relevance=-1),
                ],
            ),
            metadata=tenant_a.md,
            timeout=5,
        )
    assert error_info(err.value)[1] == ["feedback[1].memory_id"]
    transcript = f"We discussed: {r.memories[1].memory.content}"
    req = pb.EndSessionRequest(
        session_id="s1",
        feedback=[pb.MemoryFeedback(memory_id=first, used=True)],
        transcript=transcript,
        request_id="end-1",
    )
    done = stub.EndSession(req, metadata=tenant_a.md, timeout=5)
    by_id = {c.memory_id: c for c in done.continuity}
    assert by_id[first].relevance == 1.0 and by_id[first].source == "feedback"
    assert by_id[second].relevance == 1.0 and by_id[second].source == "transcript"
    assert done.training_pairs == len(r.memories)
    assert stub.EndSession(req, metadata=tenant_a.md, timeout=5) == done  # a retry replays
    with pytest.raises(grpc.RpcError) as err:
        stub.EndSession(pb.EndSessionRequest(session_id="s1"), metadata=tenant_a.md, timeout=5)
    assert (
        err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        and error_info(err.value)[0] == "SESSION_ENDED"
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.EndSession(pb.EndSessionRequest(session_id="nope"), metadata=tenant_a.md, timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_start_session_retry_and_conflict(server: LiveServer, tenant_a: TenantClient) -> None:
    seed(tenant_a)
    first = start(tenant_a, "s1", "staging database", request_id="r1")
    again = start(tenant_a, "s1", "staging database", request_id="r1")
    assert [m.memory.id for m in again.memories] == [m.memory.id for m in first.memories]
    with pytest.raises(grpc.RpcError) as err:
        start(tenant_a, "s1", "something else")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.RpcError) as err:
        start(tenant_a, "bad id with spaces", "x")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error_info(err.value)[1] == ["session_id"]


def test_a_replayed_session_hides_memories_deleted_since_and_still_fits_its_budget(
    server: LiveServer, tenant_a: TenantClient
) -> None:
    """A retried StartSession and GetSession show the recorded bundle as it stands now: a
    memory deleted since is gone (text included), and one updated since beyond the budget
    is left out rather than overflowing the budget the reply reports."""
    seed(tenant_a)
    stub = tenant_a.memory()
    first = start(tenant_a, "s1", "staging database deploy", request_id="r1", token_budget=200)
    injected = [m.memory for m in first.memories]
    assert len(injected) >= 3, "precondition: several memories injected"
    gone, grown = injected[0], injected[1]
    stub.DeleteMemory(pb.DeleteMemoryRequest(id=gone.id), metadata=tenant_a.md, timeout=5)
    stub.UpdateMemory(
        pb.UpdateMemoryRequest(
            memory=memory_pb2.Memory(id=grown.id, content="grown " * 400),
            update_mask=field_mask_pb2.FieldMask(paths=["content"]),
        ),
        metadata=tenant_a.md,
        timeout=5,
    )
    again = start(tenant_a, "s1", "staging database deploy", request_id="r1", token_budget=200)
    kept = [m.memory.id for m in first.memories[2:]]
    assert [m.memory.id for m in again.memories] == kept
    assert [m.rank for m in again.memories] == [m.rank for m in first.memories[2:]]  # the recorded ranks
    assert gone.content not in again.context_text and "grown" not in again.context_text
    assert again.tokens_used == sum(m.tokens for m in again.memories) <= again.token_budget == 200
    assert again.dropped_count == first.dropped_count + 2
    session = stub.GetSession(pb.GetSessionRequest(session_id="s1"), metadata=tenant_a.md, timeout=5).session
    assert [m.memory.id for m in session.injected] == kept


R = TypeVar("R")


def race(call: Callable[[str], R], request_ids: list[str]) -> list[R | grpc.RpcError]:
    """Send one call per request id at the same moment; each answer or error, in order."""
    barrier = threading.Barrier(len(request_ids))

    def one(request_id: str) -> R | grpc.RpcError:
        barrier.wait()
        try:
            return call(request_id)
        except grpc.RpcError as err:
            return err

    with futures.ThreadPoolExecutor(len(request_ids)) as pool:
        return list(pool.map(one, request_ids))


def codes(results: Sequence[object]) -> list[str]:
    return sorted(r.code().name if isinstance(r, grpc.RpcError) else "OK" for r in results)


def test_concurrent_copies_of_a_start_session_get_one_answer(
    server: LiveServer, tenant_a: TenantClient
) -> None:
    """A client whose StartSession timed out retries while the first copy is still running
    (what a busy server invites). Copies with the same request id all get the session that
    was recorded; a different request for the same session id gets ALREADY_EXISTS. Never an
    internal error, and one session is recorded."""
    seed(tenant_a)
    copies = race(lambda rid: start(tenant_a, "race-copies", "staging database", request_id=rid), ["r"] * 4)
    assert codes(copies) == ["OK"] * 4, copies
    answers = [r for r in copies if isinstance(r, pb.StartSessionResponse)]
    first = [m.memory.id for m in answers[0].memories]
    assert first and all([m.memory.id for m in a.memories] == first for a in answers)

    rivals = race(
        lambda rid: start(tenant_a, "race-rivals", "staging database", request_id=rid),
        [f"rival-{i}" for i in range(4)],
    )
    assert codes(rivals) == ["ALREADY_EXISTS"] * 3 + ["OK"]
    got = tenant_a.memory().GetSession(pb.GetSessionRequest(session_id="race-rivals"), metadata=tenant_a.md)
    assert got.session.session_id == "race-rivals"


def test_sessions_started_at_once_are_each_recorded_with_their_candidates(
    server: LiveServer, tenant_a: TenantClient
) -> None:
    """StartSessions that queue while another is being recorded share its transaction
    (group commit): each is recorded with its own candidates, and a taken id among them
    fails only its own call."""
    seed(tenant_a)
    start(tenant_a, "at-once-taken", "staging database")
    ids = [f"at-once-{i}" for i in range(6)] + ["at-once-taken"]
    answers = race(lambda sid: start(tenant_a, sid, "staging database"), ids)
    assert codes(answers) == ["ALREADY_EXISTS"] + ["OK"] * 6, answers
    taken = answers[-1]
    assert isinstance(taken, grpc.RpcError) and error_info(taken)[0] == "SESSION_EXISTS"
    for sid, answer in zip(ids[:6], answers[:6], strict=True):
        assert isinstance(answer, pb.StartSessionResponse) and answer.memories
        ended = tenant_a.memory().EndSession(
            pb.EndSessionRequest(session_id=sid, transcript="the staging database"),
            metadata=tenant_a.md,
            timeout=10,
        )
        assert ended.training_pairs > 0  # pairs come from the candidates recorded with it


def test_concurrent_end_sessions_end_it_once(server: LiveServer, tenant_a: TenantClient) -> None:
    """EndSession reads and works out its pairs before taking the write lock, then checks
    the session is still active inside it: copies of one request all get its answer, rival
    requests get SESSION_ENDED (a second ending would also fail on the training-pair
    outbox's key, as an INTERNAL error)."""
    seed(tenant_a)
    for sid in ("end-copies", "end-rivals"):
        start(tenant_a, sid, "staging database")

    def end(sid: str, request_id: str) -> pb.EndSessionResponse:
        resp: pb.EndSessionResponse = tenant_a.memory().EndSession(
            pb.EndSessionRequest(session_id=sid, transcript="the staging database", request_id=request_id),
            metadata=tenant_a.md,
            timeout=10,
        )
        return resp

    copies = race(lambda rid: end("end-copies", rid), ["r"] * 4)
    assert codes(copies) == ["OK"] * 4, copies
    answers = [c for c in copies if isinstance(c, pb.EndSessionResponse)]
    assert all(a == answers[0] for a in answers) and answers[0].training_pairs > 0

    rivals = race(lambda rid: end("end-rivals", rid), [f"rival-{i}" for i in range(4)])
    assert codes(rivals) == ["FAILED_PRECONDITION"] * 3 + ["OK"]
    assert all(error_info(r)[0] == "SESSION_ENDED" for r in rivals if isinstance(r, grpc.RpcError))
    got = tenant_a.memory().GetSession(pb.GetSessionRequest(session_id="end-rivals"), metadata=tenant_a.md)
    assert got.session.state == pb.SESSION_STATE_ENDED


def test_end_sessions_that_queue_for_the_lock_are_written_together_each_with_its_own_answer(
    start_server: Callable[..., LiveServer],
) -> None:
    """EndSessions that queue while the sessions' write lock is held go into one
    transaction (group commit), each with its own continuity and pairs. When one of a group
    fails (its session ended by another of the group), the group is written again one by
    one: only that call fails, the others are written once. An end of a session already
    ended or unknown when it is read is refused at once, without joining a group."""
    live = start_server(ranking={"delivery_interval_s": 3600, "delivery_gather_s": 3600})
    t, core = tenant(live), live.server.core
    seed(t)

    def end(sid: str) -> pb.EndSessionResponse:
        resp: pb.EndSessionResponse = t.memory().EndSession(
            pb.EndSessionRequest(session_id=sid, transcript="the staging database", request_id=f"end-{sid}"),
            metadata=t.md,
            timeout=30,
        )
        return resp

    def ended_while_the_lock_is_held(
        sids: list[str], call: Callable[[str], object] = end
    ) -> tuple[list[object], int]:
        """Each call's answer, and the sessions' transactions they took."""
        before = core.db.write_lock_stats[WriteDomain.SESSIONS].transactions
        queue = core.sessions.end_writes
        with futures.ThreadPoolExecutor(len(sids)) as pool:
            with core.db.transaction(WriteDomain.SESSIONS):
                # The first call leads: it takes itself from the queue and waits for the lock.
                calls = [pool.submit(call, sids[0])]
                wait_until(lambda: queue.writing == 1)
                # The others queue behind it, for the next group.
                calls += [pool.submit(call, sid) for sid in sids[1:]]
                wait_until(lambda: queue.waiting == len(sids) - 1)
            answers: list[object] = []
            for c in calls:
                try:
                    answers.append(c.result())
                except grpc.RpcError as err:
                    answers.append(err)
        # Less the test's own transaction.
        return answers, core.db.write_lock_stats[WriteDomain.SESSIONS].transactions - before - 1

    def wait_until(done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 20
        while not done():
            assert time.monotonic() < deadline, "the EndSessions did not queue"
            time.sleep(0.01)

    sids = [f"together-{i}" for i in range(5)]
    for sid in sids:
        start(t, sid, "staging database")
    answers, transactions = ended_while_the_lock_is_held(sids)
    assert codes(answers) == ["OK"] * 5, answers
    assert transactions == 2  # the leader's, then the four that queued behind it
    assert all(isinstance(a, pb.EndSessionResponse) and a.training_pairs > 0 for a in answers)
    assert [end(sid) for sid in sids] == answers  # each request_id recorded with its own answer
    assert core.delivery.pending() == 5  # one outbox row each

    again = [f"again-{i}" for i in range(4)]
    for sid in again:
        start(t, sid, "staging database")
    end(again[2])

    def end_as(sid: str, request_id: str) -> object:
        return t.memory().EndSession(
            pb.EndSessionRequest(session_id=sid, request_id=request_id), metadata=t.md, timeout=30
        )

    def end_or_rival(sid: str) -> object:
        # "rival": another request for again[1], queued in the same group as its first end,
        # both having read it active: SESSION_ENDED inside the write, which fails the group.
        return end_as(again[1], "rival") if sid == "rival" else end(sid)

    with core.db.transaction(WriteDomain.SESSIONS):
        # Ended, or never started, when read: refused while the lock is still held, so they
        # joined no group (they used to, and rolled back the group they joined).
        for sid, code in ((again[2], "FAILED_PRECONDITION"), ("never-started", "NOT_FOUND")):
            with pytest.raises(grpc.RpcError) as refused:
                end_as(sid, f"late-{sid}")
            assert refused.value.code().name == code, refused.value
        assert core.sessions.end_writes.waiting == 0 and core.sessions.end_writes.writing == 0

    answers, transactions = ended_while_the_lock_is_held(
        [again[0], again[1], "rival", again[3]], end_or_rival
    )
    assert codes(answers) == ["FAILED_PRECONDITION", "OK", "OK", "OK"], answers
    assert transactions == 1 + 1 + 3  # the leader's, the group's (rolled back), then each alone
    # again[1]'s two ends queued side by side: whichever the group wrote first ended it.
    retries = {1: lambda: end(again[1]), 2: lambda: end_as(again[1], "rival")}
    (won,) = [i for i in (1, 2) if isinstance(answers[i], pb.EndSessionResponse)]
    (lost,) = [i for i in (1, 2) if isinstance(answers[i], grpc.RpcError)]
    assert error_info(answers[lost])[0] == "SESSION_ENDED"  # type: ignore[arg-type]
    for sid in (again[0], again[1], again[3]):
        got = t.memory().GetSession(pb.GetSessionRequest(session_id=sid), metadata=t.md, timeout=5)
        assert got.session.state == pb.SESSION_STATE_ENDED
    assert core.delivery.pending() == 5 + 4  # the first round's and this round's, once each
    # A retry of the end that was written is answered from its record, though the session
    # has ended since; the other's retry is refused again.
    assert retries[won]() == answers[won]
    with pytest.raises(grpc.RpcError) as again_refused:
        retries[lost]()
    assert error_info(again_refused.value)[0] == "SESSION_ENDED"


def test_one_request_id_for_a_create_and_an_end_at_once_gets_one_effect(
    server: LiveServer, tenant_a: TenantClient
) -> None:
    """CreateMemory and EndSession write under different locks, so a client that sends
    one request_id to both at the same moment makes DuckDB refuse the second commit: that
    call gets ABORTED (WRITE_CONFLICT) with nothing written, or REQUEST_ID_REUSED if it came
    second; never INTERNAL, and its retry gets REQUEST_ID_REUSED."""
    seed(tenant_a)
    scope = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="p")
    for n in range(6):
        sid, content, rid = f"shared-{n}", f"note {n} about the shared request id", f"shared-{n}"
        start(tenant_a, sid, "staging database")

        def create(content: str = content, rid: str = rid) -> object:
            return tenant_a.memory().CreateMemory(
                pb.CreateMemoryRequest(
                    memory=memory_pb2.Memory(content=content, scope=scope), request_id=rid
                ),
                metadata=tenant_a.md,
                timeout=10,
            )

        def end(sid: str = sid, rid: str = rid) -> object:
            return tenant_a.memory().EndSession(
                pb.EndSessionRequest(session_id=sid, transcript="the staging database", request_id=rid),
                metadata=tenant_a.md,
                timeout=10,
            )

        calls: dict[str, Callable[[], object]] = {"create": create, "end": end}
        results = dict(zip(calls, race(lambda which, c=calls: c[which](), list(calls)), strict=True))
        assert codes(list(results.values())).count("OK") == 1, results
        for which, r in results.items():
            if isinstance(r, grpc.RpcError):
                assert r.code() in (grpc.StatusCode.ABORTED, grpc.StatusCode.INVALID_ARGUMENT), r
                assert error_info(r)[0] in ("WRITE_CONFLICT", "REQUEST_ID_REUSED"), r
                with pytest.raises(grpc.RpcError) as retry:
                    calls[which]()
                assert error_info(retry.value)[0] == "REQUEST_ID_REUSED"
        session = tenant_a.memory().GetSession(pb.GetSessionRequest(session_id=sid), metadata=tenant_a.md)
        ended = session.session.state == pb.SESSION_STATE_ENDED
        assert ended == isinstance(results["end"], pb.EndSessionResponse)
        listed = tenant_a.memory().ListMemories(pb.ListMemoriesRequest(page_size=100), metadata=tenant_a.md)
        assert [m.content for m in listed.memories].count(content) == (0 if ended else 1)


def test_sessions_are_tenant_isolated(
    server: LiveServer, tenant_a: TenantClient, tenant_b: TenantClient
) -> None:
    seed(tenant_a)
    r = start(tenant_a, "s1", "billing owner")
    assert r.memories
    assert not start(tenant_b, "s1", "billing owner").memories  # B's own, empty session of the same name
    with pytest.raises(grpc.RpcError) as err:
        tenant_b.memory().EndSession(
            pb.EndSessionRequest(
                session_id="s1", feedback=[pb.MemoryFeedback(memory_id=r.memories[0].memory.id, used=True)]
            ),
            metadata=tenant_b.md,
            timeout=5,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # not a candidate of B's session
    got = tenant_a.memory().GetSession(pb.GetSessionRequest(session_id="s1"), metadata=tenant_a.md, timeout=5)
    assert got.session.state == pb.SESSION_STATE_ACTIVE


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def _feedback_delivered(t: TenantClient, session_id: str) -> bool:
    got = t.memory().GetSession(pb.GetSessionRequest(session_id=session_id), metadata=t.md, timeout=5)
    return bool(got.session.feedback_delivered)


def test_cold_start_then_feedback_reaches_the_sidecar(
    start_server: Callable[..., LiveServer], start_sidecar: Callable[..., Any]
) -> None:
    side = start_sidecar()
    live = start_server(
        ranking={"sidecar_address": f"127.0.0.1:{side.port}", "start_session_deadline_ms": 2000}
    )
    t = tenant(live)
    seed(t)
    r = start(t, "s1", "who owns billing?")
    assert r.ranking.path == pb.RANKING_PATH_BASELINE and r.ranking.fallback_reason == "cold_start"
    t.memory().EndSession(
        pb.EndSessionRequest(
            session_id="s1", feedback=[pb.MemoryFeedback(memory_id=r.memories[0].memory.id, used=True)]
        ),
        metadata=t.md,
        timeout=5,
    )
    wait_for(lambda: _feedback_delivered(t, "s1"))
    assert side.store.counts("acme") == (1, len(r.memories))
    assert side.store.counts("tenant-a") == (0, 0)
    # A cold start is a session ordered by the baseline; no sidecar call failed.
    status = t.memory().GetStatus(pb.GetStatusRequest(), metadata=t.md, timeout=5)
    assert dict(status.ranking_fallbacks) == {"cold_start": 1} and not status.sidecar_call_failures


def test_a_memory_longer_than_the_sidecar_takes_costs_no_session_its_pairs(
    start_server: Callable[..., LiveServer], start_sidecar: Callable[..., Any]
) -> None:
    """With limits.max_content_chars raised past the sidecar's 20,000 characters, a session
    whose pool held such a memory had its Score refused and its pairs parked for good."""
    side = start_sidecar()
    live = start_server(
        limits={"max_content_chars": 30_000},
        ranking={"sidecar_address": f"127.0.0.1:{side.port}", "start_session_deadline_ms": 2000},
    )
    t = tenant(live)
    seed(t)
    scope = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="p")
    long_text = "Ana owns the billing service and its runbook. " + "Runbook step follows. " * 1_200
    assert 25_000 < len(long_text) <= 30_000
    long = t.memory().CreateMemory(
        pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=long_text, scope=scope), wait_for_index=True),
        metadata=t.md,
        timeout=30,
    )
    start(t, "s1", "who owns billing?")
    t.memory().EndSession(
        pb.EndSessionRequest(
            session_id="s1", feedback=[pb.MemoryFeedback(memory_id=long.memory.id, used=True)]
        ),
        metadata=t.md,
        timeout=5,
    )
    wait_for(lambda: _feedback_delivered(t, "s1"))
    assert live.server.core.delivery.parked == 0 and side.store.counts("acme")[0] == 1
    status = t.memory().GetStatus(pb.GetStatusRequest(), metadata=t.md, timeout=5)
    assert not status.sidecar_call_failures, dict(status.sidecar_call_failures)


def test_training_pairs_carry_query_and_neighbour_features(
    start_server: Callable[..., LiveServer], start_sidecar: Callable[..., Any]
) -> None:
    """A chat's turns, in order: the answer follows the question, and the features the
    sidecar learns from say so (through Recall's neighbours, the outbox and the pair store)."""
    side = start_sidecar()
    live = start_server(
        ranking={
            "sidecar_address": f"127.0.0.1:{side.port}",
            "delivery_interval_s": 0.05,
            "access_flush_interval_s": 0.05,
        }
    )
    t = tenant(live)
    scope = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="p")
    turns = [
        "Mel: How was the weekend?",
        "Ann: Quiet, I mostly read",
        "Mel: Which city did you visit in spring?",
        "Ann: We went to Lisbon and loved the trams",
        "Mel: Lovely, I should go there too",
    ]
    reqs = [
        pb.CreateMemoryRequest(
            memory=memory_pb2.Memory(content=c, scope=scope, source=common_pb2.Source(session_id="chat-1"))
        )
        for c in turns
    ]
    created = t.memory().BatchCreateMemories(
        pb.BatchCreateMemoriesRequest(requests=reqs, wait_for_index=True), metadata=t.md, timeout=60
    )
    ids = [r.memory.id for r in created.results]
    r = start(t, "s1", "Which city did Ann visit in spring?")
    t.memory().EndSession(
        pb.EndSessionRequest(session_id="s1", feedback=[pb.MemoryFeedback(memory_id=ids[3], used=True)]),
        metadata=t.md,
        timeout=5,
    )
    wait_for(lambda: side.store.counts("acme")[0] == 1)
    (stored,) = side.store.sessions("acme")
    features = {
        c.candidate.id: dict(zip(stored.feature_names, c.candidate.features, strict=True))
        for c in stored.candidates
    }
    assert set(features) == {m.memory.id for m in r.memories} == set(ids)
    question, answer, last = features[ids[2]], features[ids[3]], features[ids[4]]
    assert question["has_question"] == 1.0 and answer["has_question"] == 0.0
    assert answer["prev_has_question"] == 1.0 and question["next_has_question"] == 0.0
    assert features[ids[1]]["next_has_question"] == 1.0
    # The answer shares no term with the query ("Ann" is its speaker prefix, not its text).
    assert answer["prev_query_overlap"] == question["query_overlap"] > 0.0 == answer["query_overlap"]
    assert answer["prev_baseline_rel"] == question["baseline_rel"] > 0.0
    assert last["next_baseline_rel"] == 0.0 and features[ids[0]]["prev_baseline_rel"] == 0.0
    assert {f["access_log"] for f in features.values()} == {0.0}

    # A second session sees the first one's injections counted, once their batch is
    # written (access_counts: at most one interval later).
    wait_for(lambda: live.server.core.access_counts.written >= len(r.memories), timeout=10)
    r2 = start(t, "s2", "Which city did Ann visit in spring?")
    t.memory().EndSession(pb.EndSessionRequest(session_id="s2"), metadata=t.md, timeout=5)
    wait_for(lambda: side.store.counts("acme")[0] == 2)
    second = side.store.sessions("acme")[1]
    access = {
        c.candidate.id: c.candidate.features[second.feature_names.index("access_log")]
        for c in second.candidates
    }
    assert access == {m.memory.id: pytest.approx(math.log1p(1)) for m in r.memories}
    assert {m.memory.id for m in r2.memories} == set(ids)

    # Feedback may rate a candidate that was not injected: the pairs are the injected ones
    # and the rated one, each with its memory's text.
    r3 = start(t, "s3", "Which city did Ann visit in spring?", max_memories=2)
    injected = [m.memory.id for m in r3.memories]
    outside = next(i for i in ids if i not in injected)  # a candidate still (recent, same scope)
    t.memory().EndSession(
        pb.EndSessionRequest(session_id="s3", feedback=[pb.MemoryFeedback(memory_id=outside, relevance=0.5)]),
        metadata=t.md,
        timeout=5,
    )
    wait_for(lambda: side.store.counts("acme")[0] == 3)
    third = side.store.sessions("acme")[2]
    assert len(injected) == 2
    assert {c.candidate.id: c.candidate.text for c in third.candidates} == {
        i: turns[ids.index(i)] for i in [*injected, outside]
    }


def _end_sessions_while_the_sidecar_is_down(t: TenantClient, n: int) -> None:
    for i in range(n):
        r = start(t, f"s{i}", "deploy pipeline schedule")
        assert r.ranking.path == pb.RANKING_PATH_FALLBACK  # no error, baseline order
        t.memory().EndSession(
            pb.EndSessionRequest(
                session_id=f"s{i}", feedback=[pb.MemoryFeedback(memory_id=r.memories[0].memory.id, used=True)]
            ),
            metadata=t.md,
            timeout=5,
        )


def test_sessions_ending_together_are_delivered_and_recorded_in_one_transaction(
    start_server: Callable[..., LiveServer], start_sidecar: Callable[..., Any]
) -> None:
    """A delivery pass sends each session's pairs, then marks them all delivered in one
    transaction under the sessions' write lock (not one each)."""
    side = start_sidecar()
    # The delivery loop waits past the test, so the pass below is the only one.
    ranking = {
        "sidecar_address": f"127.0.0.1:{side.port}",
        "delivery_interval_s": 3600,
        "delivery_gather_s": 3600,
    }
    live = start_server(ranking=ranking)
    t = tenant(live)
    seed(t)
    for i in range(3):
        r = start(t, f"s{i}", "who owns billing?")
        t.memory().EndSession(
            pb.EndSessionRequest(
                session_id=f"s{i}", feedback=[pb.MemoryFeedback(memory_id=r.memories[0].memory.id, used=True)]
            ),
            metadata=t.md,
            timeout=5,
        )
    core = live.server.core
    assert core.delivery.pending() == 3
    before = core.db.write_lock_stats[WriteDomain.SESSIONS].transactions
    assert core.delivery.deliver_due() == 3
    assert core.db.write_lock_stats[WriteDomain.SESSIONS].transactions == before + 1
    assert core.delivery.pending() == 0
    assert side.store.counts("acme")[0] == 3
    delivered = [
        t.memory().GetSession(pb.GetSessionRequest(session_id=f"s{i}"), metadata=t.md, timeout=5).session
        for i in range(3)
    ]
    assert all(s.feedback_delivered for s in delivered)
    assert core.delivery.deliver_due() == 0  # nothing left to send


def test_a_session_with_nothing_to_score_queues_nothing(server: LiveServer, tenant_a: TenantClient) -> None:
    """A session that injected nothing (an empty tenant) and got no feedback has no training
    pairs: nothing is queued for the sidecar, and its feedback counts as delivered."""
    assert not start(tenant_a, "empty", "anything at all?").memories
    stub = tenant_a.memory()
    done = stub.EndSession(pb.EndSessionRequest(session_id="empty"), metadata=tenant_a.md, timeout=5)
    assert done.training_pairs == 0 and not done.continuity
    assert server.server.core.delivery.pending() == 0
    got = stub.GetSession(pb.GetSessionRequest(session_id="empty"), metadata=tenant_a.md, timeout=5).session
    assert got.state == pb.SESSION_STATE_ENDED and got.feedback_delivered


def test_feedback_survives_sidecar_and_server_restarts(
    start_server: Callable[..., LiveServer], start_sidecar: Callable[..., Any], tmp_path: Any
) -> None:
    side = start_sidecar(data_dir=tmp_path / "side")
    port = side.port
    data = tmp_path / "srv"
    ranking = {"sidecar_address": f"127.0.0.1:{port}", "delivery_interval_s": 0.05, "breaker_cooldown_s": 0.2}
    live = start_server(data_dir=data, ranking=ranking)
    t = tenant(live)
    seed(t)
    side.stop(0.1)  # the sidecar goes down
    _end_sessions_while_the_sidecar_is_down(t, 3)
    assert live.server.core.delivery.pending() == 3
    live.close()  # ...and the server restarts too, with the feedback still undelivered
    live2 = start_server(data_dir=data, ranking=ranking)
    assert live2.server.core.delivery.pending() == 3
    side2 = start_sidecar(data_dir=tmp_path / "side", server={"port": port})  # the sidecar is back
    wait_for(lambda: live2.server.core.delivery.pending() == 0)
    assert side2.store.counts("acme")[0] == 3


def test_a_session_id_started_again_after_retention_delivers_pairs_of_its_own(
    start_server: Callable[..., LiveServer], start_sidecar: Callable[..., Any]
) -> None:
    """Retention purges an ended session and its id may be started again: the new session's
    pairs are stored by the sidecar as a session of their own, not taken for a retried
    delivery of the old one's (the sidecar keeps one session per id it is sent)."""
    side = start_sidecar()
    ranking = {"sidecar_address": f"127.0.0.1:{side.port}", "delivery_interval_s": 0.05}
    live = start_server(ranking=ranking, retention={"session_days": 1 / 86_400, "interval_s": 0.2})
    t = tenant(live)
    seed(t)
    stub = t.memory()
    pairs = 0
    for n, context in enumerate(("deploy pipeline schedule", "who owns billing?"), start=1):
        r = start(t, "daily-review", context)
        used = [pb.MemoryFeedback(memory_id=r.memories[0].memory.id, used=True)]
        pairs += stub.EndSession(
            pb.EndSessionRequest(session_id="daily-review", feedback=used), metadata=t.md, timeout=5
        ).training_pairs
        wait_for(lambda n=n: side.store.counts("acme")[0] == n, timeout=30)
        assert side.store.counts("acme")[1] == pairs

        def purged() -> bool:
            try:
                stub.GetSession(pb.GetSessionRequest(session_id="daily-review"), metadata=t.md, timeout=5)
            except grpc.RpcError as err:
                return err.code() == grpc.StatusCode.NOT_FOUND
            return False

        wait_for(purged, timeout=30)
    assert [s.query for s in side.store.sessions("acme")] == ["deploy pipeline schedule", "who owns billing?"]


def test_feedback_that_can_never_be_delivered_is_parked_and_holds_back_nothing(
    start_server: Callable[..., LiveServer], start_sidecar: Callable[..., Any], tmp_path: Any
) -> None:
    """An outbox row whose payload no longer decodes (the oldest), and pairs the sidecar
    refuses as invalid, are kept with their error and not tried again; the rows queued
    between and after them are delivered."""
    side = start_sidecar(data_dir=tmp_path / "side")
    port = side.port
    ranking = {"sidecar_address": f"127.0.0.1:{port}", "delivery_interval_s": 0.05, "breaker_cooldown_s": 0.2}
    side.stop(0.1)
    live = start_server(ranking=ranking)
    t = tenant(live)
    seed(t)
    _end_sessions_while_the_sidecar_is_down(t, 4)
    db = live.server.core.db
    with db.transaction(WriteDomain.SESSIONS) as cur:
        cur.execute("UPDATE sidecar_outbox SET payload = ? WHERE session_id = 's0'", [b"x\x9c damaged"])
        (stored,) = cur.execute("SELECT payload FROM sidecar_outbox WHERE session_id = 's2'").fetchall()[0]
        refused = session_repo.decode_payload(bytes(stored))
        refused["candidates"][0]["relevance"] = 2.0  # outside -1..1: the sidecar says INVALID_ARGUMENT
        update = "UPDATE sidecar_outbox SET payload = ? WHERE session_id = ?"
        cur.execute(update, [session_repo.encode_payload(refused), "s2"])
    side2 = start_sidecar(data_dir=tmp_path / "side", server={"port": port})

    def status() -> pb.GetStatusResponse:
        return t.memory().GetStatus(pb.GetStatusRequest(), metadata=t.md, timeout=5)

    wait_for(lambda: status().feedback_outbox_pending == 0)
    assert status().feedback_outbox_undeliverable == 2
    assert side2.store.counts("acme")[0] == 2  # s1 and s3

    def undelivered() -> list[tuple[str, int, str]]:
        rows = db.reader().execute(
            "SELECT session_id, attempts, last_error FROM sidecar_outbox WHERE delivered_ns IS NULL "
            "ORDER BY session_id"
        )
        return [tuple(r) for r in rows.fetchall()]

    parked = undelivered()
    assert [r[0] for r in parked] == ["s0", "s2"]
    assert "does not decode" in parked[0][2]
    assert "refuses" in parked[1][2] and "relevance" in parked[1][2]
    assert live.server.core.delivery.parked == 2
    time.sleep(0.5)  # ten delivery passes: neither is tried again
    assert undelivered() == parked

    # Once what refused them is fixed (here: the pairs), an operator queues them again; the
    # one that still does not decode is parked again.
    with db.transaction(WriteDomain.SESSIONS) as cur:
        refused["candidates"][0]["relevance"] = 1.0
        cur.execute(update, [session_repo.encode_payload(refused), "s2"])
    admin = admin_grpc.AdminServiceStub(live.channel())
    with pytest.raises(grpc.RpcError) as denied:
        admin.RetryUndeliverableFeedback(
            admin_pb.RetryUndeliverableFeedbackRequest(), metadata=t.md, timeout=5
        )
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED  # a tenant's key is not enough
    retried = admin.RetryUndeliverableFeedback(
        admin_pb.RetryUndeliverableFeedbackRequest(), metadata=bearer(ADMIN_KEY), timeout=5
    )
    assert retried.requeued == 2
    wait_for(lambda: side2.store.counts("acme")[0] == 3)
    wait_for(lambda: [r[0] for r in undelivered()] == ["s0"] and status().feedback_outbox_undeliverable == 1)
    assert status().feedback_outbox_pending == 0


class StalledRanking(rpb_grpc.RankingServiceServicer):
    """A sidecar that accepts calls and never answers (like a SIGSTOPped process) until
    released; its health check stalls the same way, or with `healthy`, answers at once (a
    sidecar up but slower than the calls' budgets)."""

    def __init__(self, healthy: bool = False) -> None:
        self.release = threading.Event()
        self.healthy = healthy
        self.calls = 0
        self.health_checks = 0

    def Score(self, request: rpb.ScoreRequest, context: grpc.ServicerContext) -> rpb.ScoreResponse:
        self.calls += 1
        self.release.wait(30)
        return rpb.ScoreResponse(cold_start=True)

    def Rerank(self, request: rpb.RerankRequest, context: grpc.ServicerContext) -> rpb.RerankResponse:
        self.calls += 1
        self.release.wait(30)
        return rpb.RerankResponse()


class StalledHealth(health_pb2_grpc.HealthServicer):
    def __init__(self, ranking: StalledRanking) -> None:
        self.ranking = ranking

    def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext) -> Any:
        self.ranking.health_checks += 1
        if not self.ranking.healthy:
            self.ranking.release.wait(30)
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


@pytest.fixture
def stalled() -> Iterator[tuple[StalledRanking, int]]:
    yield from _serve_stalled(StalledRanking())


@pytest.fixture
def slow_but_healthy() -> Iterator[tuple[StalledRanking, int]]:
    yield from _serve_stalled(StalledRanking(healthy=True))


def _serve_stalled(servicer: StalledRanking) -> Iterator[tuple[StalledRanking, int]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    rpb_grpc.add_RankingServiceServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(StalledHealth(servicer), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    servicer.release.set()
    server.stop(0)


def _seeded_behind(
    start_server: Callable[..., LiveServer], sidecar_port: int, **ranking: Any
) -> tuple[LiveServer, TenantClient]:
    """A seeded server whose sidecar is the one on sidecar_port, StartSession's budget 150 ms."""
    live = start_server(
        ranking={"sidecar_address": f"127.0.0.1:{sidecar_port}", "start_session_deadline_ms": 150, **ranking}
    )
    t = tenant(live)
    seed(t)
    return live, t


def test_stalled_sidecar_costs_at_most_the_deadline_then_the_breaker_opens(
    start_server: Callable[..., LiveServer], stalled: tuple[StalledRanking, int]
) -> None:
    servicer, port = stalled
    _, t = _seeded_behind(start_server, port, breaker_failures=3, breaker_cooldown_s=60)
    paths: list[str] = []
    budgets: list[int] = []
    # The server runs inside the test process, so a collection of the garbage earlier tests
    # left (their servers', channels' and datasets' finalizers) stalls it too: in a full
    # run, collections of 250-410 ms were logged (gc.callbacks) and one StartSession here
    # took 319 ms. That is the harness, not the server: collect first, none while timing.
    gc.collect()
    gc.disable()
    try:
        for i in range(5):
            t0 = time.perf_counter()
            r = start(t, f"s{i}", "release rollback")
            elapsed_ms = (time.perf_counter() - t0) * 1000
            assert r.memories and r.ranking.path == pb.RANKING_PATH_FALLBACK
            assert elapsed_ms < 150 + 100  # the deadline, plus generous slack for a loaded test machine
            paths.append(r.ranking.fallback_reason)
            budgets.append(r.ranking.sidecar_deadline_ms)
    finally:
        gc.enable()
    assert paths[:3] == ["deadline"] * 3
    assert paths[3:] == ["circuit_open"] * 2 and servicer.calls == 3  # open: no more calls go out
    # The caller's own, shorter deadline is honoured too.
    t0 = time.perf_counter()
    with pytest.raises(grpc.RpcError) as err:
        t.memory().StartSession(
            pb.StartSessionRequest(session_id="tight", context="x"), metadata=t.md, timeout=0.001
        )
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # Per call: three Scores sent and timed out, two not sent; per session: five ordered by
    # the baseline. No call went out with the circuit open, so none claims a budget.
    status = t.memory().GetStatus(pb.GetStatusRequest(), metadata=t.md, timeout=5)
    assert dict(status.sidecar_call_failures) == {"Score:deadline": 3, "Score:circuit_open": 2}
    assert dict(status.ranking_fallbacks) == {"deadline": 3, "circuit_open": 2}
    assert [got_deadline > 0 for got_deadline in budgets] == [True] * 3 + [False] * 2


def _rerank_in_3_ms(t: TenantClient) -> pb.RecallResponse:
    options = pb.RecallOptions(rerank=True, rerank_deadline_ms=3)
    r: pb.RecallResponse = t.memory().Recall(
        pb.RecallRequest(query="release rollback", options=options), metadata=t.md, timeout=5
    )
    assert r.hits and not r.reranked
    return r


def _wait_for_breaker(live: LiveServer, state: str, health_checks: Callable[[], int], checks: int) -> None:
    breaker = live.server.core.ranking.breaker
    wait_for(lambda: health_checks() >= checks and not breaker._checking, timeout=10)
    assert breaker.state.value == state


def test_timeouts_of_budgets_the_caller_cut_short_leave_a_healthy_sidecars_circuit_closed(
    start_server: Callable[..., LiveServer], slow_but_healthy: tuple[StalledRanking, int]
) -> None:
    """One breaker serves every tenant: a tenant asking for reranks within 3 ms, or starting
    sessions with deadlines shorter than the server's own budget, times out by its own
    choice. A sidecar that answers its health check meanwhile keeps the circuit closed (such
    timeouts once opened it, and every tenant's StartSession fell back with circuit_open);
    timeouts of the server's own budget still open it."""
    servicer, port = slow_but_healthy
    live, t = _seeded_behind(
        start_server, port, breaker_failures=3, breaker_cooldown_s=60, start_session_deadline_ms=800
    )
    assert [_rerank_in_3_ms(t).rerank_fallback_reason for _ in range(4)] == ["deadline"] * 4
    _wait_for_breaker(live, "closed", lambda: servicer.health_checks, 1)
    gc.collect()  # no collection of earlier tests' garbage while this in-process server is timed
    gc.disable()
    try:
        for i in range(4):
            s = t.memory().StartSession(
                pb.StartSessionRequest(session_id=f"tight{i}", project_id="p", context="release rollback"),
                metadata=t.md,
                timeout=0.4,  # under the server's 800 ms budget
            )
            assert s.ranking.fallback_reason == "deadline"
    finally:
        gc.enable()
    _wait_for_breaker(live, "closed", lambda: servicer.health_checks, 2)
    # The four sessions' calls all went out; a 3 ms rerank may have expired before the
    # sidecar's handler ran.
    reached = servicer.calls
    assert 4 <= reached <= 8
    reasons = [start(t, f"own{i}", "release rollback").ranking.fallback_reason for i in range(4)]
    assert reasons == ["deadline"] * 3 + ["circuit_open"]
    assert servicer.calls == reached + 3  # the open circuit sent the fourth nothing


def test_a_stalled_sidecar_opens_the_circuit_even_when_callers_cut_budgets_short(
    start_server: Callable[..., LiveServer], stalled: tuple[StalledRanking, int]
) -> None:
    """A timeout the caller's short budget may explain is checked against the sidecar's
    health, once at a time: a stalled sidecar (its health check unanswered within
    breaker_probe_timeout_s) opens the circuit, so short-budget callers stop waiting on it."""
    servicer, port = stalled
    live, t = _seeded_behind(
        start_server, port, breaker_failures=3, breaker_cooldown_s=60, breaker_probe_timeout_s=0.5
    )
    assert [_rerank_in_3_ms(t).rerank_fallback_reason for _ in range(2)] == ["deadline"] * 2
    _wait_for_breaker(live, "open", lambda: servicer.health_checks, 1)
    assert servicer.health_checks == 1  # the second timeout found the first's check running
    # A 3 ms call may expire before the stalled sidecar's handler runs (CI, loaded: 1 of 2).
    reached = servicer.calls
    assert _rerank_in_3_ms(t).rerank_fallback_reason == "circuit_open"
    assert servicer.calls == reached  # the open circuit sends nothing


def test_the_sidecar_gets_what_the_deadline_leaves_after_the_work_that_follows_it(
    start_server: Callable[..., LiveServer], stalled: tuple[StalledRanking, int]
) -> None:
    """With the caller's deadline binding and the sidecar stalled, StartSession still answers
    in time: the sidecar's budget keeps back the reply's margin and the recent 95th
    percentile of the work after the sidecar's answer (here as a loaded machine makes it,
    40 ms), not a fixed 10 ms that such work overran (probe: DEADLINE_EXCEEDED at 82-86 ms
    for an 80 ms deadline). The margin for the reply's way back is a tenth of a caller's
    deadline shorter than the server's budget (with 10 ms, 4-6 of 30 such StartSessions
    failed at 0.3 s on a loaded machine)."""
    _, port = stalled
    live, t = _seeded_behind(start_server, port, breaker_failures=1_000, start_session_deadline_ms=5_000)
    after = live.server.core.sessions.after_ranking
    for _ in range(64):
        after.add(0.040)
    assert after.high_s() == pytest.approx(0.040)
    r = t.memory().StartSession(
        pb.StartSessionRequest(session_id="tight", project_id="p", context="release rollback"),
        metadata=t.md,
        timeout=0.3,
    )
    assert r.ranking.path == pb.RANKING_PATH_FALLBACK and r.ranking.fallback_reason == "deadline"
    assert 150 <= r.ranking.sidecar_deadline_ms <= 300 - 40 - 30


class MisbehavingRanking(rpb_grpc.RankingServiceServicer):
    """A sidecar that is up but answers Score wrongly: INVALID_ARGUMENT, or too few scores."""

    def __init__(self) -> None:
        self.mode = "invalid"
        self.calls = 0

    def Score(self, request: rpb.ScoreRequest, context: grpc.ServicerContext) -> rpb.ScoreResponse:
        self.calls += 1
        if self.mode == "invalid":
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "candidates[0].text: longer than 20000 characters"
            )
        one = rpb.CandidateScore(id=request.candidates[0].id, score=1.0)
        return rpb.ScoreResponse(scores=[one], model_version="v1", predictor_weight=0.7)


def test_a_sidecar_refusing_a_request_leaves_the_circuit_closed_and_partial_scores_fall_back(
    start_server: Callable[..., LiveServer],
) -> None:
    """INVALID_ARGUMENT is about the request: the sidecar is up, so it is no failure for the
    breaker (a run of refused outbox payloads would otherwise open the circuit for every
    StartSession). Scores for only some candidates are a sidecar fault: FALLBACK, not the
    cold start's BASELINE."""
    servicer = MisbehavingRanking()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    rpb_grpc.add_RankingServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        live, t = _seeded_behind(start_server, port, breaker_failures=1)
        reasons = [start(t, f"s{i}", "release rollback").ranking for i in range(3)]
        assert [(r.path, r.fallback_reason) for r in reasons] == [
            (pb.RANKING_PATH_FALLBACK, "error:INVALID_ARGUMENT")
        ] * 3
        assert servicer.calls == 3 and live.server.core.ranking.breaker.state.value == "closed"
        servicer.mode = "partial"
        partial = start(t, "s3", "release rollback").ranking
        assert (partial.path, partial.fallback_reason) == (pb.RANKING_PATH_FALLBACK, "partial_scores")
        status = t.memory().GetStatus(pb.GetStatusRequest(), metadata=t.md, timeout=5)
        assert dict(status.ranking_fallbacks) == {"error:INVALID_ARGUMENT": 3, "partial_scores": 1}
        assert dict(status.sidecar_call_failures) == {"Score:error:INVALID_ARGUMENT": 3}
    finally:
        server.stop(0)


def test_a_stopped_sidecar_is_probed_off_the_callers_path(
    start_server: Callable[..., LiveServer], stalled: tuple[StalledRanking, int]
) -> None:
    """Once the breaker is open, each cooldown's probe is a health check the server sends
    itself: no StartSession is let through to wait out its deadline on a stopped sidecar,
    and the sidecar's return closes the circuit."""
    servicer, port = stalled
    live, t = _seeded_behind(
        start_server, port, breaker_failures=2, breaker_cooldown_s=0.1, breaker_probe_timeout_s=0.2
    )
    sessions = (f"s{i}" for i in range(10_000))
    assert [start(t, next(sessions), "release rollback").ranking.fallback_reason for _ in range(2)] == [
        "deadline"
    ] * 2
    until = time.monotonic() + 1.5  # many cooldowns
    while time.monotonic() < until:
        assert start(t, next(sessions), "release rollback").ranking.fallback_reason == "circuit_open"
    assert servicer.calls == 2  # no StartSession's Score went out after the circuit opened
    assert servicer.health_checks >= 3  # the probes did, one after another
    servicer.release.set()  # the sidecar resumes
    wait_for(lambda: start(t, next(sessions), "release rollback").ranking.fallback_reason == "cold_start")
    assert live.server.core.ranking.breaker.state.value == "closed"


def test_sidecar_answers_deadline_exceeded_rather_than_late(start_sidecar: Callable[..., Any]) -> None:
    side = start_sidecar()
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))
    cands = [
        rpb.Candidate(id=str(i), text=f"memory number {i} about deployments", baseline_score=1.0 / (i + 1))
        for i in range(40)
    ]
    warm = stub.Rerank(rpb.RerankRequest(tenant_id="t", query="deploy", candidates=cands), timeout=60)
    assert warm.method == rpb.RERANK_METHOD_EMBEDDING_BLEND and len(warm.scores) == 40
    fresh = [
        rpb.Candidate(id=str(i), text=f"a brand new text {i} never embedded before", baseline_score=0.5)
        for i in range(40)
    ]
    with pytest.raises(grpc.RpcError) as err:
        stub.Rerank(rpb.RerankRequest(tenant_id="t", query="new query", candidates=fresh), timeout=0.02)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert error_info(err.value)[0] in {"SIDECAR_DEADLINE", ""}  # the sidecar's own, or the transport's
    too_many = (cands * 10)[: SidecarConfig().inference.max_candidates + 1]
    with pytest.raises(grpc.RpcError) as err:
        stub.Rerank(rpb.RerankRequest(tenant_id="t", query="q", candidates=too_many), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error_info(err.value)[1] == ["candidates"]
    status = stub.GetModelStatus(rpb.GetModelStatusRequest(tenant_id="t"), timeout=5)
    assert status.cold_start and not status.cross_encoder.ready and "embedding blend" in status.note
    # The warm call at least; the 20 ms one may expire before the server even dispatches it.
    assert status.latency["Rerank"].calls >= 1 and status.latency["Rerank"].p50_ms > 0


def test_cold_start_order_equals_the_recall_baseline(
    start_server: Callable[..., LiveServer], start_sidecar: Callable[..., Any]
) -> None:
    side = start_sidecar()
    live = start_server(
        ranking={
            "sidecar_address": f"127.0.0.1:{side.port}",
            "start_session_deadline_ms": 2000,
            "pool_recent": 0,
        }
    )
    t = tenant(live)
    seed(t)
    scope = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="p")
    for i, question in enumerate(["who owns billing?", "how do releases work?", "database in staging"]):
        r = start(t, f"s{i}", question, max_memories=50, token_budget=100_000)
        assert r.ranking.path == pb.RANKING_PATH_BASELINE and r.ranking.fallback_reason == "cold_start"
        recall = t.memory().Recall(
            pb.RecallRequest(
                query=question,
                top_k=50,
                filter=memory_pb2.MemoryFilter(
                    scopes=[
                        scope,
                        common_pb2.Scope(kind=common_pb2.SCOPE_KIND_WORKSPACE),
                        common_pb2.Scope(kind=common_pb2.SCOPE_KIND_SESSION, id=f"s{i}"),
                    ]
                ),
            ),
            metadata=t.md,
            timeout=10,
        )
        recalled = [h.memory.id for h in recall.hits]
        assert [m.memory.id for m in r.memories][: len(recalled)] == recalled


def test_model_hot_swap_under_load_fails_no_call(
    start_server: Callable[..., LiveServer], start_sidecar: Callable[..., Any]
) -> None:
    side = start_sidecar(
        training={"min_sessions": 8, "min_heldout": 3, "cross_encoder": False, "heldout_fraction": 0.25},
        ranker={"n_estimators": 30, "min_child_samples": 2},
    )
    live = start_server(
        ranking={
            "sidecar_address": f"127.0.0.1:{side.port}",
            "start_session_deadline_ms": 3000,
            "delivery_interval_s": 0.05,
            # Fewer than the pool: the sidecar scores the baseline's best 5, the rest stay below.
            "max_scored": 5,
        }
    )
    t = tenant(live)
    seed(t)
    questions = [
        "who owns billing?",
        "staging database",
        "release rollback",
        "deploy schedule",
        "feature flags on mobile",
        "postgres upgrade window",
        "beta banner in the EU",
        "ticket tags",
    ]
    for i in range(24):  # sessions with feedback: the memory that shares the most words is "used"
        q = questions[i % len(questions)]
        r = start(t, f"train-{i}", q, max_memories=8)
        t.memory().EndSession(
            pb.EndSessionRequest(
                session_id=f"train-{i}",
                feedback=[pb.MemoryFeedback(memory_id=r.memories[0].memory.id, used=True)],
            ),
            metadata=t.md,
            timeout=5,
        )
    wait_for(lambda: side.store.counts("acme")[0] == 24)

    errors: list[BaseException] = []
    paths: list[int] = []
    stop = threading.Event()

    def hammer(n: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                r = start(t, f"load-{n}-{i}", questions[i % len(questions)])
                paths.append(r.ranking.path)
            except BaseException as exc:
                errors.append(exc)
            i += 1

    threads = [threading.Thread(target=hammer, args=(n,)) for n in range(4)]
    for th in threads:
        th.start()
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))
    for _ in range(3):  # train (and possibly promote) repeatedly while sessions start
        list(
            stub.Train(
                rpb.TrainRequest(tenant_id="acme", models=[rpb.MODEL_KIND_RANKER], force=True), timeout=120
            )
        )
    time.sleep(0.5)
    stop.set()
    for th in threads:
        th.join(10)
    assert not errors, errors[:3]
    assert len(paths) > 20
    status = stub.GetModelStatus(rpb.GetModelStatusRequest(tenant_id="acme"), timeout=5)
    assert len(status.recent_outcomes) == 3
    if status.ranker.ready:  # a version was promoted: sessions after it used the model
        assert pb.RANKING_PATH_MODEL in paths
    server_status = t.memory().GetStatus(pb.GetStatusRequest(), metadata=t.md, timeout=5)
    assert server_status.sidecar_circuit == "closed"
