"""Ruff (lint + format) and mypy (strict) as configured in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

PATHS = ["services", "sidecar", "clients/python/mnemo_client", "clients/codegen.py", "tests"]


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)


def _existing(paths: list[str]) -> list[str]:
    return [p for p in paths if (REPO / p).exists()]


def test_ruff_lint() -> None:
    out = _run(sys.executable, "-m", "ruff", "check", *_existing(PATHS))
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format() -> None:
    out = _run(sys.executable, "-m", "ruff", "format", "--check", *_existing(PATHS))
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict() -> None:
    out = _run(sys.executable, "-m", "mypy")
    assert out.returncode == 0, out.stdout + out.stderr
