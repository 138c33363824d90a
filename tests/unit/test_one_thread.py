"""OneThreadQueue: one item per key at a time, and nothing queued once stopped."""

from __future__ import annotations

import threading

from mnemo_server.one_thread import OneThreadQueue


def test_a_key_is_queued_once_and_a_stopped_queue_refuses_work() -> None:
    q = OneThreadQueue("test-one-thread")
    release = threading.Event()
    ran: list[str] = []

    def first() -> None:
        release.wait(5)
        ran.append("a")

    assert q.submit("a", first)
    assert not q.submit("a", lambda: ran.append("again"))  # queued or running already
    assert not q.wait_idle(0.05)
    release.set()
    assert q.wait_idle(5) and ran == ["a"]
    q.stop()
    # Nothing would run it: refused, and the queue stays idle (a settle does not hang).
    assert not q.submit("b", lambda: ran.append("b"))
    assert not q.pending("b") and q.wait_idle(0) and ran == ["a"]
