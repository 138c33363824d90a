"""Process-level figures for GetStatus: resident memory and data-directory size."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size (Linux /proc); 0 where unavailable."""
    return _status_bytes(pid, "VmRSS:")


def peak_rss_bytes(pid: int | str = "self") -> int:
    """The highest resident set size since the process started; 0 where unavailable."""
    return _status_bytes(pid, "VmHWM:")


def _status_bytes(pid: int | str, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def dir_bytes(path: Path, exclude: frozenset[Path] = frozenset()) -> int:
    """Bytes of the files under path, skipping the directories in exclude (resolved paths)."""
    total = 0
    stack = [str(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for e in entries:
                    if e.is_dir(follow_symlinks=False):
                        if not exclude or Path(e.path).resolve() not in exclude:
                            stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
        except OSError:
            continue  # a file vanished mid-walk (LanceDB compaction): skip it
    return total


class DataDirSize:
    """dir_bytes with a short cache: LanceDB keeps many files and status may be polled."""

    def __init__(self, path: Path, ttl_s: float = 10.0, exclude: tuple[Path, ...] = ()):
        self.path = path
        # The model cache is not data: it would add ~140 MB to every per-memory figure.
        self.exclude = frozenset(p.resolve() for p in exclude)
        self.ttl_s = ttl_s
        self._value = 0
        self._at = -1e9
        self._lock = threading.Lock()

    def get(self) -> int:
        with self._lock:
            if time.monotonic() - self._at > self.ttl_s:
                self._value = dir_bytes(self.path, self.exclude)
                self._at = time.monotonic()
            return self._value
