"""A training run runs in a process of its own, nicer than serving (and so do the worker
threads it starts); what it promotes is served by the sidecar's process."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sys
import threading
from pathlib import Path

import pytest

from mnemo_server.errors import FailedPrecondition
from mnemo_sidecar.learning.model import ModelKind
from mnemo_sidecar.learning.priority import lower_this_thread
from mnemo_sidecar.learning.runner import TrainingRunner
from mnemo_sidecar.learning.training_process import (
    ChildStarted,
    TrainingJob,
    new_stop_event,
    refusal_of,
    run_in_child,
)
from tests.unit.test_sidecar_learning import ranker_engine, synthetic_session

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")


def _nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_a_lowered_thread_and_the_threads_it_starts_are_nicer_the_rest_of_the_process_is_not() -> None:
    before = _nice_of_this_thread()
    seen: dict[str, int] = {}

    def child() -> None:
        seen["child"] = _nice_of_this_thread()

    def training() -> None:
        seen["returned"] = lower_this_thread(3)
        seen["training"] = _nice_of_this_thread()
        worker = threading.Thread(target=child)  # like a worker pool's thread
        worker.start()
        worker.join()

    t = threading.Thread(target=training)
    t.start()
    t.join()
    assert seen == {"returned": before + 3, "training": before + 3, "child": before + 3}
    assert _nice_of_this_thread() == before  # this (serving) thread keeps its priority
    assert lower_this_thread(0) == before  # 0 leaves a thread as it is


def test_the_runner_trains_at_the_configured_nice(tmp_path: Path) -> None:
    engine = ranker_engine(tmp_path, n_estimators=20, nice=4)
    rng = random.Random(3)
    for i in range(30):
        engine.store.add_session("t", synthetic_session(i, rng), None, None, None)
    before = _nice_of_this_thread()
    run, started = TrainingRunner(engine).start("t", {ModelKind.RANKER}, force=False)
    assert started and run.done.wait(120)
    assert run.error is None and not run.failure
    [outcome] = [e.outcome for e in run.events if e.outcome]
    assert outcome.promoted
    assert run.nice == min(before + 4, 19) and _nice_of_this_thread() == before
    # Trained elsewhere, served here: the child's promotion was swapped into this process.
    assert run.pid not in (0, os.getpid()) and not Path(f"/proc/{run.pid}").exists()
    served = engine.ranker("t")
    assert served is not None and served.version == outcome.candidate_version


def test_a_refused_run_and_a_killed_training_process_are_reported(tmp_path: Path) -> None:
    engine = ranker_engine(tmp_path, n_estimators=20)
    runner = TrainingRunner(engine)
    rng = random.Random(4)
    for i in range(5):
        engine.store.add_session("t", synthetic_session(i, rng), None, None, None)
    run, _ = runner.start("t", {ModelKind.RANKER}, force=False)  # 5 sessions, 20 needed
    assert run.done.wait(120) and isinstance(run.error, FailedPrecondition)
    assert run.error.reason == "NOT_ENOUGH_SESSIONS" and "training needs 20" in run.error.message
    # The training process dies without a word (the OOM killer, an operator's kill -9).
    killed: list[int] = []

    def kill_at_start(started: ChildStarted) -> None:
        os.kill(started.pid, signal.SIGKILL)
        killed.append(started.pid)

    job = TrainingJob(
        engine.cfg, engine.store.path, engine.registry.root, "t", frozenset({ModelKind.RANKER}), True, False
    )
    finished = run_in_child(job, new_stop_event(), lambda e: None, kill_at_start)
    assert killed and finished.failure == "the training process exited with code -9"
    assert refusal_of(finished) is None and engine.ranker("t") is None


def test_a_training_process_past_its_time_limit_is_killed_and_reported(tmp_path: Path) -> None:
    """A hung run would hold the tenant's training until the sidecar restarted."""
    engine = ranker_engine(tmp_path, n_estimators=20, max_run_s=0.5)  # start-up alone takes longer
    rng = random.Random(5)
    for i in range(30):
        engine.store.add_session("t", synthetic_session(i, rng), None, None, None)
    run, _ = TrainingRunner(engine).start("t", {ModelKind.RANKER}, force=False)
    assert run.done.wait(60)
    assert run.failure == "the training process ran past training.max_run_s (0.5 s) and was killed"
    assert not multiprocessing.active_children()
    assert engine.ranker("t") is None and not engine.store.outcomes("t")
