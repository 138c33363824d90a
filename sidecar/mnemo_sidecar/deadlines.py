"""Deadlines and admission control.

Every RPC turns the caller's remaining time into a Deadline (minus a margin for the reply)
and checks it between units of work, so an answer is either on time or DEADLINE_EXCEEDED,
never late. The same checks stop a call its caller cancelled: cancelled Reranks used to run
to the end, and ten of them, cancelled 10 ms after sending, kept the next live Rerank waiting
17 s (overload probe). The AdmissionGate bounds how many requests may wait for the inference
threads; beyond it requests are shed with RESOURCE_EXHAUSTED instead of piling up."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from mnemo_server.errors import Cancelled, DeadlineExceeded, ResourceExhausted


class Deadline:
    def __init__(
        self,
        remaining_s: float | None,
        clock: Callable[[], float] = time.monotonic,
        alive: Callable[[], bool] | None = None,
    ):
        """`alive`: whether the caller still waits (grpc's context.is_active)."""
        self._clock = clock
        self._alive = alive
        self.at = math.inf if remaining_s is None else clock() + max(0.0, remaining_s)

    @classmethod
    def none(cls) -> Deadline:
        return cls(None)

    def remaining(self) -> float:
        return self.at - self._clock()

    def expired(self) -> bool:
        return self.remaining() <= 0

    def cancelled(self) -> bool:
        return self._alive is not None and not self._alive()

    def check(self, stage: str) -> None:
        # The deadline first: a caller whose deadline passed has gone too (grpc's context is
        # no longer active), and its call is a deadline missed, not one it cancelled.
        if self.expired():
            raise DeadlineExceeded(f"the deadline passed during {stage}", reason="SIDECAR_DEADLINE")
        if self.cancelled():
            raise Cancelled(f"the caller cancelled the call during {stage}")


# The share of the time left that one uninterruptible step of work is sized to, at the best
# pace seen: a step run at half that pace (a busy machine) still ends by the deadline.
STEP_SHARE = 0.5


def step_size(costs: Sequence[float], seconds_per_unit: float, deadline: Deadline) -> int:
    """How many of the next pieces of work (their costs in some unit, in order) to run as one
    step before the deadline is checked again: as many as fit in STEP_SHARE of the time left
    at `seconds_per_unit` (the best pace seen; 0: none seen yet), at least one. All of them
    when there is no deadline; one while the pace is unknown, which that step measures."""
    remaining = deadline.remaining()
    if math.isinf(remaining):
        return len(costs)
    if seconds_per_unit <= 0:
        return min(1, len(costs))
    budget = STEP_SHARE * remaining / seconds_per_unit
    n, total = 0, 0.0
    for cost in costs:
        total += cost
        if n and total > budget:
            break
        n += 1
    return n


def refuse_if_late(deadline: Deadline, expected_s: float, stage: str) -> None:
    """Refuse a step of work whose time at the best pace seen (expected_s, 0 when no pace is
    known yet) passes what the deadline leaves: step_size runs at least one unit, and one
    text that could not fit was embedded all the same, answering 20-85 ms after the caller's
    deadline (sidecar probe). Run, it gives only a late answer and burns CPU others need."""
    if expected_s > deadline.remaining():
        raise DeadlineExceeded(f"the deadline leaves too little time for {stage}", reason="SIDECAR_DEADLINE")


# How often a request waiting for an inference slot looks whether its caller cancelled.
_QUEUED_CHECK_S = 0.05


class AdmissionGate:
    """At most `running` requests execute and `queued` wait; the rest are refused at once.
    Waiting is itself bounded by the request's deadline."""

    def __init__(self, running: int, queued: int):
        self._slots = threading.BoundedSemaphore(running)
        self._capacity = running + queued
        self._inside = 0
        self._lock = threading.Lock()
        self.shed = 0

    @contextmanager
    def admit(self, deadline: Deadline) -> Iterator[None]:
        with self._lock:
            if self._inside >= self._capacity:
                self.shed += 1
                raise ResourceExhausted(
                    "the sidecar is at capacity; retry later", reason="SIDECAR_OVERLOADED"
                )
            self._inside += 1
        try:
            self._wait_for_slot(deadline)
            try:
                yield
            finally:
                self._slots.release()
        finally:
            with self._lock:
                self._inside -= 1

    def _wait_for_slot(self, deadline: Deadline) -> None:
        while True:
            deadline.check("the wait for an inference slot")
            if self._slots.acquire(timeout=min(_QUEUED_CHECK_S, deadline.remaining())):
                return
