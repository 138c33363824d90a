"""Admission for compute-bound calls.

Recall and StartSession are mostly CPU (embedding, LanceDB searches, DuckDB reads). On a
machine with few cores, running every one of them at once only adds context switches and
lock hand-offs: on 2 cores with 8 concurrent clients (100k memories) the server did 82
instead of 75 operations/s with 4 of them at a time, and Recall's p99 fell 410 -> 256 ms.
Calls beyond the slots wait their turn, within their own deadline; calls that mostly wait
on something else (writes, index waits, streams) are not gated.

Within a tenant the queue is ordered by priority, then arrival. StartSession goes first: an agent cannot
begin its session until it answers, and its latency is held to a deadline, while a Recall
waiting a few more milliseconds costs only that. Same settled 100k data, one minute of the
bench's mix at C 8 without a sidecar, two runs each (StartSession p50/p99, CreateMemory
p99, Recall p50, all operations/s):
  4 slots, first come first served:  232/496 ms, 151 ms, 125 ms, 69/s (one run)
  4 slots, StartSession first:       189-209/407-438 ms, 132-150 ms, 122-138 ms, 67-75/s
  2 slots, StartSession first:       120/236 ms, 62-63 ms, 178-181 ms, 65/s
  1 slot:                            83/186 ms, 30 ms, 250 ms, 52/s (one run)
On a server that has just loaded 100k memories (the full `mnemo bench`, sidecar running,
one run each) 2 slots cost more: 34 instead of 42 operations/s, for StartSession 203/508
instead of 277/610 ms. So 4 slots stay the default, and 2 (`server.compute_slots`) is the
setting for a deployment that values session and write latency over throughput.

One of the 4 is reserved for StartSession (`server.compute_reserved_slots`): Recalls take
at most 3, so a StartSession rarely queues at all. Settled 100k data, alternating runs in
a slower hour (so lower throughput than above): StartSession p50/p99 213/486 and 199/434
ms with the reserved slot against 269/602 and 283/600 without, 51 and 55 against 53 and 51
operations/s, CreateMemory p99 200 and 152 against 272 and 231 ms; Recall p50 201 and 189
against 172 and 181 ms.

Two of the 4 are StartSession's since calls got cheaper (~8 ms of server CPU per operation
in the mix, against ~24 when the figures above were taken): Recalls take at most 2. Settled
100k data, one minute of the mix, alternating runs (StartSession p50/p99, CreateMemory p99,
Recall p50/p99, all operations/s):
  1 reserved:  57/123 and 63/147 ms, 131 and 147 ms, 40/102 and 44/116 ms, 178 and 161/s
  2 reserved:  45/100 and 46/99 ms,  116 and 102 ms, 48/116 and 48/125 ms, 179 and 176/s
In the full bench (fresh 100k load, the sidecar serving a model), StartSession's p99 in the
sidecar ok / stopped / killed minutes was 150-160 / 143-170 / 129-174 ms over three runs
with 1 reserved (1 of the 9 minutes within its 120 ms deadline + 10), and 118-153 /
120-138 / 115-126 ms over four with 2 (9 of 12 within it; three of those runs also had the
breaker's background probe, ranking/breaker.py). Recall's p50 pays ~8 ms of it; total
throughput does not change.

Tenants take turns. Admitted by arrival alone, one tenant's flood of slow
Recalls (1.4 s each over a large unindexed backlog) queued ahead of another tenant's ~40 ms
Recall, which took p50 1.24 s, p99 2.4 s (noisy-neighbour probe). A waiter is now admitted
by how few slots its tenant holds, then by how long ago its tenant was
last admitted, then priority, then arrival: another tenant's call waits for the next slot to free, not for
the flood's queue to drain, and with one slot tenants alternate. No slot is kept idle for
fairness: a tenant alone may take them all. Measured with A's 16 threads of Recall at ~2k
rows (two runs each, alternating with the old code, loaded machine): B's Recall p50 41-49 ms,
p99 114-167 ms, against 119-159 / 297-378 ms by arrival (4 ms alone).

Tenant comes before priority since a probe flooded StartSessions from one tenant (16
threads): by priority first, 5 of another tenant's 6 Recalls waited past a 3 s deadline; now
p50 34 ms, max 46 ms. A Recall still needs more than the reserved slots free, unless its
tenant holds none: then any free slot is its, or the other tenant's StartSessions, holding
the rest, kept it out for good. (Letting Recalls hold up to slots - reserved whoever holds
the rest was tried, in 59d5896: more calls ran at once on 2 cores. In the bench at 20k
memories, 30 s a phase, alternating runs, StartSession's p99 with the sidecar running was
147 and 117 ms against 124 and 106 ms with this rule, and 184 and 138 against 149 and 122
while it trained; Recall's p99 fell, 91 and 76 against 128 and 115 ms. StartSession's
deadline is the harder promise, so this rule stays.)

Waiters are bounded (server.compute_max_waiters 16, compute_waiters_per_tenant 8): each holds
one of the server's gRPC workers, so one tenant's 64 Recalls in flight held all 32 and
another tenant's GetMemory (not even gated) missed 2 s deadlines, 7 of 10. Past the bound a
call is RESOURCE_EXHAUSTED at once (COMPUTE_QUEUE_FULL, which the clients retry with backoff):
the other tenant's GetMemory then took p50 27 ms, max 80 ms, and its Recall p50 62 ms, max
168 ms (`/work/exp59/fair/repro_gate_workers.py`).

The StartSession latencies above were read by a bench whose StartSession timing included
the EndSession of every third session (corrected in 11f167f): their levels are too high,
the comparisons between settings were made with the same error on both sides."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from mnemo_server.errors import DeadlineExceeded, FailedPrecondition, ResourceExhausted

# Lower goes first. Methods not listed are not gated.
COMPUTE_PRIORITY: dict[str, int] = {
    "/mnemo.v1.MemoryService/StartSession": 0,
    "/mnemo.v1.MemoryService/Recall": 1,
}


@dataclass
class _Waiter:
    priority: int
    tenant: str
    arrival: int
    granted: threading.Event = field(default_factory=threading.Event)


class ComputeGate:
    def __init__(
        self,
        slots: int,
        reserved: int = 0,
        max_waiters: int | None = None,
        waiters_per_tenant: int | None = None,
    ):
        """slots <= 0: no limit. `reserved` of the slots only admit the first priority (0):
        another call needs more than that many free (or its tenant to hold none), so a
        StartSession finds one free however many Recalls run (with one slot, nothing is
        reserved). At most
        `max_waiters` calls wait, `waiters_per_tenant` of them one tenant's (None: no bound);
        past either a call is RESOURCE_EXHAUSTED at once, since each waiter holds a gRPC
        worker that another tenant's call would need."""
        if reserved < 0:
            raise FailedPrecondition(
                f"server.compute_reserved_slots must be 0 or more, not {reserved}", reason="BAD_CONFIG"
            )
        self.slots = slots
        self.reserved = min(reserved, max(slots - 1, 0))
        self.max_waiters = max_waiters
        self.waiters_per_tenant = waiters_per_tenant
        self._lock = threading.Lock()
        self._free = slots
        self._held: Counter[str] = Counter()  # slots held, by tenant
        self._waiting: Counter[str] = Counter()  # waiters, by tenant
        # When each tenant with a held slot or a waiter was last admitted (a grant number).
        self._last_grant: dict[str, int] = {}
        self._grants = itertools.count()
        # Invariant: no waiter is queued while a slot it may take is free, because each
        # release admits the best waiters it can. A waiter that gives up leaves the queue; it
        # holds a few dozen calls at most (bounded above), so a scan is cheap.
        self._queue: list[_Waiter] = []
        self._arrivals = itertools.count()

    def _admits(self, priority: int, tenant: str) -> bool:
        if self._free <= 0:
            return False
        if priority == 0 or self._free > self.reserved:
            return True
        # A tenant holding no slot may take any free one: another tenant's StartSessions,
        # holding the rest, kept its Recalls out for good (fairness probe).
        return not self._held[tenant]

    @property
    def free(self) -> int:
        with self._lock:
            return self._free

    @contextmanager
    def slot(self, timeout_s: float | None, priority: int = 0, tenant: str = "") -> Iterator[None]:
        """Hold one slot for the body; timeout_s is what is left of the caller's deadline."""
        if self.slots <= 0:
            yield
            return
        if not self._acquire(timeout_s, priority, tenant):
            raise DeadlineExceeded(
                "the deadline passed while the call waited for a free compute slot",
                reason="QUEUED_PAST_DEADLINE",
            )
        try:
            yield
        finally:
            self._release(tenant)

    def _acquire(self, timeout_s: float | None, priority: int, tenant: str) -> bool:
        with self._lock:
            if self._admits(priority, tenant):
                self._take(tenant)
                return True
            self._refuse_if_queue_full(tenant)
            waiter = _Waiter(priority, tenant, next(self._arrivals))
            self._queue.append(waiter)
            self._waiting[tenant] += 1
        # A call without a deadline reports ~1.8e19 s remaining, past what an Event waits.
        timeout = None if timeout_s is None else min(max(timeout_s, 0.0), threading.TIMEOUT_MAX)
        if waiter.granted.wait(timeout):
            return True
        with self._lock:
            # The slot may have been handed over between the timeout and this lock.
            if waiter.granted.is_set():
                return True
            self._dequeue(waiter)
            self._forget_if_idle(tenant)
            return False

    def _refuse_if_queue_full(self, tenant: str) -> None:
        mine, everyone = self._waiting[tenant], len(self._queue)
        per_tenant, total = self.waiters_per_tenant, self.max_waiters
        if (per_tenant is None or mine < per_tenant) and (total is None or everyone < total):
            return
        raise ResourceExhausted(
            f"{mine} of your Recall and StartSession calls and {everyone} in all already wait "
            f"for a compute slot (server.compute_waiters_per_tenant {per_tenant}, "
            f"server.compute_max_waiters {total}); retry shortly or send fewer at once",
            reason="COMPUTE_QUEUE_FULL",
        )

    def _take(self, tenant: str) -> None:
        self._free -= 1
        self._held[tenant] += 1
        self._last_grant[tenant] = next(self._grants)

    def _dequeue(self, w: _Waiter) -> None:
        self._queue.remove(w)
        self._waiting[w.tenant] -= 1
        if not self._waiting[w.tenant]:
            del self._waiting[w.tenant]

    def _turn(self, w: _Waiter) -> tuple[int, int, int, int]:
        """Tenants first (the fewest slots held, then the longest since admitted), then
        priority: ranked by priority first, one tenant's flood of StartSessions kept every
        slot from another tenant's Recalls (5 of 6 past a 3 s deadline, fairness probe).
        Within a tenant, StartSession still goes first."""
        return (self._held[w.tenant], self._last_grant.get(w.tenant, -1), w.priority, w.arrival)

    def _forget_if_idle(self, tenant: str) -> None:
        """Drop a tenant's last grant once it holds no slot and has no waiter, so the map
        holds only tenants in the gate."""
        if not self._held[tenant] and not self._waiting[tenant]:
            self._last_grant.pop(tenant, None)

    def _release(self, tenant: str) -> None:
        with self._lock:
            self._free += 1
            self._held[tenant] -= 1
            if not self._held[tenant]:
                del self._held[tenant]
            self._forget_if_idle(tenant)
            while True:
                admissible = [w for w in self._queue if self._admits(w.priority, w.tenant)]
                if not admissible:
                    break
                best = min(admissible, key=self._turn)
                self._dequeue(best)
                self._take(best.tenant)
                best.granted.set()
