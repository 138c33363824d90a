"""Periodic background jobs, each on its own daemon thread, stopped promptly on shutdown."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class PeriodicJob:
    name: str
    interval_s: float
    run: Callable[[], object]
    # The first run this long after start (default: a whole interval).
    first_after_s: float | None = None
    runs: int = 0
    failures: int = 0
    last_error: str = ""
    _thread: threading.Thread | None = field(default=None, repr=False)


class Scheduler:
    def __init__(self) -> None:
        self.jobs: list[PeriodicJob] = []
        self._stop = threading.Event()

    def add(
        self, name: str, interval_s: float, run: Callable[[], object], first_after_s: float | None = None
    ) -> PeriodicJob:
        job = PeriodicJob(name, interval_s, run, first_after_s)
        self.jobs.append(job)
        return job

    def start(self) -> None:
        self._stop.clear()
        for job in self.jobs:
            if job.interval_s > 0 and job._thread is None:
                job._thread = threading.Thread(
                    target=self._loop, args=(job,), name=f"mnemo-{job.name}", daemon=True
                )
                job._thread.start()

    def _loop(self, job: PeriodicJob) -> None:
        wait = job.interval_s if job.first_after_s is None else min(job.first_after_s, job.interval_s)
        while not self._stop.wait(wait):
            wait = job.interval_s
            try:
                job.run()
                job.runs += 1
            except Exception as exc:  # a failing job must not kill the thread; it retries next tick
                job.failures += 1
                job.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("background job %s failed", job.name)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        for job in self.jobs:
            if job._thread is not None:
                job._thread.join(timeout_s)
                job._thread = None
