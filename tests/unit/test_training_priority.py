"""A training run runs in a process of its own, nicer than serving and in the idle
scheduling class (and so do the worker threads it starts); what it promotes is served by
the sidecar's process."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mnemo_server.errors import FailedPrecondition
from mnemo_sidecar.learning.model import ModelKind
from mnemo_sidecar.learning.priority import ThreadPriority, lower_this_thread
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


def _idle_class_of_this_thread() -> bool:
    return os.sched_getscheduler(threading.get_native_id()) == os.SCHED_IDLE


def _where_this_thread_runs() -> ThreadPriority:
    return ThreadPriority(_nice_of_this_thread(), _idle_class_of_this_thread())


def test_a_lowered_thread_and_the_threads_it_starts_are_nicer_the_rest_of_the_process_is_not() -> None:
    before = _where_this_thread_runs()
    seen: dict[str, ThreadPriority] = {}

    def child() -> None:
        seen["child"] = _where_this_thread_runs()

    def training() -> None:
        seen["returned"] = lower_this_thread(3, idle_class=True)
        seen["training"] = _where_this_thread_runs()
        worker = threading.Thread(target=child)  # like a worker pool's thread
        worker.start()
        worker.join()

    t = threading.Thread(target=training)
    t.start()
    t.join()
    lowered = ThreadPriority(before.nice + 3, idle_class=True)
    assert not before.idle_class
    assert seen == {"returned": lowered, "training": lowered, "child": lowered}
    assert _where_this_thread_runs() == before  # this (serving) thread keeps its priority
    assert lower_this_thread(0) == before  # 0 and no idle class leave a thread as it is


@pytest.mark.parametrize("idle_class", [True, False])
def test_the_runner_trains_at_the_configured_priority(tmp_path: Path, idle_class: bool) -> None:
    engine = ranker_engine(tmp_path, n_estimators=20, nice=4, idle_class=idle_class)
    rng = random.Random(3)
    for i in range(30):
        engine.store.add_session("t", synthetic_session(i, rng), None, None, None)
    before = _where_this_thread_runs()
    run, started = TrainingRunner(engine).start("t", {ModelKind.RANKER}, force=False)
    assert started and run.done.wait(120)
    assert run.error is None and not run.failure
    [outcome] = [e.outcome for e in run.events if e.outcome]
    assert outcome.promoted
    assert run.priority == ThreadPriority(min(before.nice + 4, 19), idle_class)
    assert _where_this_thread_runs() == before
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


_SIDECAR_STAND_IN = """
import sys
from pathlib import Path
from mnemo_sidecar.learning.model import ModelKind
from mnemo_sidecar.learning.training_process import TrainingJob, new_stop_event, run_in_child
from tests.unit.test_sidecar_learning import ranker_engine

data = Path(sys.argv[1])
engine = ranker_engine(data, n_estimators=int(sys.argv[2]))
job = TrainingJob(
    engine.cfg, engine.store.path, engine.registry.root, "t", frozenset({ModelKind.RANKER}), True, False
)
run_in_child(job, new_stop_event(), lambda e: None, lambda s: (data / "child.pid").write_text(str(s.pid)))
"""


def test_a_training_process_whose_sidecar_is_killed_ends_at_once(tmp_path: Path) -> None:
    """A sidecar killed mid-run (kill -9, the OOM killer) leaves no training process going
    on for nobody: it ends within a second or two, before it has read its sessions, let
    alone trained and promoted."""
    engine = ranker_engine(tmp_path)
    rng = random.Random(6)
    for i in range(400):
        engine.store.add_session("t", synthetic_session(i, rng, n=50), None, None, None)
    engine.store.close()
    # A sidecar (its own process, killed below) whose run would take minutes to finish.
    sidecar = subprocess.Popen(
        [sys.executable, "-c", _SIDECAR_STAND_IN, str(tmp_path), "100000"],
        cwd=Path(__file__).resolve().parents[2],
    )
    pid_file = tmp_path / "child.pid"
    waited = time.monotonic() + 120
    while not pid_file.exists() and time.monotonic() < waited:
        time.sleep(0.05)
    assert pid_file.exists(), "the training process did not start"
    child = int(pid_file.read_text())
    assert Path(f"/proc/{child}").exists()
    # The run trains in the idle class, and so do the threads its imports started (numpy's
    # BLAS pool); only the thread that watches for its sidecar does not: started before the
    # run lowered itself, it gets a core when it wakes.
    policies = _policies_of_threads(child)
    assert policies[child] == os.SCHED_IDLE and len(policies) > 2
    assert list(policies.values()).count(os.SCHED_OTHER) == 1
    # The one is the watch: the thread sleeping between its checks of the parent.
    watch = _thread_in_sleep(child)
    if watch is not None:  # (None: the kernel does not say where a thread waits)
        assert policies[watch] == os.SCHED_OTHER
    sidecar.kill()
    sidecar.wait()
    killed = time.monotonic()
    while _alive(child) and time.monotonic() - killed < 60:
        time.sleep(0.05)
    assert not _alive(child), "the orphaned training process is still running"
    assert time.monotonic() - killed < 10  # its run would take minutes
    reopened = ranker_engine(tmp_path)
    assert not reopened.store.outcomes("t") and reopened.ranker("t") is None  # nothing trained for nobody


def _policies_of_threads(pid: int) -> dict[int, int]:
    """Each thread's scheduling policy (field 41 of its /proc stat, 38 past the name)."""
    return {
        int(task.name): int((task / "stat").read_text().rsplit(") ", 1)[1].split()[38])
        for task in Path(f"/proc/{pid}/task").iterdir()
    }


def _thread_in_sleep(pid: int, tries: int = 40) -> int | None:
    """The thread of `pid` waiting in a sleep (time.sleep), sampled until one is."""
    for _ in range(tries):
        for task in Path(f"/proc/{pid}/task").iterdir():
            if (task / "wchan").read_text() == "hrtimer_nanosleep":
                return int(task.name)
        time.sleep(0.05)
    return None


def _alive(pid: int) -> bool:
    """Running: not gone and not a zombie (an orphan's zombie is init's to reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
