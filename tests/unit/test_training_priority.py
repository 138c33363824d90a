"""A training run's thread (and the worker threads it starts) runs nicer than serving."""

from __future__ import annotations

import os
import random
import sys
import threading
from pathlib import Path

import pytest

from mnemo_sidecar.learning.model import ModelKind
from mnemo_sidecar.learning.priority import lower_this_thread
from mnemo_sidecar.learning.runner import TrainingRunner
from mnemo_sidecar.learning.trainer import Trainer
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
    run, started = TrainingRunner(Trainer(engine)).start("t", {ModelKind.RANKER}, force=False)
    assert started and run.done.wait(120)
    assert run.error is None and not run.failure
    assert [e.outcome.promoted for e in run.events if e.outcome] == [True]
    assert run.nice == min(before + 4, 19) and _nice_of_this_thread() == before
