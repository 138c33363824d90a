"""How long a thread that becomes ready to run waits for Python's interpreter lock (the GIL).

Why it is measured: under load most of a call's latency outside its handler is such waits.
A sync gRPC call passes between the poll thread and a worker thread several times before
its handler runs, and every DuckDB, onnxruntime or socket call releases the lock; each time,
the thread takes the lock back only once the thread holding it lets go, up to the switch
interval (5 ms) later when that one is running Python. Measured at 20k memories under the bench's
default mix: ListMemories took 1.0 ms in its handler and 15.7 ms at the client, and a thread
sleeping 1 ms woke 1.2-1.5 ms late at the median, 5 ms at p90, 10.7 ms at p99. The profile
held the lock only ~53 % of the time: the waits come from hand-overs, not from a lock busy
all the time, so they are not in a CPU profile. Serving from more processes, or less Python
per call, is what shortens them; this figure says how much there is to gain.

The probe is a daemon thread that sleeps an interval (server.lock_wait_probe_ms) and records
how late it woke: the wait for the lock plus the operating system's own delay in waking it
(~0.1 ms on an idle machine). One wake-up per interval (50 a second by default) costs nothing
measurable; below 1 ms the probe would itself be one of the threads it measures."""

from __future__ import annotations

import threading
import time

from mnemo_server.errors import FailedPrecondition
from mnemo_server.latency_histogram import Histogram, LatencyHistogram


class LockWaitProbe:
    def __init__(self, interval_ms: float):
        """`interval_ms` 0 turns the probe off."""
        if interval_ms != 0 and not interval_ms >= 1.0:
            raise FailedPrecondition(
                f"server.lock_wait_probe_ms must be 0 (off) or at least 1, not {interval_ms}",
                reason="BAD_CONFIG",
            )
        self.interval_s = interval_ms / 1000.0
        self._waits = LatencyHistogram()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    def start(self) -> None:
        """Starts measuring (nothing when the interval is 0, or when already started)."""
        if not self.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="mnemo-lock-wait-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def snapshot(self) -> Histogram:
        """How late each wake-up so far was."""
        return self._waits.snapshot()

    def _run(self) -> None:
        interval = self.interval_s
        while True:
            asleep = time.perf_counter()
            if self._stop.wait(interval):
                return
            late_ms = (time.perf_counter() - asleep - interval) * 1000.0
            self._waits.record(max(late_ms, 0.0))
