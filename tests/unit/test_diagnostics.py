"""Status figures: the data size counts stored data, not the model cache beside it."""

from __future__ import annotations

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
