"""Fixtures that run Mnemo as a real subprocess (`mnemo serve` / `mnemo up`), through the
same Launcher the eval and bench commands use."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mnemo_server.launcher import LaunchedProcess, Launcher

MNEMO = [sys.executable, "-m", "mnemo_server.cli.main"]
Proc = LaunchedProcess


def base_env(model_cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEMO_")}
    env.update(
        {
            "MNEMO_EMBEDDING__CACHE_DIR": str(model_cache),
            # The sidecar's embedding blend, prepared at its start-up: once per test run.
            "MNEMO_SIDECAR_INFERENCE__EMBEDDER_CACHE_DIR": str(model_cache),
            "HF_HUB_OFFLINE": "1",
        }
    )
    env.update(extra)
    return env


@pytest.fixture
def spawn(tmp_path: Path, model_cache: Path) -> Iterator[Callable[..., Proc]]:
    """spawn(mnemo args, env=None) -> a started process (its port read from --port-file)."""
    launcher = Launcher(root=tmp_path / "procs", keep=True)
    launcher.root.mkdir()
    count = 0

    def start(args: list[str], env: dict[str, str] | None = None, timeout: float = 90) -> Proc:
        nonlocal count
        count += 1
        return launcher.start(
            f"mnemo{count}",
            ["mnemo_server.cli.main", *args],
            env or base_env(model_cache),
            timeout,
            replace_env=True,
        )

    yield start
    for proc in launcher.processes:
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(10)
