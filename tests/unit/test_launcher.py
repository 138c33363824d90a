"""stopped_after: launched processes always stop; after a failure their logs stay."""

from __future__ import annotations

import subprocess

import pytest

from mnemo_server.launcher import LaunchedProcess, Launcher, stopped_after


def _launcher_with_a_process() -> tuple[Launcher, subprocess.Popen[bytes]]:
    launcher = Launcher()
    log = launcher.root / "server.log"
    log.write_text("incident abc123 in /mnemo.v1.MemoryService/StartSession\n")
    proc = subprocess.Popen(["sleep", "60"])
    launcher.processes.append(LaunchedProcess("server", proc, 1, log))
    return launcher, proc


def test_a_failure_keeps_the_logs_and_says_where() -> None:
    launcher, proc = _launcher_with_a_process()
    said: list[str] = []
    with pytest.raises(RuntimeError), stopped_after(launcher, said.append):
        raise RuntimeError("INTERNAL: incident abc123")
    assert proc.poll() is not None
    assert (launcher.root / "server.log").read_text().startswith("incident abc123")
    assert said == [f"failed; the launched processes' logs and data are kept in {launcher.root}"]
    launcher.keep = False
    launcher.stop()  # clean up the kept directory
    assert not launcher.root.exists()


def test_success_stops_and_removes_everything() -> None:
    launcher, proc = _launcher_with_a_process()
    said: list[str] = []
    with stopped_after(launcher, said.append):
        pass
    assert proc.poll() is not None
    assert not launcher.root.exists()
    assert said == []
    with stopped_after(None, said.append):  # nothing launched (a --server run)
        pass
