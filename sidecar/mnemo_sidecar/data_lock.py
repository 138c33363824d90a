"""One sidecar per data directory: an exclusive lock on DATA/sidecar.lock, held while the
process lives.

Why: a second `mnemo-sidecar serve` on a data directory in use started serving beside the
first, sharing its pair store and model registry, and at start-up deleted the first one's
training candidate in the middle of its run (CLI probe). The server refuses a data directory
in use through DuckDB's own lock; SQLite lets a second process write the pair store, so the
sidecar takes a lock of its own, before it opens anything there. The kernel drops it when the
process ends, however it ends: a kill -9 leaves nothing to clean up, and a training process
(spawned, not forked) does not inherit it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from mnemo_server.errors import FailedPrecondition

LOCK_NAME = "sidecar.lock"


def hold_data_dir(data: Path) -> int:
    """The locked file's descriptor (close it to let go); DATA_DIR_LOCKED if another
    process holds it."""
    path = data / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise FailedPrecondition(
            f"{data} is in use by another sidecar{holder}: one sidecar per data directory",
            reason="DATA_DIR_LOCKED",
        ) from None
    # Who holds it, for the next one refused (the lock, not this text, is what counts).
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _holder(fd: int) -> str:
    pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return f" (process {pid})" if pid.isdigit() else ""
