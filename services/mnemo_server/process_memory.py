"""Process-wide memory settings applied before the server starts its threads.

glibc gives every thread that allocates concurrently an arena of its own, up to 8 per core,
and memory freed into one arena is not reused by another. The server runs ~40 threads
(gRPC workers, index worker, maintenance, onnxruntime, LanceDB, DuckDB), so after a bulk
load part of its resident memory is free space spread over arenas. Capping them trades
throughput for memory, so it is off by default. Measured on 2 cores, C 8 mixed load:
- 2 arenas: peak RSS of the 100k bench 2.12 -> 1.82 GB, but on settled 100k data 10-15 %
  fewer operations/s (47 vs 56 and 56 vs 62 in alternating runs); 30k after a load
  1.48 -> 1.24 GB.
- 4 arenas: on settled 100k data the same throughput within noise (64 / 63 vs 64 / 68
  ops/s) for 30 MB less; the minute right after a 30k load 70 MB less (1.22 vs 1.29 GB)
  but 58 vs 71 ops/s (one run each)."""

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
