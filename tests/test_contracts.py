"""The contracts: buf lint (STANDARD), buf breaking against the previous commit, and the
committed generated code being exactly what regenerating produces."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

BUF = REPO / "clients" / "node" / "node_modules" / ".bin" / "buf"


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


def _tree(root: Path) -> dict[str, Path]:
    return {
        str(p.relative_to(root)): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_buf_lint() -> None:
    out = _run(str(BUF), "lint")
    assert out.returncode == 0, out.stdout + out.stderr


def test_buf_breaking_against_previous_commit() -> None:
    has_parent = _run("git", "rev-parse", "--verify", "--quiet", "HEAD~1^{commit}").returncode == 0
    if not has_parent or _run("git", "cat-file", "-e", "HEAD~1:proto").returncode != 0:
        pytest.skip("no previous commit with proto/ to compare against (shallow clone or first commit)")
    out = _run(str(BUF), "breaking", "--against", ".git#ref=HEAD~1")
    assert out.returncode == 0, out.stdout + out.stderr


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    out = _run(sys.executable, "clients/codegen.py", "--out", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    for fresh_root, committed_root in [
        (tmp_path / "clients" / "python" / "mnemo", REPO / "clients" / "python" / "mnemo"),
        (tmp_path / "clients" / "node" / "src" / "gen", REPO / "clients" / "node" / "src" / "gen"),
    ]:
        fresh, committed = _tree(fresh_root), _tree(committed_root)
        assert sorted(fresh) == sorted(committed), f"files differ under {committed_root}"
        stale = [name for name in fresh if not filecmp.cmp(fresh[name], committed[name], shallow=False)]
        assert not stale, f"regenerate with `python clients/codegen.py`: {stale}"
