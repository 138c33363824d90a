"""Status figures: the data size counts stored data, not the model cache beside it."""

from __future__ import annotations

from pathlib import Path

from mnemo_server.diagnostics import DataDirSize, peak_rss_bytes, rss_bytes


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
    block = bytearray(64 * 2**20)  # touched: resident
    block[::4096] = b"x" * len(block[::4096])
    held = rss_bytes()
    del block
    assert held > rss_bytes() + 32 * 2**20  # given back
    # still counted in the peak (the kernel's per-thread counters lag by a few pages)
    assert peak_rss_bytes() >= held - 2**20
