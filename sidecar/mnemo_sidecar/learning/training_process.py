"""A training run in a process of its own.

Training in a thread of the serving process shared that process's GIL and its garbage
collector with Score: building a run's sessions (objects for every stored candidate) set off
full collections of 40-250 ms, and every Python step of the run delayed the Score handlers'
own. Measured with 5,000 stored sessions (250,000 candidates), Score called by two clients
with StartSession's 120 ms deadline while a ranker trained (~20 s): in a thread, Score's p99
went from 13-25 ms to 122.6 ms and 32-48 calls of ~1,900 ran out of time, in four runs; the
same training in another process left its p99 at 15.4 ms, with no call out of time.

The child opens the same pair store and model directory, runs the Trainer and sends its
progress events back through a queue; a model it promotes is on disk (the registry's
pointer) before the parent loads it and swaps it in. It is spawned, not forked: the parent
runs gRPC's threads, which a fork would copy in whatever state they were in."""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

from mnemo_server.errors import FailedPrecondition, MnemoError
from mnemo_server.launcher import watch_parent
from mnemo_sidecar.config import SidecarConfig
from mnemo_sidecar.learning.model import ModelKind, ProgressEvent, TrainingOutcome
from mnemo_sidecar.learning.priority import ThreadPriority, lower_this_thread

log = logging.getLogger(__name__)
_SPAWN = multiprocessing.get_context("spawn")


@dataclass(frozen=True)
class TrainingJob:
    """What the child needs to build its own engine over the parent's files."""

    cfg: SidecarConfig
    store_path: Path
    registry_root: Path
    tenant: str
    kinds: frozenset[ModelKind]
    force: bool
    scheduled: bool


@dataclass(frozen=True)
class ChildStarted:
    pid: int
    priority: ThreadPriority  # what the child trains at


@dataclass(frozen=True)
class ChildFinished:
    # A refusal the caller should see as it is (e.g. too few sessions): its class name,
    # message and reason; or an unexpected failure's text.
    refused: tuple[str, str, str] | None = None
    failure: str = ""


def new_stop_event() -> EventType:
    return _SPAWN.Event()


def run_in_child(
    job: TrainingJob,
    stop: EventType,
    on_event: Callable[[ProgressEvent], None],
    on_started: Callable[[ChildStarted], None],
    poll_s: float = 0.5,
) -> ChildFinished:
    """Run `job` in a spawned process, passing its events on as they come; returns how it
    ended. A child that dies without a word (killed, out of memory) is a failure, and so is
    one still running after `training.max_run_s`, which is killed."""
    events: Any = _SPAWN.Queue()
    child = _SPAWN.Process(
        target=_child_main, args=(job, events, stop, os.getpid()), name=f"train-{job.tenant}", daemon=True
    )
    limit = job.cfg.training.max_run_s
    child.start()
    started = time.monotonic()
    try:
        while True:
            if limit > 0 and time.monotonic() - started > limit:
                child.kill()
                return ChildFinished(
                    failure=f"the training process ran past training.max_run_s ({limit:g} s) and was killed"
                )
            try:
                message = events.get(timeout=poll_s)
            except queue.Empty:
                if child.is_alive():
                    continue
                try:  # its last words may have come between the wait and the check
                    message = events.get(timeout=poll_s)
                except queue.Empty:
                    return ChildFinished(failure=f"the training process exited with code {child.exitcode}")
            if isinstance(message, ChildFinished):
                return message
            if isinstance(message, ChildStarted):
                on_started(message)
            else:
                on_event(message)
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join()
        events.close()


def refusal_of(finished: ChildFinished) -> MnemoError | None:
    """The child's refusal as the error the caller gets (what an in-process run raised)."""
    if finished.refused is None:
        return None
    name, message, reason = finished.refused
    if name == FailedPrecondition.__name__:
        return FailedPrecondition(message, reason=reason)
    return MnemoError(message, reason=reason)


def _child_main(job: TrainingJob, events: Any, stop: EventType, parent_pid: int) -> None:
    # An orphan (its sidecar killed, out of memory) ends at once, whatever the run is doing:
    # checking only between fine-tuning steps, it went on reading sessions, judging and
    # fitting for minutes, for nobody, on the files a restarted sidecar had opened. Ending
    # anywhere is what a kill -9 does, which the run's files are written to survive (a
    # version is promoted by one atomic rename, the scratch is cleared at the next start).
    # Its thread starts before this one is lowered, so it keeps the normal priority: an
    # idle-class watch could wait for a core as long as serving keeps both busy.
    watch_parent(parent_pid, interval_s=0.5)
    # Before the training stack is imported: numpy's BLAS threads start at its import,
    # torch's and LightGBM's pools at their first parallel section, and all inherit it.
    priority = lower_this_thread(job.cfg.training.nice, job.cfg.training.idle_class)
    # Imported here: the parent needs none of the training stack to start a child.
    from mnemo_sidecar.crossencoder.finetune import FinetuneStopped
    from mnemo_sidecar.engine import RankingEngine
    from mnemo_sidecar.learning.pair_store import PairStore
    from mnemo_sidecar.learning.trainer import Trainer

    events.put(ChildStarted(os.getpid(), priority))
    store = PairStore(job.store_path)
    try:
        engine = RankingEngine.over(job.cfg, store, job.registry_root)

        def progress(model: ModelKind, stage: str, fraction: float, message: str) -> None:
            events.put(ProgressEvent(model, stage, fraction, message))

        def should_stop() -> bool:
            return stop.is_set()

        def concluded(outcome: TrainingOutcome) -> None:
            events.put(ProgressEvent(outcome.model, "outcome", 1.0, outcome.reason, outcome))

        Trainer(engine).train(
            job.tenant,
            set(job.kinds),
            force=job.force,
            progress=progress,
            should_stop=should_stop,
            scheduled=job.scheduled,
            on_outcome=concluded,
        )
        events.put(ChildFinished())
    except MnemoError as exc:
        events.put(ChildFinished(refused=(type(exc).__name__, exc.message, exc.reason)))
    except FinetuneStopped as exc:  # the sidecar is stopping: an ending, not a failure to trace
        log.info("training for %s stopped as the sidecar stops (%s)", job.tenant, exc)
        events.put(ChildFinished(failure=f"stopped as the sidecar stops ({exc})"))
    except BaseException as exc:  # reported to the parent, which stays up
        log.exception("training for %s failed", job.tenant)
        events.put(ChildFinished(failure=f"{type(exc).__name__}: {exc}"))
    finally:
        store.close()
        events.close()
        events.join_thread()  # everything put reaches the parent before the process ends
