"""Background work run one item at a time on one thread of its own, each key queued at most
once until its item has run. For loads that callers must not wait for (a tenant's search
indices in the server, a tenant's fine-tuned model in the sidecar): a burst of them is not a
burst of loads competing with serving for the cores, and their memory comes from one malloc
arena (glibc gives each thread that allocates its own, and what one frees another does not
reuse)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)


class OneThreadQueue:
    def __init__(self, name: str):
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Hashable, Callable[[], object]] | None] = queue.SimpleQueue()
        self._queued: set[Hashable] = set()  # queued, or running
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stopped = False

    def submit(self, key: Hashable, work: Callable[[], object]) -> bool:
        """Queue `work` unless `key`'s is queued or running already, or the queue has been
        stopped (nothing would run it); False then. The thread starts with the first item."""
        with self._lock:
            if self._stopped or key in self._queued:
                return False
            self._queued.add(key)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        self._queue.put((key, work))
        return True

    def pending(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._queued

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is queued or running; False if something still is after timeout_s."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._queued, timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Let the items queued so far run, then end the thread (at most `timeout_s`); later
        submits are refused."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout_s)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            key, work = item
            try:
                work()
            except Exception:  # the key may be submitted again
                log.exception("%s: background work for %r failed", self.name, key)
            finally:
                with self._idle:
                    self._queued.discard(key)
                    self._idle.notify_all()
