"""Where `mnemo memory export -o PATH` writes: whole or not at all for files, links to files
included, with the replaced file's permissions (real files in a temporary directory)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import click
import pytest

from mnemo_server.cli.export_output import export_output


class _ServerGone(Exception):
    pass


def _write_then_lose_the_server(path: Path) -> None:
    with export_output(path) as out:
        out.write('{"id": "new"}\n')
        raise _ServerGone


def _fail_midway(path: Path) -> None:
    """An export that writes a line and then loses its server."""
    with pytest.raises(_ServerGone):
        _write_then_lose_the_server(path)


def test_a_link_to_a_file_is_kept_and_the_file_replaced_whole(tmp_path: Path) -> None:
    real = tmp_path / "backups" / "memories.jsonl"
    real.parent.mkdir()
    real.write_text('{"id": "old"}\n')
    link = tmp_path / "latest.jsonl"
    link.symlink_to(real)

    _fail_midway(link)  # written through in place, this left the file cut short
    assert real.read_text() == '{"id": "old"}\n'
    assert not list(real.parent.glob("*.part")) and not list(tmp_path.glob("*.part"))

    with export_output(link) as out:
        out.write('{"id": "a"}\n')
        # Written beside the file the link names, not beside the link.
        assert [p.name for p in real.parent.glob("*.part")] == ["memories.jsonl.part"]
        assert real.read_text() == '{"id": "old"}\n'
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert real.read_text() == '{"id": "a"}\n'
    assert not list(real.parent.glob("*.part"))


def test_the_replaced_files_permissions_hold_from_the_first_byte(tmp_path: Path) -> None:
    kept = tmp_path / "private.jsonl"
    kept.write_text("old\n")
    kept.chmod(0o600)
    old_umask = os.umask(0o022)
    try:
        with export_output(kept) as out:
            out.write("new\n")
            out.flush()
            part = tmp_path / "private.jsonl.part"
            assert stat.S_IMODE(part.stat().st_mode) == 0o600
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and kept.read_text() == "new\n"
        # A .part left by a killed run with looser permissions is tightened too.
        stale = tmp_path / "private.jsonl.part"
        stale.write_text("stale")
        stale.chmod(0o644)
        with export_output(kept) as out:
            assert stat.S_IMODE(stale.stat().st_mode) == 0o600
            out.write("newer\n")
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and kept.read_text() == "newer\n"
        # A new file gets the usual permissions.
        fresh = tmp_path / "fresh.jsonl"
        with export_output(fresh) as out:
            out.write("x\n")
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
    finally:
        os.umask(old_umask)


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("length", [251, 255])
def test_a_name_too_long_for_its_part_is_still_written_whole(tmp_path: Path, length: int) -> None:
    """FILE.part past 255 bytes was "File name too long" for a valid --output."""
    path = tmp_path / ("é" * ((length - 6) // 2) + "x" * ((length - 6) % 2) + ".jsonl")
    assert len(os.fsencode(path.name)) == length
    path.write_text("old\n")
    _fail_midway(path)
    assert path.read_text() == "old\n" and _names(tmp_path) == [path.name]
    with export_output(path) as out:
        out.write("new\n")
        assert len(_names(tmp_path)) == 2  # the file and its shorter .part
    assert path.read_text() == "new\n" and _names(tmp_path) == [path.name]


def test_a_dangling_link_makes_the_file_it_names(tmp_path: Path) -> None:
    link = tmp_path / "out.jsonl"
    link.symlink_to(tmp_path / "made.jsonl")
    with export_output(link) as out:
        out.write("x\n")
    assert link.is_symlink() and (tmp_path / "made.jsonl").read_text() == "x\n"


def test_a_link_to_a_fifo_is_written_through_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "to-fifo"
    link.symlink_to(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with export_output(link) as out:
            out.write("through\n")
        assert os.read(reader, 100) == b"through\n"
    finally:
        os.close(reader)
    assert link.is_symlink() and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_part_in_a_missing_directory_is_a_bad_output(tmp_path: Path) -> None:
    with (
        pytest.raises(click.BadParameter, match="is not a directory"),
        export_output(tmp_path / "nowhere" / "x.jsonl"),
    ):
        pass
