"""Creates written as a group (one transaction) behave as if written one after another,
on a real DuckDB store: dedup to an earlier request of the group, a request_id repeated in
the group replays, a taken external id fails that request only and the rest are written."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mnemo_server.config import CapsConfig
from mnemo_server.errors import AlreadyExists, InvalidArgument
from mnemo_server.memory.creates import CreateRequest, CreateWriter, CreateWritten
from mnemo_server.memory.live_counts import LiveCounts
from mnemo_server.memory.model import IdempotencyKey, MemoryDraft, Scope, ScopeKind, now_ns
from mnemo_server.store import idempotency_repo, memory_repo
from mnemo_server.store.database import Database, WriteDomain

MEMORIES = WriteDomain.MEMORIES


@pytest.fixture
def db(tmp_path: Path) -> Database:
    return Database(tmp_path / "d.duckdb")


def _request(content: str, *, external_id: str = "", key: str = "", scope: str = "") -> CreateRequest:
    draft = MemoryDraft(
        content=content,
        external_id=external_id,
        scope=Scope(ScopeKind.PROJECT, scope) if scope else Scope.workspace(),
    )
    idem = IdempotencyKey("CreateMemory", key, f"fp-{content}") if key else None
    return CreateRequest("t", [draft], ["memory"], idem)


def _write_as_one_group(db: Database, writer: CreateWriter, requests: list[CreateRequest]) -> list[object]:
    """Hold the memories lock, let a first create lead (and wait for the lock), queue the
    given requests behind it, then release: they form the next group."""
    outcomes: list[object] = [None] * len(requests)
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with db.transaction(MEMORIES):
            inside.set()
            assert release.wait(5)

    def submit(i: int, r: CreateRequest) -> None:
        try:
            outcomes[i] = writer.write(r)
        except Exception as exc:
            outcomes[i] = exc

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(5)
    leader = threading.Thread(target=writer.write, args=(_request("the leader"),))
    leader.start()
    _wait(lambda: writer.writing == 1)  # the leader took its own request and waits for the lock
    threads = []
    for i, r in enumerate(requests):
        t = threading.Thread(target=submit, args=(i, r))
        t.start()
        threads.append(t)
        _wait(lambda i=i: writer.waiting == i + 1)
    release.set()
    for t in [holder, leader, *threads]:
        t.join(5)
    return outcomes


def _wait(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert condition(), "timed out"


def _live(db: Database) -> int:
    rows = db.reader().execute("SELECT count(*) FROM memories WHERE delete_time_ns IS NULL").fetchall()
    return int(rows[0][0])


def _writer(db: Database) -> CreateWriter:
    return CreateWriter(db, CapsConfig(), LiveCounts(), "m", now_ns, group_max_memories=500)


def test_a_group_is_one_transaction_and_reads_like_requests_one_after_another(db: Database) -> None:
    writer = _writer(db)
    before = db.write_lock_stats[MEMORIES].transactions
    a, dup_of_a, other_scope, keyed, retry = _write_as_one_group(
        db,
        writer,
        [
            _request("alpha"),
            _request("alpha"),
            _request("alpha", scope="p1"),
            _request("beta", key="r1"),
            _request("beta", key="r1"),
        ],
    )
    assert isinstance(a, CreateWritten) and isinstance(dup_of_a, CreateWritten)
    assert isinstance(other_scope, CreateWritten)
    assert isinstance(keyed, CreateWritten) and isinstance(retry, CreateWritten)
    assert writer.group_stats.largest == 5
    # The holder's, the leader's and the group's.
    assert db.write_lock_stats[MEMORIES].transactions - before == 3
    first = a.results[0]
    assert not first.deduplicated and a.new_ids == [first.memory.id]
    assert dup_of_a.results[0].deduplicated and dup_of_a.results[0].memory.id == first.memory.id
    assert dup_of_a.new_ids == []
    assert not other_scope.results[0].deduplicated  # dedup is per scope
    # The repeated request_id replays the first: the same memory, nothing new to index.
    assert retry.results[0].memory.id == keyed.results[0].memory.id and retry.new_ids == []
    stored = memory_repo.get_many(db.reader(), "t", [first.memory.id, keyed.results[0].memory.id])
    assert len(stored) == 2
    assert _live(db) == 4  # + the leader's
    record = idempotency_repo.lookup(
        db.reader(), db.stored.requests, "t", IdempotencyKey("CreateMemory", "r1", "fp-beta")
    )
    assert record == {"ids": [keyed.results[0].memory.id], "dedup": [False]}


def test_a_taken_external_id_fails_that_request_alone(db: Database) -> None:
    writer = _writer(db)
    owner = writer.write(_request("gamma", external_id="ext-1")).results[0].memory
    ok1, taken, ok2, same_again = _write_as_one_group(
        db,
        writer,
        [
            _request("delta"),
            _request("not gamma", external_id="ext-1"),
            _request("epsilon"),
            _request("gamma", external_id="ext-1"),
        ],
    )
    assert isinstance(taken, AlreadyExists)
    assert taken.reason == "EXTERNAL_ID_TAKEN" and "memory.external_id" in str(taken)
    assert isinstance(ok1, CreateWritten) and isinstance(ok2, CreateWritten)
    assert isinstance(same_again, CreateWritten)
    assert same_again.results[0].deduplicated and same_again.results[0].memory.id == owner.id
    contents = {
        m.content
        for m in memory_repo.get_many(
            db.reader(), "t", [ok1.results[0].memory.id, ok2.results[0].memory.id, owner.id]
        ).values()
    }
    assert contents == {"delta", "epsilon", "gamma"}
    # gamma, the leader's, delta, epsilon: the failed request wrote nothing.
    assert _live(db) == 4


def test_caps_count_every_request_of_a_group(db: Database) -> None:
    writer = CreateWriter(db, CapsConfig(semantic=3), LiveCounts(), "m", now_ns, group_max_memories=500)
    outcomes = _write_as_one_group(db, writer, [_request(f"fact {i}") for i in range(4)])
    assert all(isinstance(o, CreateWritten) for o in outcomes)
    pruned = [p for o in outcomes if isinstance(o, CreateWritten) for p in o.pruned]
    assert len(pruned) == 2  # the leader's and four more, capped at three
    assert _live(db) == 3


def test_a_request_id_reused_for_another_request_in_a_group_fails_that_request(db: Database) -> None:
    writer = _writer(db)
    first, reused, other = _write_as_one_group(
        db, writer, [_request("zeta", key="r2"), _request("eta", key="r2"), _request("theta")]
    )
    assert isinstance(reused, InvalidArgument) and reused.reason == "REQUEST_ID_REUSED"
    assert isinstance(first, CreateWritten) and isinstance(other, CreateWritten)
    assert not first.results[0].deduplicated and not other.results[0].deduplicated
    assert _live(db) == 3  # the leader's, zeta, theta
