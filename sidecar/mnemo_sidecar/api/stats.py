"""Per-RPC latency and outcome counters for GetModelStatus."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from mnemo_server.errors import Cancelled, DeadlineExceeded, ResourceExhausted
from mnemo_sidecar.deadlines import Deadline

WINDOW = 2_000


@dataclass
class RpcStats:
    calls: int = 0
    deadline_exceeded: int = 0
    shed: int = 0
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def percentile(self, q: float) -> float:
        values = sorted(self.latencies_ms)
        return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else 0.0


class LatencyStats:
    def __init__(self) -> None:
        self.rpcs: dict[str, RpcStats] = {}
        self._lock = threading.Lock()

    @contextmanager
    def track(self, rpc: str, deadline: Deadline | None = None) -> Iterator[None]:
        """Counts the call and how it ended. A call whose caller's deadline passed is in
        deadline_exceeded and not among the latencies, however it ended: by our
        DeadlineExceeded, and, with `deadline` given, by anything else once the deadline
        passed and the caller left (an answer or an error nobody waits for any more). A
        call its caller cancelled before its deadline is counted only as a call: it neither
        missed its deadline nor took the time of an answer."""
        started = time.perf_counter()
        outcome = "ok"  # errors other than these are answers too
        try:
            yield
        except DeadlineExceeded:
            outcome = "deadline"
            raise
        except ResourceExhausted:
            outcome = "shed"
            raise
        except Cancelled:
            outcome = "cancelled"
            raise
        finally:
            late = deadline is not None and deadline.expired() and deadline.cancelled()
            if outcome in ("ok", "cancelled") and late:
                outcome = "deadline"
            with self._lock:
                s = self.rpcs.setdefault(rpc, RpcStats())
                s.calls += 1
                if outcome == "deadline":
                    s.deadline_exceeded += 1
                elif outcome == "shed":
                    s.shed += 1
                elif outcome == "ok":
                    s.latencies_ms.append((time.perf_counter() - started) * 1000.0)

    def snapshot(self) -> dict[str, RpcStats]:
        with self._lock:
            return {
                k: RpcStats(v.calls, v.deadline_exceeded, v.shed, deque(v.latencies_ms))
                for k, v in self.rpcs.items()
            }
