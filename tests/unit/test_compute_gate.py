"""The compute gate: at most `slots` holders, waiting bounded by the caller's deadline."""

from __future__ import annotations

import threading
import time

import pytest

from mnemo_server.api.compute_gate import ComputeGate
from mnemo_server.errors import DeadlineExceeded


def test_a_call_past_its_deadline_in_the_queue_is_refused() -> None:
    gate = ComputeGate(1)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with gate.slot(None):
            holding.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(5)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as err, gate.slot(0.05):
        pass
    assert err.value.reason == "QUEUED_PAST_DEADLINE"
    assert 0.04 <= time.monotonic() - started < 2.0
    release.set()
    holder.join()
    with gate.slot(0.05):  # free again
        pass


def test_slots_bound_concurrency_and_survive_errors() -> None:
    gate = ComputeGate(2)
    inside = 0
    most = 0
    lock = threading.Lock()

    def work(fail: bool) -> None:
        nonlocal inside, most
        try:
            with gate.slot(10):
                with lock:
                    inside += 1
                    most = max(most, inside)
                time.sleep(0.02)
                with lock:
                    inside -= 1
                if fail:
                    raise RuntimeError("handler failed")
        except RuntimeError:
            pass

    threads = [threading.Thread(target=work, args=(i % 2 == 0,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 2
    for _ in range(2):  # both slots came back, failures included
        assert gate._free is not None and gate._free.acquire(timeout=0)


def test_a_call_without_deadline_waits_for_its_turn() -> None:
    """gRPC gives a call without a deadline ~1.8e19 s of time remaining."""
    gate = ComputeGate(1)
    with gate.slot(1.8e19):
        pass
    done = threading.Event()
    with gate.slot(1.8e19):
        waiter = threading.Thread(target=lambda: [gate.slot(1.8e19).__enter__(), done.set()])
        waiter.start()
        assert not done.wait(0.1)  # queued behind the holder
    assert done.wait(5)  # admitted once the slot is free
    waiter.join()


def test_zero_slots_means_no_limit() -> None:
    gate = ComputeGate(0)
    with gate.slot(0), gate.slot(0), gate.slot(None):
        pass
