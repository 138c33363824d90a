"""Process-wide memory settings applied before the server starts its threads.

glibc gives every thread that allocates concurrently an arena of its own, up to 8 per core,
and memory freed into one arena is not reused by another. The server runs ~40 threads
(gRPC workers, index worker, maintenance, onnxruntime, LanceDB, DuckDB), so after a bulk
load much of its resident memory is free space spread over arenas. Capping them costs
little on a small machine: after loading 30k memories and a minute of mixed load, RSS was
1.48 GB with the default and 1.24 GB with 2 arenas (65 vs 62 operations/s, within run-to-run
variation)."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8  # glibc's mallopt parameter number


def limit_malloc_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas for threads created from now on; 0 keeps glibc's default.
    Returns whether a cap was set (False where the C library is not glibc)."""
    if arenas <= 0:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):
        log.info("not glibc: malloc arenas left as they are")
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))
