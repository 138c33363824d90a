"""A process waiting for its stop signal must act on a SIGTERM whichever of its threads the
kernel hands it to (launcher.wait_for_stop). The main thread here blocks SIGTERM, so the
kernel must deliver it to the other thread; Python's handler still runs only in the main
thread, and only once that thread runs again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

_SCRIPT = textwrap.dedent(
    """
    import signal, sys, threading, time
    from mnemo_server.launcher import wait_for_stop

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ready = threading.Event()

    def other() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        ready.set()
        time.sleep(60)

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the thread below unblocks it
    threading.Thread(target=other, daemon=True).start()
    ready.wait()
    print("waiting", flush=True)
    if sys.argv[1] == "untimed":
        stop.wait()
    else:
        wait_for_stop(stop, poll_s=0.2)
    print("stopped", flush=True)
    """
)


def _stop_after_sigterm(mode: str) -> tuple[float | None, str]:
    """(seconds from the SIGTERM to the exit, or None if it had not exited 5 s later; what
    it printed after "waiting")."""
    with subprocess.Popen([sys.executable, "-c", _SCRIPT, mode], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "waiting"
        time.sleep(0.2)
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
            took: float | None = time.monotonic() - sent
        except subprocess.TimeoutExpired:
            took = None
            proc.kill()
        return took, proc.stdout.read().strip()


def test_a_sigterm_delivered_to_another_thread_stops_the_wait() -> None:
    took, printed = _stop_after_sigterm("polling")
    assert took is not None and took < 2.0 and printed == "stopped"


@pytest.mark.timeout(30)
def test_an_untimed_wait_misses_it() -> None:
    """The failure wait_for_stop exists for: the plain Event.wait() of before never wakes."""
    took, printed = _stop_after_sigterm("untimed")
    assert took is None and printed == ""
