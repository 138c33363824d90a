"""`mnemo up` starts its sidecar again when the sidecar exits on its own.

Why: the sidecar is a process of its own so that the server never depends on it, and a dead
one means baseline ranking, not errors. But when it died (the OOM killer, a crash, a stray
kill) `mnemo up` left it dead, a defunct child, and every session was ordered by the baseline
and every session's feedback waited for delivery until `mnemo up` itself was restarted
(sessions probe). compose.yaml's `restart: unless-stopped` brings it back; this does the
same for `mnemo up`. Starts are spaced by a back-off, doubling from `first_backoff_s` to
`max_backoff_s` and back to the first once a start has run `steady_s`, so a sidecar that
fails at start-up (a bad model directory, its port taken) is tried again without spinning.
It starts on the port it had, the one the server calls.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from mnemo_server.launcher import LaunchedProcess, LaunchFailed


def how_it_ended(code: int) -> str:
    """'killed by SIGKILL' or 'exit status 1', from a Popen returncode."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class Supervisor:
    def __init__(
        self,
        process: LaunchedProcess,
        start_again: Callable[[], LaunchedProcess],
        say: Callable[[str], object],
        *,
        first_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        steady_s: float = 60.0,
        poll_s: float = 0.5,
    ):
        """start_again(): the process started afresh (LaunchFailed if it does not serve)."""
        self._process = process
        self._start_again = start_again
        self._say = say
        self._first, self._max, self._steady, self._poll = first_backoff_s, max_backoff_s, steady_s, poll_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"supervise-{process.name}", daemon=True)
        self.starts = 0  # starts after the first, that served

    @property
    def process(self) -> LaunchedProcess:
        return self._process

    def start(self) -> None:
        self._thread.start()

    def halt(self) -> None:
        """Start nothing from now on, without waiting (from a signal handler: a Ctrl-C
        reaches the whole process group, and the sidecar that ended of it was started
        again while `mnemo up` drained its server; shutdown probe)."""
        self._stopping.set()

    def stop(self, timeout_s: float = 2.0) -> None:
        """No start after this returns (one under way is not waited for past timeout_s: its
        process watches this one's and ends with it)."""
        self.halt()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _watch(self) -> None:
        backoff, since = self._first, time.monotonic()
        while not self._stopping.wait(self._poll):
            code = self._process.popen.poll()
            if code is None:
                if time.monotonic() - since >= self._steady:
                    backoff = self._first
                continue
            name = self._process.name
            self._say(
                f"mnemo up: the {name} stopped ({how_it_ended(code)}); "
                f"starting it again in {backoff:g} s (log: {self._process.log})"
            )
            while True:
                if self._stopping.wait(backoff):
                    return
                backoff = min(backoff * 2, self._max)
                try:
                    self._process = self._start_again()
                    break
                except LaunchFailed as exc:
                    why = str(exc).splitlines()[0] if str(exc) else "it did not serve"
                    self._say(f"mnemo up: the {name} did not start again ({why}); trying in {backoff:g} s")
            since = time.monotonic()
            self.starts += 1
            self._say(f"mnemo up: the {name} serves again on {self._process.address}")
