"""Status figures: the data size counts stored data, not the model cache beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mnemo_server.diagnostics import DataDirSize, rss_bytes


def test_data_size_skips_excluded_directories(tmp_path: Path) -> None:
    (tmp_path / "lance" / "t").mkdir(parents=True)
    (tmp_path / "lance" / "t" / "frag").write_bytes(b"x" * 300)
    (tmp_path / "mnemo.duckdb").write_bytes(b"x" * 50)
    (tmp_path / "models" / "onnx").mkdir(parents=True)
    (tmp_path / "models" / "onnx" / "model.onnx").write_bytes(b"x" * 10_000)
    assert DataDirSize(tmp_path).get() == 10_350
    assert DataDirSize(tmp_path, exclude=(tmp_path / "models",)).get() == 350


def test_rss_of_this_process_is_reported() -> None:
    assert rss_bytes() > 10 * 2**20


def test_peak_rss_keeps_memory_since_given_back() -> None:
    # In a fresh process: in this one (a gigabyte resident after other tests, many threads)
    # the kernel's approximate RSS counters did not show a 64 MB block coming and going.
    probe = """
import json
from mnemo_server.diagnostics import peak_rss_bytes, rss_bytes
block = bytearray(64 * 2**20)
block[::4096] = b"x" * len(block[::4096])  # touched: resident
held = rss_bytes()
del block
print(json.dumps({"held": held, "after": rss_bytes(), "peak": peak_rss_bytes()}))
"""
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    figures = json.loads(out.stdout)
    assert figures["held"] > figures["after"] + 32 * 2**20  # given back
    # still counted in the peak (the kernel's per-thread counters lag by a few pages)
    assert figures["peak"] >= figures["held"] - 2**20
