"""Periodic jobs: a job may run first soon after start, then every interval."""

from __future__ import annotations

import threading
import time

from mnemo_server.workers.scheduler import Scheduler


def test_a_job_runs_first_after_its_first_delay_then_every_interval() -> None:
    """The retention sweep ran only a whole interval (6 h) after start, so a server
    restarted more often never purged anything (probe); it now runs soon after start."""
    ran = threading.Event()
    scheduler = Scheduler()
    soon = scheduler.add("soon", 3600.0, ran.set, first_after_s=0.05)
    late = scheduler.add("late", 3600.0, lambda: None)
    scheduler.start()
    try:
        assert ran.wait(5.0)
        deadline = time.monotonic() + 5.0
        while soon.runs < 1 and time.monotonic() < deadline:  # counted once run returns
            time.sleep(0.01)
        assert soon.runs == 1 and late.runs == 0
    finally:
        scheduler.stop()
