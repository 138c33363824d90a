"""`mnemo up`'s sidecar is started again when it stops on its own, with a back-off, and not
once `mnemo up` stops (supervisor.py). Real child processes stand in for the sidecar."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from mnemo_server.launcher import LaunchedProcess, LaunchFailed
from mnemo_server.supervisor import Supervisor, how_it_ended


def _child(tmp_path: Path, n: int) -> LaunchedProcess:
    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    return LaunchedProcess("sidecar", popen, 50_000 + n, tmp_path / "sidecar.log")


def _until(condition: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_killed_process_is_started_again_and_a_failed_start_is_retried_with_a_longer_wait(
    tmp_path: Path,
) -> None:
    said: list[tuple[float, str]] = []
    started: list[LaunchedProcess] = []
    attempts: list[float] = []
    fail_next = threading.Event()

    def start_again() -> LaunchedProcess:
        attempts.append(time.monotonic())
        if fail_next.is_set():
            fail_next.clear()
            raise LaunchFailed("sidecar failed to start (log: x):\ncannot listen")
        started.append(_child(tmp_path, len(started) + 1))
        return started[-1]

    first = _child(tmp_path, 0)
    supervisor = Supervisor(
        first,
        start_again,
        lambda m: said.append((time.monotonic(), m)),
        first_backoff_s=0.2,
        max_backoff_s=10.0,
        poll_s=0.02,
    )
    supervisor.start()
    try:
        first.popen.send_signal(signal.SIGKILL)
        _until(lambda: supervisor.starts == 1)
        assert supervisor.process is started[0] and started[0].popen.poll() is None
        assert first.popen.poll() == -signal.SIGKILL  # reaped: no defunct child left
        assert "the sidecar stopped (killed by SIGKILL); starting it again in 0.2 s" in said[0][1]
        assert said[-1][1] == "mnemo up: the sidecar serves again on 127.0.0.1:50001"

        # The next stop finds its start failing once: it tries again, waiting twice as long.
        fail_next.set()
        started[0].popen.terminate()
        _until(lambda: supervisor.starts == 2)
        assert "did not start again (sidecar failed to start (log: x):); trying in 0.8 s" in said[-2][1]
        assert attempts[-1] - attempts[-2] >= 0.75
    finally:
        supervisor.stop()
    for proc in (first, *started):
        proc.popen.kill()
        proc.popen.wait(10)


def test_nothing_is_started_once_stopped(tmp_path: Path) -> None:
    started: list[LaunchedProcess] = []

    def start_again() -> LaunchedProcess:
        started.append(_child(tmp_path, 1))
        return started[-1]

    first = _child(tmp_path, 0)
    supervisor = Supervisor(first, start_again, lambda _: None, first_backoff_s=0.3, poll_s=0.02)
    supervisor.start()
    first.popen.kill()
    first.popen.wait(10)
    time.sleep(0.1)  # seen, waiting out its back-off
    supervisor.stop()
    time.sleep(0.4)
    assert started == [] and supervisor.starts == 0


def test_how_a_process_ended_is_said_plainly() -> None:
    assert how_it_ended(-9) == "killed by SIGKILL"
    assert how_it_ended(1) == "exit status 1"
    assert how_it_ended(-200) == "killed by signal 200"
