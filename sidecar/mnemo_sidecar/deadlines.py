"""Deadlines and admission control.

Every RPC turns the caller's remaining time into a Deadline (minus a margin for the reply)
and checks it between units of work, so an answer is either on time or DEADLINE_EXCEEDED,
never late. The AdmissionGate bounds how many requests may wait for the inference threads;
beyond it requests are shed with RESOURCE_EXHAUSTED instead of piling up."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mnemo_server.errors import DeadlineExceeded, ResourceExhausted


class Deadline:
    def __init__(self, remaining_s: float | None, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.at = math.inf if remaining_s is None else clock() + max(0.0, remaining_s)

    @classmethod
    def none(cls) -> Deadline:
        return cls(None)

    def remaining(self) -> float:
        return self.at - self._clock()

    def expired(self) -> bool:
        return self.remaining() <= 0

    def check(self, stage: str) -> None:
        if self.expired():
            raise DeadlineExceeded(f"the deadline passed during {stage}", reason="SIDECAR_DEADLINE")


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
            timeout = deadline.remaining()
            if timeout <= 0 or not self._slots.acquire(timeout=timeout):
                raise DeadlineExceeded("the deadline passed while queued", reason="SIDECAR_DEADLINE")
            try:
                yield
            finally:
                self._slots.release()
        finally:
            with self._lock:
                self._inside -= 1
