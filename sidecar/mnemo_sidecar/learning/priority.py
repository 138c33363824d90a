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

It is also moved to the idle scheduling class (SCHED_IDLE, `training.idle_class`): a nice
value only shrinks a thread's share, and a serving thread that wakes may still wait for a
niced one to finish its slice; an idle-class thread runs only on a core nobody else wants and
gives it up at once. Measured: settled 100k data, a Train of both models (the fine-tune
~190-200 s either way) started as a minute of the bench's mix at C 8 starts, on a fresh
copy of the data each time, four alternating pairs (stop 52). Nice 10 alone: 143 / 161 / 153 / 178
operations/s, StartSession p99 160 / 127 / 136 / 114 ms, Recall p50 39 / 35 / 37 / 32 ms;
with the idle class: 171 / 162 / 197 / 169 operations/s, StartSession p99 122 / 127 / 102 /
119 ms, Recall p50 34 / 36 / 28 / 34 ms. Noisy, but better on average (StartSession p99
134 -> 118 ms). The same minute without training: 221 operations/s, StartSession p99 90 ms:
what is left is not the scheduler's to give back (the cores' caches and memory bandwidth,
the sidecar's own work). Under load that never lets up an idle-class run barely advances,
and a pair-store write it holds (two short ones per run) may keep a delivery waiting into
SQLite's busy timeout, which the server's outbox retries (the watch that ends an orphaned
run keeps the normal priority: training_process.py).

Only on Linux: elsewhere the call would name a process, not a thread."""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ThreadPriority:
    nice: int
    idle_class: bool  # in the kernel's idle scheduling class (SCHED_IDLE)


def lower_this_thread(nice: int, idle_class: bool = False) -> ThreadPriority:
    """Make the calling thread `nice` steps nicer than it is (0: leave it) and, with
    idle_class, move it to the idle scheduling class; returns where it ends up. A change the
    system refuses is logged, never raised: training at the normal priority is slower for
    the callers, not wrong."""
    if sys.platform != "linux":
        return ThreadPriority(0, False)
    tid = threading.get_native_id()
    if nice > 0:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + nice, 19))
        except OSError as exc:
            log.warning("training runs at the normal priority: %s", exc)
    if idle_class:
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except OSError as exc:
            log.warning("training runs in the normal scheduling class: %s", exc)
    return ThreadPriority(os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid) == os.SCHED_IDLE)
