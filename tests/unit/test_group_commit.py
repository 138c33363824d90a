"""GroupCommit: requests queued while a group is being written form the next group, in
order, within the size limit, and each caller gets its own outcome."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest

from mnemo_server.store.group_commit import GroupCommit


class Writer:
    """Records each write (a group, or one request alone); the first write blocks until
    released, so others queue behind it. A group holding a "bad" request fails as a whole;
    alone, a "bad" request fails by itself."""

    def __init__(self, block_first: bool = False):
        self.groups: list[list[str]] = []
        self.first_inside = threading.Event()
        self.release = threading.Event()
        if not block_first:
            self.release.set()

    def _record(self, requests: list[str]) -> None:
        self.groups.append(requests)
        if len(self.groups) == 1:
            self.first_inside.set()
            assert self.release.wait(5)

    def together(self, requests: Sequence[str]) -> list[str]:
        self._record(list(requests))
        if any(r.startswith("bad") for r in requests):
            raise ValueError("a bad request in the group")
        return [r.upper() for r in requests]

    def alone(self, request: str) -> str:
        self._record([request])
        if request.startswith("bad"):
            raise ValueError(f"bad {request}")
        return request.upper()

    def commit(
        self,
        max_size: int = 10,
        size_of: Callable[[str], int] = lambda _: 1,
        tenant_of: Callable[[str], str] = lambda _: "",
    ) -> GroupCommit[str, str]:
        return GroupCommit(self.together, self.alone, max_size, size_of, tenant_of)


def _queued_behind_a_slow_group(
    gc: GroupCommit[str, str], writer: Writer, requests: list[str]
) -> dict[str, object]:
    """A first request leads and blocks in the writer; `requests` queue behind it, each from
    its own thread and each queued before the next starts; then the writer is released.
    Returns each queued request's outcome (its result or exception).

    Only this thread releases the writer, after every request has queued: counting the
    queue from another thread raced with the release (its last check could come after the
    group had been taken, and found the queue empty)."""
    first = threading.Thread(target=gc.submit, args=("first",))
    first.start()
    assert writer.first_inside.wait(5)
    outcomes: dict[str, object] = {}

    def run(r: str) -> None:
        try:
            outcomes[r] = gc.submit(r)
        except Exception as exc:
            outcomes[r] = exc

    threads = []
    for queued, r in enumerate(requests):
        t = threading.Thread(target=run, args=(r,))
        t.start()
        threads.append(t)
        deadline = time.monotonic() + 5
        while gc.waiting == queued and time.monotonic() < deadline:
            time.sleep(0.001)
        assert gc.waiting == queued + 1, "the request did not queue"
    writer.release.set()
    first.join(5)
    for t in threads:
        t.join(5)
    return outcomes


def test_a_lone_request_is_written_alone_and_returns_its_result() -> None:
    writer = Writer()
    gc = writer.commit()
    assert gc.submit("a") == "A"
    assert writer.groups == [["a"]]
    assert gc.stats.groups == 1 and gc.stats.largest == 1


def test_requests_queued_behind_a_slow_group_are_written_together_in_order() -> None:
    writer = Writer(block_first=True)
    gc = writer.commit()
    later = ["b", "c", "d", "e"]
    done = _queued_behind_a_slow_group(gc, writer, later)
    assert writer.groups == [["first"], later]
    assert done == {r: r.upper() for r in later}
    assert gc.stats.groups == 2 and gc.stats.requests == 5 and gc.stats.largest == 4


def test_a_group_that_fails_is_written_one_by_one_and_only_the_bad_request_fails() -> None:
    writer = Writer(block_first=True)
    gc = writer.commit()
    done = _queued_behind_a_slow_group(gc, writer, ["x", "bad1", "y"])
    assert writer.groups == [["first"], ["x", "bad1", "y"], ["x"], ["bad1"], ["y"]]
    assert done["x"] == "X" and done["y"] == "Y"
    assert isinstance(done["bad1"], ValueError) and str(done["bad1"]) == "bad bad1"
    assert gc.stats.groups == 2 and gc.stats.requests == 4


def test_groups_keep_within_the_size_limit_and_an_oversized_request_goes_alone() -> None:
    writer = Writer(block_first=True)
    gc = writer.commit(max_size=4, size_of=len)
    queued = ["aa", "bb", "c", "dddddd", "e"]  # sizes 2, 2, 1, 6, 1
    done = _queued_behind_a_slow_group(gc, writer, queued)
    assert writer.groups == [["first"], ["aa", "bb"], ["c"], ["dddddd"], ["e"]]
    assert done == {r: r.upper() for r in queued}


def test_tenants_take_turns_so_one_tenants_batches_do_not_queue_ahead_of_anothers_create() -> None:
    # Requests are "<tenant>:<name>", sized by their name ("first" is its own tenant).
    # Tenant a queues three batches of 4 (a whole group each), then b and c one create
    # each, then b another: b and c go right after the group being written, ahead of a's
    # batches; b's second create comes after its first, and a's batches keep their order.
    writer = Writer(block_first=True)
    gc = writer.commit(
        max_size=4,
        size_of=lambda r: len(r.partition(":")[2]) or 1,
        tenant_of=lambda r: r.partition(":")[0],
    )
    queued = ["a:1111", "a:2222", "a:3333", "b:1", "c:1", "b:2"]
    done = _queued_behind_a_slow_group(gc, writer, queued)
    # Shares: b:1 1, c:1 1, b:2 2, a:1111 4, a:2222 8, a:3333 12.
    assert writer.groups == [
        ["first"],
        ["b:1", "c:1", "b:2"],
        ["a:1111"],
        ["a:2222"],
        ["a:3333"],
    ]
    assert done == {r: r.upper() for r in queued}


class Trickle(Writer):
    """While each write runs, tenant b queues its next one-unit create, up to `creates`, so
    b always has a create waiting when the next group is taken."""

    def __init__(self, creates: int):
        super().__init__(block_first=True)
        self.creates = creates
        self.queued = 0
        self.gc: GroupCommit[str, str] | None = None
        self.threads: list[threading.Thread] = []

    def _record(self, requests: list[str]) -> None:
        super()._record(requests)
        if self.gc is None or self.queued == self.creates:
            return
        self.queued += 1
        waiting = self.gc.waiting
        t = threading.Thread(target=self.gc.submit, args=(f"b:{self.queued}",))
        t.start()
        self.threads.append(t)
        deadline = time.monotonic() + 5
        while self.gc.waiting == waiting and time.monotonic() < deadline:
            time.sleep(0.001)
        assert self.gc.waiting == waiting + 1, "b's create did not queue"


def test_a_batch_is_written_while_another_tenant_keeps_a_create_queued() -> None:
    # a's batch holds 4 units; b always has a create queued. Ranked by units queued, b's
    # next create always went ahead and a waited until b stopped (12 creates); in fair order
    # a waits for at most its own size in b's units.
    writer = Trickle(creates=12)
    gc = writer.commit(
        max_size=4,
        size_of=lambda r: 4 if r.startswith("a:") else 1,
        tenant_of=lambda r: r.partition(":")[0],
    )
    writer.gc = gc
    done = _queued_behind_a_slow_group(gc, writer, ["a:batch"])
    for t in writer.threads:
        t.join(5)
    written = [r for group in writer.groups for r in group]
    assert done == {"a:batch": "A:BATCH"}
    assert len(written) == 1 + 1 + 12  # first, a's batch, b's creates
    assert ["a:batch"] in writer.groups, "a's batch went alone (a whole group)"
    assert 1 <= written.index("a:batch") - 1 <= 4, written  # b's units written before it


def test_a_lone_request_that_fails_gets_its_error_and_a_short_group_is_written_one_by_one() -> None:
    writer = Writer()
    with pytest.raises(ValueError, match="bad bad0"):
        writer.commit().submit("bad0")

    def short(requests: Sequence[str]) -> list[str]:
        return []  # a group writer that lost results: not trusted, written one by one

    writer = Writer(block_first=True)
    gc = GroupCommit(short, writer.alone, max_size=10)
    done = _queued_behind_a_slow_group(gc, writer, ["p", "q"])
    assert done == {"p": "P", "q": "Q"} and writer.groups == [["first"], ["p"], ["q"]]


def test_size_zero_writes_each_request_alone_and_counts_it() -> None:
    writer = Writer()
    gc = writer.commit(max_size=0)
    assert gc.submit("a") == "A"
    with pytest.raises(ValueError, match="bad bad2"):
        gc.submit("bad2")
    assert writer.groups == [["a"], ["bad2"]]
    assert gc.stats.groups == 2 and gc.stats.requests == 2 and gc.stats.largest == 1
    with pytest.raises(ValueError, match="max_size"):
        writer.commit(max_size=-1)


def test_a_caller_that_leads_a_group_without_its_own_request_leads_again_until_it_is_written() -> None:
    """The queue's head goes first: a caller that wins the lead while requests queued ahead
    of it fill the group must not return before its own request is written. Which waiting
    caller wins is up to the scheduler, so the race is run repeatedly."""
    for _ in range(20):
        writer = Writer(block_first=True)
        gc = writer.commit(max_size=4, size_of=len)
        done = _queued_behind_a_slow_group(gc, writer, ["aaaa", "b", "cccc", "d"])
        assert done == {"aaaa": "AAAA", "b": "B", "cccc": "CCCC", "d": "D"}
        assert writer.groups == [["first"], ["aaaa"], ["b"], ["cccc"], ["d"]]
