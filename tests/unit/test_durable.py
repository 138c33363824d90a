"""Data before names: what is synced, and in which order, when a finished file or model
version is put in place. A power cut cannot be staged here, so the real syncs and renames
run while their order is recorded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mnemo_server.store.durable import fsync_tree, rename_tree, write_text_durably
from mnemo_sidecar.learning.model import ModelKind
from mnemo_sidecar.learning.registry import ModelRegistry

Events = list[tuple[str, Path]]


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Events:
    seen: Events = []
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd: int) -> None:
        seen.append(("sync", Path(f"/proc/self/fd/{fd}").readlink()))
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(("name", Path(dst)))
        real_replace(src, dst)

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(("name", Path(dst)))
        real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", rename)
    return seen


def _tree(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    (root / "a.onnx").write_bytes(b"weights")
    (root / "sub" / "b.json").write_text("{}")


def test_a_tree_is_synced_files_first_and_its_root_last(tmp_path: Path, events: Events) -> None:
    _tree(tmp_path / "v")
    fsync_tree(tmp_path / "v")
    synced = [p for kind, p in events if kind == "sync"]
    v = tmp_path / "v"
    assert set(synced) == {v / "a.onnx", v / "sub" / "b.json", v / "sub", v}
    assert synced.index(tmp_path / "v" / "sub" / "b.json") < synced.index(tmp_path / "v" / "sub")
    assert synced[-1] == tmp_path / "v"


def test_a_renamed_tree_and_a_replaced_file_are_synced_before_and_after_their_name(
    tmp_path: Path, events: Events
) -> None:
    _tree(tmp_path / "staged")
    rename_tree(tmp_path / "staged", tmp_path / "done")
    name = events.index(("name", tmp_path / "done"))
    assert ("sync", tmp_path / "staged" / "a.onnx") in events[:name]
    assert events[name + 1 :] == [("sync", tmp_path)]
    assert (tmp_path / "done" / "sub" / "b.json").read_text() == "{}"

    events.clear()
    write_text_durably(tmp_path / "pointer.json", '{"v": 2}')
    assert [kind for kind, _ in events] == ["sync", "name", "sync"]
    assert events[1:] == [("name", tmp_path / "pointer.json"), ("sync", tmp_path)]
    assert (tmp_path / "pointer.json").read_text() == '{"v": 2}'
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_promoted_versions_files_reach_the_disk_before_the_pointer_names_it(
    tmp_path: Path, events: Events
) -> None:
    reg = ModelRegistry(tmp_path)
    version, directory = reg.new_version("t", ModelKind.RANKER)
    (directory / "ranker.onnx").write_bytes(b"model")
    (directory / "meta.json").write_text("{}")
    events.clear()
    reg.promote("t", ModelKind.RANKER, version, "model", "test")
    pointer = tmp_path / "t" / "ranker" / "current.json"
    named = events.index(("name", pointer))
    before = {p for kind, p in events[:named] if kind == "sync"}
    assert {directory / "ranker.onnx", directory / "meta.json", directory} <= before
    assert ("sync", pointer.parent) in events[named + 1 :]
    assert ModelRegistry(tmp_path).pointer("t", ModelKind.RANKER)["version"] == version  # type: ignore[index]
