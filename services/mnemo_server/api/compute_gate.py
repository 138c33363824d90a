"""Admission for compute-bound calls.

Recall and StartSession are mostly CPU (embedding, LanceDB searches, DuckDB reads). On a
machine with few cores, running every one of them at once only adds context switches and
lock hand-offs: on 2 cores with 8 concurrent clients (100k memories) the server did 82
instead of 75 operations/s with 4 of them at a time, and Recall's p99 fell 410 -> 256 ms.
Calls beyond the slots wait their turn, within their own
deadline; calls that mostly wait on something else (writes, index waits, streams) are not
gated."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from mnemo_server.errors import DeadlineExceeded

COMPUTE_METHODS = frozenset(
    {
        "/mnemo.v1.MemoryService/Recall",
        "/mnemo.v1.MemoryService/StartSession",
    }
)


class ComputeGate:
    def __init__(self, slots: int):
        """slots <= 0: no limit."""
        self.slots = slots
        self._free = threading.Semaphore(slots) if slots > 0 else None

    @contextmanager
    def slot(self, timeout_s: float | None) -> Iterator[None]:
        """Hold one slot for the body; timeout_s is what is left of the caller's deadline."""
        if self._free is None:
            yield
            return
        # A call without a deadline reports ~1.8e19 s remaining, past what a lock wait takes.
        timeout = None if timeout_s is None else min(max(timeout_s, 0.0), threading.TIMEOUT_MAX)
        if not self._free.acquire(timeout=timeout):
            raise DeadlineExceeded(
                "the deadline passed while the call waited for a free compute slot",
                reason="QUEUED_PAST_DEADLINE",
            )
        try:
            yield
        finally:
            self._free.release()
