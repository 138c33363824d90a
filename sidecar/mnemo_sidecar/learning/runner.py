"""Runs training in the background, one run per tenant at a time, each in a process of its
own (training_process.py). A Train call attaches to the tenant's run (starting one if none)
and streams its progress events."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from mnemo_server.errors import Aborted, MnemoError
from mnemo_sidecar.engine import RankingEngine
from mnemo_sidecar.learning.model import ModelKind, ProgressEvent
from mnemo_sidecar.learning.priority import ThreadPriority
from mnemo_sidecar.learning.training_process import (
    ChildStarted,
    TrainingJob,
    new_stop_event,
    refusal_of,
    run_in_child,
)

log = logging.getLogger(__name__)


@dataclass
class TrainingRun:
    tenant: str
    events: list[ProgressEvent] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: MnemoError | None = None
    failure: str = ""
    pid: int = 0  # the process the run trained in
    # What it trained at.
    priority: ThreadPriority = field(default_factory=lambda: ThreadPriority(0, idle_class=False))
    # What it was asked: the models, below the minimum of sessions or not, on schedule.
    kinds: frozenset[ModelKind] = frozenset()
    force: bool = False
    scheduled: bool = False
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def emit(self, event: ProgressEvent) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self.done.set()
            self._cond.notify_all()

    def follow(
        self, poll_s: float = 0.5, alive: Callable[[], bool] = lambda: True
    ) -> Iterator[ProgressEvent]:
        """Every event from the start of the run until it finishes, or until `alive` (asked
        every poll_s while no event comes) says the follower has gone: a Train stream whose
        caller left would otherwise hold its worker until the run's next event."""
        sent = 0
        while True:
            with self._cond:
                while sent >= len(self.events) and not self.done.is_set():
                    if not alive():
                        return
                    self._cond.wait(poll_s)
                batch = self.events[sent:]
                finished = self.done.is_set()
            yield from batch
            sent += len(batch)
            if finished and sent >= len(self.events):
                return


class TrainingRunner:
    def __init__(self, engine: RankingEngine):
        # The engine's files and config go to each run's process; its registry serves what
        # a run promotes.
        self.engine = engine
        self._runs: dict[str, TrainingRun] = {}
        self._lock = threading.Lock()
        self._stop = new_stop_event()  # seen by the training processes

    def running(self, tenant: str) -> bool:
        with self._lock:
            run = self._runs.get(tenant)
            return run is not None and not run.done.is_set()

    def start(
        self, tenant: str, kinds: set[ModelKind], force: bool, scheduled: bool = False
    ) -> tuple[TrainingRun, bool]:
        """(the tenant's run, whether this call started it). `scheduled`: see Trainer.train."""
        with self._lock:
            run = self._runs.get(tenant)
            if run is not None and not run.done.is_set():
                # A call joins the run in progress only if that run does what it asks; else it
                # would stream another request's outcome as its own (probe: a Train of the
                # cross-encoder answered OK with the ranker's run; a forced one failed as the
                # unforced run below the minimum did). A background start just lets it be.
                if scheduled or (kinds <= run.kinds and (run.force or not force) and not run.scheduled):
                    return run, False
                raise Aborted(
                    f"tenant {tenant!r} is already training ({', '.join(sorted(k.name for k in run.kinds))}"
                    f"{', forced' if run.force else ''}{', on schedule' if run.scheduled else ''}), "
                    "which is not what this call asks; call again once it ends",
                    reason="TRAINING_IN_PROGRESS",
                )
            run = TrainingRun(tenant, kinds=frozenset(kinds), force=force, scheduled=scheduled)
            self._runs[tenant] = run
        threading.Thread(
            target=self._execute, args=(run, kinds, force, scheduled), name=f"train-{tenant}", daemon=True
        ).start()
        return run, True

    def start_background(self, tenant: str) -> bool:
        return self.start(tenant, {ModelKind.CROSS_ENCODER, ModelKind.RANKER}, force=False, scheduled=True)[1]

    def _execute(self, run: TrainingRun, kinds: set[ModelKind], force: bool, scheduled: bool) -> None:
        engine = self.engine
        job = TrainingJob(
            engine.cfg,
            engine.store.path,
            engine.registry.root,
            run.tenant,
            frozenset(kinds),
            force,
            scheduled,
        )

        def on_event(event: ProgressEvent) -> None:
            if event.outcome is not None and event.outcome.promoted:
                # Promoted on disk by the child: served from here on, before anyone hears of it.
                engine.reload(run.tenant, event.outcome.model)
            run.emit(event)

        def on_started(started: ChildStarted) -> None:
            run.pid, run.priority = started.pid, started.priority

        try:
            finished = run_in_child(job, self._stop, on_event, on_started)
            run.error = refusal_of(finished)
            run.failure = finished.failure
        except Exception as exc:  # a failed run must not take the sidecar down; it is reported
            log.exception("training for %s failed", run.tenant)
            run.failure = f"{type(exc).__name__}: {exc}"
        finally:
            run.finish()

    def stop(self) -> None:
        self._stop.set()
