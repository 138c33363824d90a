"""Fixtures that run Mnemo as a real subprocess (`mnemo serve` / `mnemo up`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

MNEMO = [sys.executable, "-m", "mnemo_server.cli.main"]


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill9(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def terminate(self, timeout: float = 20) -> int:
        self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout)


def base_env(model_cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEMO_")}
    env.update({"MNEMO_EMBEDDING__CACHE_DIR": str(model_cache), "HF_HUB_OFFLINE": "1"})
    env.update(extra)
    return env


@pytest.fixture
def spawn(tmp_path: Path, model_cache: Path) -> Iterator[Callable[..., Proc]]:
    procs: list[Proc] = []

    def start(args: list[str], env: dict[str, str] | None = None, timeout: float = 90) -> Proc:
        n = len(procs)
        port_file = tmp_path / f"port{n}"
        port_file.unlink(missing_ok=True)
        log = tmp_path / f"proc{n}.log"
        with log.open("wb") as out:  # the child keeps its own descriptor
            popen = subprocess.Popen(
                [*MNEMO, *args, "--port-file", str(port_file)],
                env=env or base_env(model_cache),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if popen.poll() is not None:
                raise AssertionError(f"mnemo exited with {popen.returncode}:\n{log.read_text()}")
            if time.monotonic() > deadline:
                popen.kill()
                raise AssertionError(f"mnemo did not start in {timeout}s:\n{log.read_text()}")
            time.sleep(0.05)
        proc = Proc(popen, int(port_file.read_text()), log)
        procs.append(proc)
        return proc

    yield start
    for p in procs:
        if p.popen.poll() is None:
            p.popen.kill()
            p.popen.wait(10)
