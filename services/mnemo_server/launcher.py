"""Start Mnemo processes on free ports with a throwaway data directory, for commands that
measure the system from the outside (eval, bench) exactly as a client would see it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def watch_parent(parent_pid: int, interval_s: float = 1.0) -> None:
    """In a launched process: SIGTERM ourselves once the launching process is gone, so a
    crashed `mnemo up` (or eval, bench, test run) leaves no orphan behind."""

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent_pid:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def wait_for_stop(
    stop: threading.Event, poll_s: float = 0.5, on_wake: Callable[[], object] | None = None
) -> None:
    """Block the main thread until `stop` is set (by a signal handler), waking every poll_s.
    Python runs signal handlers in the main thread, between bytecodes. A signal the kernel
    delivers to another of the process's threads does not interrupt the main thread's
    untimed wait, so the handler would wait until something else woke it: a launcher's
    SIGTERM to a server went unhandled for 60 s in one CI run, until a second one came.
    `on_wake` runs at every wake-up: the main thread's own periodic work."""
    while not stop.wait(poll_s):
        if on_wake is not None:
            on_wake()


class LaunchFailed(RuntimeError):
    """A launched process ended, or did not answer in time, before it was serving."""


@dataclass
class LaunchedProcess:
    name: str
    popen: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill9(self) -> None:
        """SIGKILL: no cleanup at all (crash tests)."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait for the exit code (graceful shutdown)."""
        self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout_s)


@dataclass
class Launcher:
    """Owns a temporary directory and the processes started in it; stop() ends them all."""

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="mnemo-run-")))
    keep: bool = False
    processes: list[LaunchedProcess] = field(default_factory=list)

    def start(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        timeout_s: float = 180.0,
        *,
        replace_env: bool = False,
        append_log: bool = False,
    ) -> LaunchedProcess:
        """Run `python -m <argv> --port-file F` and wait for F. env adds to this process's
        environment, or replaces it entirely with replace_env. append_log: add to the log
        (a start after the process ended: its log says why it ended)."""
        port_file = self.root / f"{name}.port"
        # One left by an earlier run (kept directories: `mnemo up`) would be taken for this
        # process's answer, naming the old port or a process that failed to start.
        port_file.unlink(missing_ok=True)
        log = self.root / f"{name}.log"
        full_env = dict(env or {}) if replace_env else {**os.environ, **(env or {})}
        with log.open("ab" if append_log else "wb") as out:
            popen = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    *argv,
                    "--port-file",
                    str(port_file),
                    "--parent-pid",
                    str(os.getpid()),
                ],
                env=full_env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        try:
            while not port_file.exists():
                if popen.poll() is not None or time.monotonic() > deadline:
                    raise LaunchFailed(f"{name} failed to start (log: {log}):\n{log.read_text()[-4000:]}")
                time.sleep(0.05)
        except BaseException:
            # Not yet in self.processes, so stop_processes would not see it: a SIGTERM or
            # Ctrl-C to eval or bench during a start left the server warming up, writing
            # into the temporary directory removed meanwhile (probe).
            popen.kill()
            popen.wait()
            raise
        proc = LaunchedProcess(name, popen, int(port_file.read_text()), log)
        # One of this name that ended is replaced by this one (supervisor.py).
        self.processes = [p for p in self.processes if p.name != name or p.popen.poll() is None]
        self.processes.append(proc)
        return proc

    def start_sidecar(
        self,
        extra_env: dict[str, str] | None = None,
        data_dir: Path | None = None,
        port: int = 0,
        cross_encoder: Path | None = None,
        append_log: bool = False,
    ) -> LaunchedProcess:
        """The ranking sidecar, in its own process and data directory."""
        argv = [
            "mnemo_sidecar.cli",
            "serve",
            "--data-dir",
            str(data_dir or self.root / "sidecar"),
            "--port",
            str(port),
        ]
        if cross_encoder is not None:
            argv += ["--cross-encoder", str(cross_encoder)]
        return self.start("sidecar", argv, extra_env, append_log=append_log)

    def start_server(self, extra_env: dict[str, str] | None = None) -> LaunchedProcess:
        """A local-mode server (loopback, no keys) with its data under this launcher's root."""
        env = {"MNEMO_AUTH__ENABLED": "false", **(extra_env or {})}
        return self.start(
            "server",
            ["mnemo_server.cli.main", "serve", "--data-dir", str(self.root / "server"), "--port", "0"],
            env,
        )

    def end(self, proc: LaunchedProcess, timeout_s: float = 60.0) -> int:
        """Stop one process with an orderly shutdown (SIGTERM), so that it can be started
        again with the same data; returns its exit code."""
        code = proc.terminate(timeout_s)
        self.processes.remove(proc)
        (self.root / f"{proc.name}.port").unlink(missing_ok=True)
        return code

    def stop(self) -> None:
        self.stop_processes()
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def stop_processes(self) -> None:
        """An orderly stop (SIGTERM, then SIGKILL after 30 s) of every launched process,
        leaving their directory: their logs end with what they say as they stop."""
        for proc in reversed(self.processes):
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
                try:
                    proc.popen.wait(30)
                except subprocess.TimeoutExpired:
                    proc.popen.kill()
                    proc.popen.wait(10)
        for proc in self.processes:
            (self.root / f"{proc.name}.port").unlink(missing_ok=True)
        self.processes.clear()


@contextmanager
def stopped_after(launcher: Launcher | None, say: Callable[[str], object]) -> Iterator[None]:
    """Stop the launched processes when the body ends, also when the command is stopped:
    Ctrl-C, or a SIGTERM, taken as Ctrl-C meanwhile (by default it ended the command at once,
    leaving its temporary directory behind and its server to notice on its own). If the body
    failed, keep their directory: the errors a client sees name incident ids whose details
    are only in those logs."""
    previous = _sigterm_as_interrupt()
    try:
        yield
    except KeyboardInterrupt:
        say("stopped; stopping the launched processes")
        raise
    except BaseException:
        if launcher is not None and launcher.processes:
            launcher.keep = True
            say(f"failed; the launched processes' logs and data are kept in {launcher.root}")
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if launcher is not None:
            launcher.stop()


def _sigterm_as_interrupt() -> Any:
    """Make SIGTERM raise KeyboardInterrupt; returns the handler it replaced (None when this
    is not the main thread, where handlers cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)
