"""`mnemo-sidecar status` and `train` against a real sidecar: one line per failure, and the
sidecar's auth token sent when it has one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any

TOKEN = "sidecar-token-for-the-cli-test"


def _sidecar_cli(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEMO_")}
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
