"""Where `mnemo memory export -o PATH` writes its JSONL."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

import click

_NAME_MAX = 255  # bytes in one path component (Linux, macOS)


@contextmanager
def export_output(path: Path) -> Iterator[TextIO]:
    """The file to write, '-' for stdout. A regular file, or a new one, is written beside
    the file (FILE.part) and renamed over it once complete: a failed export (a server gone
    away) leaves an earlier file as it was, not emptied or cut short. A link to a regular
    file is kept and the file it names replaced the same way. Anything else there is
    written in place. An OSError is one line naming the path: at the open a bad --output
    (exit 2), later (a full disk, a pipe whose reader is gone) a failed export (exit 1)."""
    if str(path) == "-":
        yield sys.stdout
        return
    target = _replaced_whole(path)
    if target is None:
        with _closed(_opened(path, path), path) as out:
            yield out
        return
    if len(os.fsencode(target.name)) > _NAME_MAX:  # refused before the export, not at its rename
        raise click.BadParameter(f"{path}: {os.strerror(errno.ENAMETOOLONG)}", param_hint="--output")
    part = _part_beside(target)
    if not part.parent.is_dir():
        raise click.BadParameter(f"{part.parent} is not a directory", param_hint="--output")
    mode = _mode_of(target)
    out = _opened(part, path, mode)  # before the try: a .part never made is not removed
    try:
        with _closed(out, path):
            yield out
        try:
            part.replace(target)
        except OSError as exc:
            raise _failed(path, exc) from None
    finally:
        part.unlink(missing_ok=True)


def _replaced_whole(path: Path) -> Path | None:
    """The file the export is renamed onto: path itself when it is a regular file or nothing
    is there yet, the file a link names when that is a regular file (written through in
    place, a failed export left it cut short). None for what must be written in place: a
    FIFO, a device, a link to one such as /dev/stdout or a shell's /dev/fd/N (`-o >(gzip >
    x.gz)`; renamed over, it was replaced rather than written to: a FIFO's reader got
    nothing, /dev/fd/N.part could not be made, as root -o /dev/stdout put a regular file in
    /dev), and a dangling link (the open makes the file it names)."""
    try:
        mode = path.lstat().st_mode
    except OSError:  # nothing there yet, or unreachable (then the open says why)
        return path
    if stat.S_ISREG(mode):
        return path
    if stat.S_ISLNK(mode):
        try:
            if stat.S_ISREG(path.stat().st_mode):
                return Path(os.path.realpath(path))
        except OSError:
            pass
    return None


def _part_beside(target: Path) -> Path:
    """FILE.part, or a shorter name when that one is past the file system's 255 bytes (a
    valid --output of 251-255 bytes was refused as "File name too long")."""
    name = target.name + ".part"
    if len(os.fsencode(name)) > _NAME_MAX:
        name = f".{hashlib.sha256(os.fsencode(target.name)).hexdigest()[:16]}.export.part"
    return target.with_name(name)


def _mode_of(target: Path) -> int | None:
    """The permissions of the file an export replaces, for its replacement from the first
    byte on: an export kept 0600 became world-readable under the usual umask."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        return None


def _opened(file: Path, path: Path, mode: int | None = None) -> TextIO:
    try:
        if mode is None:
            return file.open("w", encoding="utf-8")
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        os.fchmod(fd, mode)  # past the umask, and on a .part left by an earlier run
        return os.fdopen(fd, "w", encoding="utf-8")
    except OSError as exc:
        raise click.BadParameter(f"{path}: {exc.strerror or exc}", param_hint="--output") from None


@contextmanager
def _closed(out: TextIO, path: Path) -> Iterator[TextIO]:
    """out, closed at the end; a failed write or close (its flush) is a failed export."""
    try:
        with out:
            yield out
    except OSError as exc:
        raise _failed(path, exc) from None


def _failed(path: Path, exc: OSError) -> click.ClickException:
    return click.ClickException(f"{path}: {exc.strerror or exc}")
