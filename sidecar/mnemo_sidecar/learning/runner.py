"""Runs training in the background, one run per tenant at a time. A Train call attaches
to the tenant's run (starting one if none) and streams its progress events."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from mnemo_server.errors import MnemoError
from mnemo_sidecar.learning.model import ModelKind, TrainingOutcome
from mnemo_sidecar.learning.priority import lower_this_thread
from mnemo_sidecar.learning.trainer import Trainer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProgressEvent:
    model: ModelKind
    stage: str
    progress: float
    message: str
    outcome: TrainingOutcome | None = None


@dataclass
class TrainingRun:
    tenant: str
    events: list[ProgressEvent] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: MnemoError | None = None
    failure: str = ""
    nice: int = 0  # the nice value the run's thread trained at
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def emit(self, event: ProgressEvent) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self.done.set()
            self._cond.notify_all()

    def follow(self, poll_s: float = 0.5) -> Iterator[ProgressEvent]:
        """Every event from the start of the run until it finishes."""
        sent = 0
        while True:
            with self._cond:
                while sent >= len(self.events) and not self.done.is_set():
                    self._cond.wait(poll_s)
                batch = self.events[sent:]
                finished = self.done.is_set()
            yield from batch
            sent += len(batch)
            if finished and sent >= len(self.events):
                return


class TrainingRunner:
    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self._runs: dict[str, TrainingRun] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

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
                return run, False
            run = TrainingRun(tenant)
            self._runs[tenant] = run
        threading.Thread(
            target=self._execute, args=(run, kinds, force, scheduled), name=f"train-{tenant}", daemon=True
        ).start()
        return run, True

    def start_background(self, tenant: str) -> bool:
        return self.start(tenant, {ModelKind.CROSS_ENCODER, ModelKind.RANKER}, force=False, scheduled=True)[1]

    def _execute(self, run: TrainingRun, kinds: set[ModelKind], force: bool, scheduled: bool) -> None:
        def progress(model: ModelKind, stage: str, fraction: float, message: str) -> None:
            run.emit(ProgressEvent(model, stage, fraction, message))

        run.nice = lower_this_thread(self.trainer.cfg.training.nice)
        try:
            for outcome in self.trainer.train(
                run.tenant,
                kinds,
                force=force,
                progress=progress,
                should_stop=self._stop.is_set,
                scheduled=scheduled,
            ):
                run.emit(ProgressEvent(outcome.model, "outcome", 1.0, outcome.reason, outcome))
        except MnemoError as exc:
            run.error = exc
        except Exception as exc:  # a failed run must not take the sidecar down; it is reported
            log.exception("training for %s failed", run.tenant)
            run.failure = f"{type(exc).__name__}: {exc}"
        finally:
            run.finish()

    def stop(self) -> None:
        self._stop.set()
