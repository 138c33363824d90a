"""A copy of a keyed purge that is still running waits for it, but no longer than its
caller's deadline, and not once its caller has gone (memory/purges.py)."""

from __future__ import annotations

import threading
import time

import pytest

from mnemo_server.errors import Cancelled, DeadlineExceeded
from mnemo_server.memory.model import IdempotencyKey
from mnemo_server.memory.purges import UNTIL_DONE, Patience, _Running

_KEY = IdempotencyKey("PurgeMemories", "purge-1", "fp")


def _hold(running: _Running, released: threading.Event, holding: threading.Event) -> threading.Thread:
    def first() -> None:
        with running.claim("t", _KEY, UNTIL_DONE):
            holding.set()
            released.wait(10)

    thread = threading.Thread(target=first)
    thread.start()
    assert holding.wait(5)
    return thread


def test_a_copy_gives_up_at_its_deadline_and_a_later_one_runs_once_the_first_ends() -> None:
    running, released, holding = _Running(), threading.Event(), threading.Event()
    thread = _hold(running, released, holding)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as err, running.claim("t", _KEY, Patience(wait_s=0.2)):
        pass
    assert err.value.reason == "PURGE_IN_PROGRESS"
    assert 0.2 <= time.monotonic() - started < 2.0
    # Another tenant's purge with the same request_id is not a copy.
    with running.claim("other", _KEY, Patience(wait_s=0.0)):
        pass
    released.set()
    thread.join(5)
    with running.claim("t", _KEY, Patience(wait_s=0.0)):
        pass


def test_a_copy_whose_caller_went_away_stops_waiting() -> None:
    running, released, holding = _Running(), threading.Event(), threading.Event()
    thread = _hold(running, released, holding)
    asked: list[float] = []

    def still_wanted() -> bool:
        asked.append(time.monotonic())
        return len(asked) < 3

    patience = Patience(still_wanted=still_wanted, poll_s=0.05)
    with pytest.raises(Cancelled), running.claim("t", _KEY, patience):
        pass
    assert len(asked) == 3
    released.set()
    thread.join(5)


def test_a_copy_waits_for_the_first_to_end_and_then_goes_on() -> None:
    running, released, holding = _Running(), threading.Event(), threading.Event()
    thread = _hold(running, released, holding)
    # Timed from before the timer starts: from after it, the wait measured 0.098 s once (CI).
    started = time.monotonic()
    threading.Timer(0.1, released.set).start()
    with running.claim("t", _KEY, Patience(wait_s=5.0, poll_s=0.02)):
        assert not thread.is_alive() or released.is_set()
    assert 0.1 <= time.monotonic() - started < 5.0
    thread.join(5)
