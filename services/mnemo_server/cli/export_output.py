"""Where `mnemo memory export -o PATH` writes its JSONL."""

from __future__ import annotations

import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

import click


@contextmanager
def export_output(path: Path) -> Iterator[TextIO]:
    """The file to write, '-' for stdout. A regular file, or a new one, is written beside
    the path (PATH.part) and renamed over it once complete: a failed export (a server gone
    away) leaves an earlier file as it was, not emptied or cut short. Anything else there is
    written in place. An OSError is one line naming the path: at the open a bad --output
    (exit 2), later (a full disk, a pipe whose reader is gone) a failed export (exit 1)."""
    if str(path) == "-":
        yield sys.stdout
        return
    if _in_place(path):
        with _closed(_opened(path, path), path) as out:
            yield out
        return
    part = path.with_name(path.name + ".part")
    if not part.parent.is_dir():
        raise click.BadParameter(f"{part.parent} is not a directory", param_hint="--output")
    out = _opened(part, path)  # before the try: a .part never made is not removed
    try:
        with _closed(out, path):
            yield out
        try:
            part.replace(path)
        except OSError as exc:
            raise _failed(path, exc) from None
    finally:
        part.unlink(missing_ok=True)


def _in_place(path: Path) -> bool:
    """A FIFO, a device, or a link such as /dev/stdout or a shell's /dev/fd/N (`-o >(gzip >
    x.gz)`): renamed over, it was replaced rather than written to (a FIFO's reader got
    nothing; /dev/fd/N.part could not be made; as root, -o /dev/stdout put a regular file in
    /dev). A link is not followed: what it names is written through, the link kept."""
    try:
        return not stat.S_ISREG(path.lstat().st_mode)
    except OSError:  # nothing there yet, or unreachable (then the open says why)
        return False


def _opened(file: Path, path: Path) -> TextIO:
    try:
        return file.open("w", encoding="utf-8")
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
