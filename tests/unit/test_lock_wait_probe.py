"""The interpreter-lock probe measures how long a waking thread waits for the GIL."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from mnemo_server.errors import FailedPrecondition
from mnemo_server.lock_wait_probe import LockWaitProbe


@contextmanager
def _probing(interval_ms: float) -> Iterator[LockWaitProbe]:
    probe = LockWaitProbe(interval_ms)
    probe.start()
    try:
        yield probe
    finally:
        probe.stop()


def _hold_the_lock(seconds: float) -> None:
    """Python bytecode without a pause: the lock is let go only when another thread asks."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(100))


def test_a_thread_running_python_makes_the_probe_wait_for_the_switch_interval() -> None:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(0.02)  # 20 ms: a hand-over waits up to this long
    try:
        with _probing(5) as busy:
            hog = threading.Thread(target=_hold_the_lock, args=(0.8,))
            hog.start()
            hog.join()
        with _probing(5) as idle:
            time.sleep(0.8)
    finally:
        sys.setswitchinterval(previous)
    held, free = busy.snapshot(), idle.snapshot()
    assert held.count >= 10 and free.count >= 50
    # Each wake-up beside the hog waits for the hog to be asked to let go: most of 20 ms.
    assert held.quantile(0.5) >= 5.0
    assert free.quantile(0.5) < held.quantile(0.5) / 2
    assert held.max_ms >= held.quantile(0.5)


def test_zero_turns_the_probe_off_and_tiny_intervals_are_refused() -> None:
    with _probing(0) as off:
        time.sleep(0.05)
    assert not off.enabled and off.snapshot().count == 0 and off.snapshot().quantile(0.99) == 0.0
    for bad in (0.5, -1.0, float("nan")):
        with pytest.raises(FailedPrecondition, match=r"server\.lock_wait_probe_ms"):
            LockWaitProbe(bad)


def test_stop_ends_the_thread_within_an_interval() -> None:
    probe = LockWaitProbe(1000)
    probe.start()
    assert [t for t in threading.enumerate() if t.name == "mnemo-lock-wait-probe"]
    started = time.perf_counter()
    probe.stop()
    assert time.perf_counter() - started < 0.5
    assert not [t for t in threading.enumerate() if t.name == "mnemo-lock-wait-probe"]
