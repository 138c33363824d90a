"""The malloc arena cap `mnemo serve` sets: threads that allocate at once share the capped
arenas instead of getting one each. Run in child processes (the cap is process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mnemo_server.process_memory import fix_malloc_thresholds, limit_malloc_arenas

# Eight threads allocate at the same time, then glibc's malloc_info counts the heaps.
PROBE = """
import ctypes, ctypes.util, os, sys, tempfile, threading
import numpy as np
from mnemo_server.process_memory import limit_malloc_arenas
capped = limit_malloc_arenas(int(sys.argv[1]))
barrier, keep = threading.Barrier(8), []
def work():
    barrier.wait()
    for _ in range(200):
        keep.append(np.ones(2000))  # 16 KB each: malloc, not mmap
threads = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fdopen.restype = ctypes.c_void_p
with tempfile.TemporaryFile() as f:
    fp = ctypes.c_void_p(libc.fdopen(os.dup(f.fileno()), b"w"))
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    f.seek(0)
    print(capped, f.read().decode().count("<heap nr="))
"""


def heaps(arenas: int) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(arenas)], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    return out[0] == "True", int(out[1])


def test_zero_keeps_the_default() -> None:
    assert limit_malloc_arenas(0) is False
    assert limit_malloc_arenas(-1) is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_cap_limits_the_heaps_of_concurrent_threads() -> None:
    capped, default_heaps = heaps(0)
    assert not capped and default_heaps > 2  # glibc gives the threads arenas of their own
    assert heaps(2) == (True, 2)
    assert heaps(1) == (True, 1)


# After a 4 MB block is freed glibc raises its mmap threshold past 200 KB, so 50 such blocks
# then come from the heap; with the threshold fixed each gets a mapping of its own.
MAPPED = """
import ctypes, ctypes.util, sys
from mnemo_server.process_memory import fix_malloc_thresholds
fixed = fix_malloc_thresholds(int(sys.argv[1]), 1024)
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.free(libc.malloc(4 << 20))
blocks = [libc.malloc(200 << 10) for _ in range(50)]
print(fixed, libc.mallinfo2().hblks)
"""


def mapped_blocks(mmap_threshold_kb: int) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", MAPPED, str(mmap_threshold_kb)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_fixed_mmap_threshold_keeps_large_blocks_out_of_the_heap() -> None:
    assert fix_malloc_thresholds(0, 1024) is False
    fixed, mapped = mapped_blocks(0)
    assert not fixed and mapped < 5  # glibc's dynamic threshold moved past 200 KB
    fixed, mapped = mapped_blocks(128)
    assert fixed and mapped >= 50


# The server's heap after warm-up: frozen; then 200,000 long-lived objects arrive (a bulk
# load's caches) and a full collection runs.
REFREEZE = """
import gc, sys
from mnemo_server.process_memory import HeapRefreezer
gc.collect()
gc.freeze()
refreezer = HeapRefreezer(float(sys.argv[1]))
refreezer.install()
keep = [[i] for i in range(200_000)]  # lists: tracked by the collector
frozen_before = gc.get_freeze_count()
gc.collect()
due = refreezer.freeze_if_due()
newly_frozen = gc.get_freeze_count() - frozen_before
again = refreezer.freeze_if_due()
walked = len(gc.get_objects(generation=2))  # what the next full collection walks
refreezer.uninstall()
print(due, newly_frozen, again, walked, refreezer.full_collections, refreezer.freezes)
"""


def refreeze(slow_ms: float) -> list[str]:
    return subprocess.run(
        [sys.executable, "-c", REFREEZE, str(slow_ms)], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()


def test_a_slow_full_collection_freezes_what_was_loaded_after_warm_up() -> None:
    due, newly_frozen, again, walked, collections, freezes = refreeze(0.0)  # any is "slow"
    assert due == "True" and int(newly_frozen) >= 200_000 and again == "False"
    assert int(walked) < 1_000 and int(collections) >= 1 and freezes == "1"


def test_a_quick_full_collection_leaves_the_heap_to_the_collector() -> None:
    due, newly_frozen, again, walked, collections, freezes = refreeze(1e9)
    assert due == "False" and newly_frozen == "0" and again == "False"
    assert int(walked) >= 200_000 and int(collections) >= 1 and freezes == "0"
