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
  but 58 vs 71 ops/s (one run each).
Fixed malloc thresholds (`fix_malloc_thresholds`, on by default: 128 KB mmap, 1 MB trim)
cost no throughput we could see and save memory: `mnemo bench --memories 30000
--duration 30 --train-sessions 0`, one run each: peak RSS 1,384 MB / 63.5 ops/s with
glibc's dynamic thresholds, 1,285 MB / 66.7 with the mmap threshold fixed, 1,272 MB / 70.6
with the trim threshold too; the 100k bench 2,036 -> 1,897 MB (47.6 vs 40.2 ops/s, runs
hours apart on a shared machine).
mimalloc preloaded in glibc's place kept more, not less (30k bench: 3.2 GB peak with its
defaults, 1.50 GB with MIMALLOC_PURGE_DELAY=0 and no huge pages, 1.27 GB with glibc and the
fixed thresholds; throughput the same within noise), so the server stays on glibc.

Python's cyclic garbage collector: a full (generation 2) collection walks every tracked
object while holding the GIL, so each one stops every call. On settled 100k data under the
bench's mix (a minute, C 8) there were 5-6 of them, **126-182 ms each**, a stop of the whole
server every ~12 s: most of what warm-up loads (caches, id maps, postings) lives as long as
the process. `freeze_warm_heap` moves the objects alive once the server serves into the
permanent generation, which collections skip: then 13-14 full collections in the same
minute, **3-24 ms each** (two runs each, gc.callbacks timing every collection). In three
alternating pairs of that minute without / with it, the tails relative to the medians
fell (p99 / p50: Recall 3.00 -> 2.78, StartSession 2.80 -> 2.71, EndSession 2.63 -> 2.21)
and ListMemories' slowest call, ~0.7 ms of work, went from 43-217 ms to 48-54. The cost:
a frozen object that later becomes garbage inside a reference cycle is never reclaimed (one
without a cycle still is, by its reference count); only what existed at the freeze can be
lost that way, once. `thaw_heap` gives them back to the collector when the server has
stopped: otherwise the DuckDB objects among them outlive the interpreter's last collection
and its bindings (nanobind) print dozens of "leaked" lines at every exit."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import time

log = logging.getLogger(__name__)

# glibc's mallopt parameter numbers
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def _mallopt(param: int, value: int) -> bool:
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):
        log.info("not glibc: malloc settings left as they are")
        return False
    return bool(mallopt(param, value))


def limit_malloc_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas for threads created from now on; 0 keeps glibc's default.
    Returns whether a cap was set (False where the C library is not glibc)."""
    return arenas > 0 and _mallopt(_M_ARENA_MAX, arenas)


def fix_malloc_thresholds(mmap_threshold_kb: int, trim_threshold_kb: int) -> bool:
    """Serve allocations of at least `mmap_threshold_kb` from their own mappings, given back
    to the system when freed, and trim a heap's free top beyond `trim_threshold_kb`; 0
    keeps glibc's dynamic thresholds. glibc's own threshold starts at 128 KB but rises to
    the size of every large block freed (up to 32 MB), after which the big transient
    buffers of a bulk load (embedding batches, Arrow/LanceDB appends, index builds) come
    from the arenas and stay resident there."""
    if mmap_threshold_kb <= 0:
        return False
    ok = _mallopt(_M_MMAP_THRESHOLD, mmap_threshold_kb << 10)
    if ok and trim_threshold_kb > 0:
        ok = _mallopt(_M_TRIM_THRESHOLD, trim_threshold_kb << 10)
    return ok


def freeze_warm_heap() -> int:
    """Collect, then move every object alive now out of the collector's reach (gc.freeze);
    returns how many. Call once the server has warmed up, in the process that serves (not in
    a host process that will drop the server again, whose objects would then stay frozen)."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info(
        "froze %d objects of the warm heap in %.2f s: full collections no longer walk them",
        frozen,
        time.perf_counter() - started,
    )
    return frozen


class HeapRefreezer:
    """Freezes the heap again when a full collection was slow. `freeze_warm_heap` covers
    what warm-up loaded; what the server loads later (a tenant's first searches, a bulk
    import: caches, id maps and postings that live as long as the process) is walked by
    every full collection again, each one stopping every call. A gen2 collection that took
    `slow_ms` or more marks the heap due; `freeze_if_due` (the main thread's wake-up, every
    0.5 s) then freezes it. Each freeze can keep, once, the reference cycles alive at that
    moment that later become garbage (see above); freezes come only as the long-lived heap
    grows by what takes `slow_ms` to walk, so their number is bounded by its growth. In the
    100k bench (every memory loaded after start-up) there were five in ~20 minutes, after
    collections of 22-26 ms; the frozen heap stayed at ~260k objects, as frozen objects
    still die by their reference counts. The collections of 126-182 ms above were measured
    before the row cache was packed."""

    def __init__(self, slow_ms: float):
        self.slow_s = slow_ms / 1000.0
        self._started = 0.0
        self._due_after_s = 0.0  # the slow collection's length; 0: not due
        self.full_collections = 0
        self.slowest_s = 0.0
        self.total_s = 0.0
        self.freezes = 0

    def install(self) -> None:
        gc.callbacks.append(self._on_gc)

    def uninstall(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        # Runs inside the collection (GIL held, any thread): only arithmetic here.
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        self.full_collections += 1
        self.total_s += took
        self.slowest_s = max(self.slowest_s, took)
        if took >= self.slow_s:
            self._due_after_s = took

    def freeze_if_due(self) -> bool:
        took, self._due_after_s = self._due_after_s, 0.0
        if not took:
            return False
        gc.freeze()
        self.freezes += 1
        log.info(
            "a full collection took %.0f ms: froze the heap again (%d objects frozen in all)",
            took * 1000,
            gc.get_freeze_count(),
        )
        return True

    def summary(self) -> str:
        return (
            f"{self.full_collections} full collections, {self.total_s * 1000:.0f} ms in all, "
            f"the slowest {self.slowest_s * 1000:.0f} ms; {self.freezes} re-freezes"
        )


def thaw_heap() -> None:
    """Undo `freeze_warm_heap` once the server has stopped, and collect: what the frozen
    heap held in reference cycles (DuckDB's connections among it) is freed before the
    interpreter exits."""
    if gc.get_freeze_count():
        gc.unfreeze()
        gc.collect()
