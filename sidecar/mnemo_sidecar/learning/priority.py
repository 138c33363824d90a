"""Training yields the CPU to serving.

A training run (a cross-encoder fine-tune takes minutes of both cores here) shares the
machine with the sidecar's Score and Rerank, which answer under StartSession's deadline,
and usually with the server too. At the default priority the kernel gives it an equal share
of the cores, so every call made while it runs waits its turn. Its thread is made
nicer than the rest of the process instead (Linux keeps a nice value per thread), and the
threads it starts inherit that: torch's and LightGBM's worker pools, created by the thread
that first runs a parallel section in them. Serving threads keep theirs.

Measured: settled 100k data, one minute of the bench's mix at C 8, a forced training (the
bundled MiniLM fine-tuned on the sessions the mix had ended so far) started 18 s in, four
alternating rounds. Nice 0: 135 / 129 / 127 / 117 operations/s, StartSession p99 151 / 156 /
155 / 163 ms, Recall p50 55-64 ms; nice 10: 161 / 134 / 141 / 168 operations/s, StartSession
p99 130 / 150 / 146 / 126 ms, Recall p50 45-58 ms. The niced fine-tune got through 12-15
steps in that time against 32-36 (the same minute without training: ~178 operations/s,
StartSession p99 ~100 ms). A nice value cannot yield the GIL, which a run in a thread of the
sidecar shared with Score: runs have their own process now (training_process.py), whose
training thread is lowered the same way.

Only on Linux: elsewhere the call would name a process, not a thread."""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)


def lower_this_thread(nice: int) -> int:
    """Make the calling thread `nice` steps nicer than it is (0: leave it); returns its
    nice value afterwards. A value the system refuses is logged, never raised: training at
    the normal priority is slower for the callers, not wrong."""
    if sys.platform != "linux":
        return 0
    tid = threading.get_native_id()
    if nice > 0:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + nice, 19))
        except OSError as exc:
            log.warning("training runs at the normal priority: %s", exc)
    return os.getpriority(os.PRIO_PROCESS, tid)
