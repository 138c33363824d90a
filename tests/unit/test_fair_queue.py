"""The index worker's queue (index/fair_queue.py): tenants take turns, each in its order."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from mnemo_server.index.fair_queue import FairQueue


def test_tenants_take_turns_and_each_keeps_its_order() -> None:
    q = FairQueue()
    for n in range(5):
        q.put(("bulk", f"b{n}"))
    q.put(("quiet", "q0"))
    q.put(("other", "o0"))
    q.put(("quiet", "q1"))
    taken = [q.get(block=False) for _ in range(8)]
    assert taken == [
        ("bulk", "b0"), ("quiet", "q0"), ("other", "o0"), ("bulk", "b1"),
        ("quiet", "q1"), ("bulk", "b2"), ("bulk", "b3"), ("bulk", "b4"),
    ]  # fmt: skip
    with pytest.raises(queue.Empty):
        q.get(block=False)
    q.put(("bulk", "b5"))  # a tenant whose line emptied queues at the back again
    assert q.get(timeout=0.1) == ("bulk", "b5")


def test_get_waits_for_a_key_or_its_timeout_and_a_wake_returns_none() -> None:
    q = FairQueue()
    started = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.1)
    assert 0.09 <= time.monotonic() - started < 1.0
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(q.get()))
    waiter.start()
    time.sleep(0.05)
    q.put(("t", "m"))
    waiter.join(2.0)
    assert got == [("t", "m")]
    waiter = threading.Thread(target=lambda: got.append(q.get()))
    waiter.start()
    time.sleep(0.05)
    q.wake()
    waiter.join(2.0)
    assert got[-1] is None and not waiter.is_alive()
    q.put(("t", "n"))
    q.wake()  # a wake is answered before any key: the worker is stopping
    assert q.get(block=False) is None and q.get(block=False) == ("t", "n")
