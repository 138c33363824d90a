"""Finished files and directories that survive a power cut, not only a killed process.

A rename is atomic, but the renamed name can reach the disk before the data it names: after
a power cut the name is there and the file is empty or short. So the data is synced first,
then renamed, then the directory that holds the new name is synced. A kill -9 alone never
needs this (the page cache outlives the process); a machine that loses power does.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def fsync_path(path: Path) -> None:
    """Sync one file's data, or one directory's entries."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Sync every file under root, then every directory, deepest first, root last."""
    directories: list[Path] = []
    for here, _, files in os.walk(root):
        for name in files:
            fsync_path(Path(here) / name)
        directories.append(Path(here))
    for directory in reversed(directories):
        fsync_path(directory)


def replace_file(staged: Path, target: Path) -> None:
    """Put a fully written file in target's place: synced, renamed, the rename synced."""
    fsync_path(staged)
    staged.replace(target)
    fsync_path(target.parent)


def write_text_durably(target: Path, text: str) -> None:
    staged = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    staged.write_text(text, encoding="utf-8")
    replace_file(staged, target)


def rename_tree(staged: Path, target: Path) -> None:
    """Move a fully written directory to target (which must not exist): everything in it
    synced first, then the rename, then the parent."""
    fsync_tree(staged)
    staged.rename(target)
    fsync_path(target.parent)
