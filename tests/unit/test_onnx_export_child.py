"""The one-time ONNX export runs in a child process that ends with the process that asked
for it: a server killed during its first start left the export running on as an orphan,
writing into the staging directory the next start's export uses too (crash probe)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PARENT = """
import sys
from pathlib import Path
from mnemo_server.embed.embedder import bundled_model_path
from mnemo_server.embed.onnx_export import export_to_onnx
export_to_onnx(bundled_model_path(), Path(sys.argv[1]))
"""


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_the_export_ends_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path / "onnx")])
    try:
        deadline = time.monotonic() + 60
        while not (children := _children(parent.pid)):
            assert parent.poll() is None and time.monotonic() < deadline, "no export child started"
            time.sleep(0.05)
        [child] = children
        assert "mnemo_server.embed.onnx_export" in Path(f"/proc/{child}/cmdline").read_text()
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        # It checks on its parent every 0.2 s. (Before, it ran on for 2-4 s here, until its
        # first write to the closed pipe of its parent; in a server, until it was done.)
        deadline = time.monotonic() + 1.5
        while _alive(child):
            assert time.monotonic() < deadline, "the export outlived its parent"
            time.sleep(0.02)
        assert not (tmp_path / "onnx" / "model.onnx").exists()  # nothing finished in its name
    finally:
        parent.kill()
