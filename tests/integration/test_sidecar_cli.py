"""`mnemo-sidecar status` and `train` against a real sidecar: one line per failure, and the
sidecar's auth token sent when it has one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TOKEN = "sidecar-token-for-the-cli-test"


def _sidecar_cli(
    *args: str, token: str | None = None, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEMO_")} | (env_extra or {})
    if token:
        env["MNEMO_SIDECAR_SERVER__AUTH_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "mnemo_sidecar.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_status_and_train_send_the_token_and_fail_in_one_line(start_sidecar: Callable[..., Any]) -> None:
    side = start_sidecar(server={"auth_token": TOKEN})
    address = f"127.0.0.1:{side.port}"
    ok = _sidecar_cli("status", "--sidecar", address, token=TOKEN)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["cold_start"] is True
    for args in (["status"], ["train", "--timeout", "30"]):
        denied = _sidecar_cli(*args, "--sidecar", address)
        assert denied.returncode == 1 and "UNAUTHENTICATED" in denied.stderr, denied.stderr
        assert "Traceback" not in denied.stderr
    # No sessions stored: the refusal comes back as one line too.
    refused = _sidecar_cli("train", "--sidecar", address, "--auth-token", TOKEN)
    assert refused.returncode == 1 and "FAILED_PRECONDITION" in refused.stderr, refused.stderr
    down = _sidecar_cli("status", "--sidecar", f"127.0.0.1:{_free_port()}", "--timeout", "2")
    assert down.returncode == 1 and "Traceback" not in down.stderr
    assert down.stderr.strip().splitlines()[-1].startswith("Error: ")


def test_a_second_sidecar_on_a_data_directory_in_use_is_refused_and_changes_nothing(
    start_sidecar: Callable[..., Any], tmp_path: Path, model_cache: Path
) -> None:
    """It started serving beside the first, sharing its pair store and model registry, and
    at start-up deleted the first one's training candidate in the middle of its run."""
    data = tmp_path / "shared-sidecar"
    first = start_sidecar(data_dir=data)
    # A training run's candidate, as the first sidecar's trainer leaves it while it works.
    candidate = data / "models" / "acme" / "ranker" / "candidate-20261208T000000-1"
    candidate.mkdir(parents=True)
    (candidate / "candidate.mark").write_text("")
    refused = _sidecar_cli(
        "serve", "--data-dir", str(data), "--port", str(_free_port()), env_extra=_embedder_env(model_cache)
    )
    assert refused.returncode == 2, refused.stderr
    assert f"error: {data} is in use by another sidecar (process {os.getpid()})" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert (candidate / "candidate.mark").exists()
    assert first.engine.store.counts("acme") == (0, 0)  # still serving its store
    # Once the first has stopped, its data directory is free again.
    first.stop(0.2)
    second = start_sidecar(data_dir=data)
    assert second.port > 0


def _embedder_env(model_cache: Path) -> dict[str, str]:
    return {"MNEMO_SIDECAR_INFERENCE__EMBEDDER_CACHE_DIR": str(model_cache), "HF_HUB_OFFLINE": "1"}


def test_an_orderly_stop_takes_back_the_port_file(tmp_path: Path, model_cache: Path) -> None:
    """Left behind, it named a port nothing served, and a supervisor waiting for the file
    took it for the next start's."""
    port_file = tmp_path / "sidecar.port"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEMO_")} | _embedder_env(model_cache)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mnemo_sidecar.cli",
            "serve",
            "--data-dir",
            str(tmp_path / "sc"),
            "--port",
            "0",
            "--port-file",
            str(port_file),
        ],
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert int(port_file.read_text()) > 0
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert not port_file.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_evals_training_refused_by_the_sidecar_is_one_clear_error(start_sidecar: Callable[..., Any]) -> None:
    """`mnemo eval locomo --train-sessions` whose sessions used no memory: the sidecar's
    refusal ended the command in the Train stream's traceback (eval probe)."""
    from mnemo.ranking.v1 import ranking_service_pb2 as rpb
    from mnemo_server.errors import FailedPrecondition
    from mnemo_server.evaluation.session_eval import SidecarControl

    side = start_sidecar()
    control = SidecarControl(f"127.0.0.1:{side.port}", "nobody")
    with pytest.raises(FailedPrecondition, match="the sidecar would not train") as err:
        control.train([rpb.MODEL_KIND_RANKER], lambda _said: None)
    assert err.value.reason == "NOT_ENOUGH_SESSIONS"
