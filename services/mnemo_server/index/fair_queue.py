"""The index worker's queue: tenants take turns.

One worker indexes every tenant's writes. With one first-in-first-out queue, a tenant's bulk
load (20k rows) stood between every other tenant's next write and the index: another
tenant's CreateMemory(wait_for_index) was still pending after 5 s, and its memories stayed
unsearchable for minutes (noisy-neighbour probe; alone it took 0.11 s). Here each tenant has
its own first-in-first-out line, and keys are taken one from each tenant with work in turn,
so a batch of 64 holds another tenant's write however long the bulk load's line is.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque

Key = tuple[str, str]  # (tenant_id, memory_id)


class FairQueue:
    """Keys in per-tenant lines, taken round-robin across tenants. `wake()` makes one waiting
    (or the next) `get` return None, as a sentinel put into a queue.Queue would."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._lines: dict[str, deque[str]] = {}
        self._turns: deque[str] = deque()  # tenants with keys, in the order they take them
        self._wakes = 0

    def put(self, key: Key) -> None:
        tenant_id, memory_id = key
        with self._changed:
            line = self._lines.get(tenant_id)
            if line is None:
                line = self._lines[tenant_id] = deque()
                self._turns.append(tenant_id)
            line.append(memory_id)
            self._changed.notify()

    def wake(self) -> None:
        with self._changed:
            self._wakes += 1
            self._changed.notify_all()

    def get(self, block: bool = True, timeout: float | None = None) -> Key | None:
        """The next tenant's oldest key; None after a wake(); queue.Empty when nothing came
        (at once without `block`, else within `timeout` seconds; None: wait for ever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not self._turns and not self._wakes:
                remaining = None if deadline is None else deadline - time.monotonic()
                if not block or (remaining is not None and remaining <= 0):
                    raise queue.Empty
                self._changed.wait(remaining)
            if self._wakes:
                self._wakes -= 1
                return None
            tenant_id = self._turns.popleft()
            line = self._lines[tenant_id]
            memory_id = line.popleft()
            if line:
                self._turns.append(tenant_id)
            else:
                del self._lines[tenant_id]
            return tenant_id, memory_id
