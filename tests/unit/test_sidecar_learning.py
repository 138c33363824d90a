"""The sidecar's learning loop without gRPC: pair store, health, registry, ranker, trainer."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mnemo_server.errors import Cancelled, DeadlineExceeded, FailedPrecondition, ResourceExhausted
from mnemo_sidecar.config import HealthConfig, RankerConfig, SidecarConfig
from mnemo_sidecar.deadlines import AdmissionGate, Deadline
from mnemo_sidecar.engine import RankingEngine
from mnemo_sidecar.learning.health import HealthTracker, decided_win_rate, win_of
from mnemo_sidecar.learning.model import (
    Candidate,
    FeedbackCandidate,
    FeedbackSession,
    ModelKind,
    TrainingOutcome,
)
from mnemo_sidecar.learning.ndcg import ndcg_at
from mnemo_sidecar.learning.pair_store import PairStore, split_heldout
from mnemo_sidecar.learning.registry import ModelRegistry, Residency
from mnemo_sidecar.learning.trainer import Trainer, baseline_ndcg, ranker_ndcg
from mnemo_sidecar.ranker.model import CE_FEATURE, feature_row, session_matrix, train_ranker
from mnemo_sidecar.ranker.text_features import TEXT_FEATURES

NAMES = ("baseline_score", "signal", "noise")


def synthetic_session(i: int, rng: random.Random, n: int = 20, informative: bool = True) -> FeedbackSession:
    """One relevant candidate; `signal` points at it (when informative), the baseline mostly does not."""
    relevant = rng.randrange(n)
    cands = []
    for j in range(n):
        base = rng.random()
        signal = (1.0 if j == relevant else 0.0) + 0.3 * rng.random() if informative else rng.random()
        # Features travel as float32 on the wire and in the store.
        features = tuple(float(np.float32(x)) for x in (base, signal, rng.random()))
        cands.append(
            FeedbackCandidate(
                Candidate(f"m{i}-{j}", f"text {j}", base, features), 1.0 if j == relevant else 0.0, 0
            )
        )
    ranked = sorted(cands, key=lambda c: -c.candidate.baseline_score)
    with_ranks = tuple(FeedbackCandidate(c.candidate, c.relevance, ranked.index(c) + 1) for c in cands)
    return FeedbackSession(f"s{i}", f"query {i}", NAMES, with_ranks, end_time_ns=i)


def test_ndcg_graded_and_undefined() -> None:
    assert ndcg_at(["a", "b"], {"a": 1.0, "b": 0.0}) == 1.0
    assert ndcg_at(["b", "a"], {"a": 1.0, "b": 0.0}) == pytest.approx(1 / np.log2(3))
    assert ndcg_at(["a"], {"a": -1.0}) is None  # nothing relevant: no verdict on the order


def test_pair_store_is_idempotent_and_durable(tmp_path: Path) -> None:
    rng = random.Random(0)
    store = PairStore(tmp_path / "p.sqlite")
    s = synthetic_session(1, rng)
    assert store.add_session("t", s, 0.5, None, None)
    assert not store.add_session("t", s, 0.5, None, None)  # the same session again: nothing written
    assert store.counts("t") == (1, 20)
    assert store.counts("other") == (0, 0)
    store.close()
    reopened = PairStore(tmp_path / "p.sqlite")  # a restart loses nothing
    assert reopened.sessions("t") == [s]


def test_pair_store_records_its_format_and_refuses_a_newer_ones_file(tmp_path: Path) -> None:
    """An older sidecar read whatever a newer one wrote (upgrade probe); files of this and
    earlier formats (none recorded: 0) open, a newer one is refused and left as it was."""
    import sqlite3

    from mnemo_sidecar.learning.pair_store import FORMAT

    path = tmp_path / "p.sqlite"
    PairStore(path).close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchall() == [(FORMAT,)]
        raw.execute(f"PRAGMA user_version = {FORMAT + 1}")
    with pytest.raises(
        FailedPrecondition, match=f"is format {FORMAT + 1}, newer than this sidecar's {FORMAT}"
    ):
        PairStore(path)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchall() == [(FORMAT + 1,)]
        raw.execute("PRAGMA user_version = 0")  # as every file before formats were recorded
    PairStore(path).close()


def test_a_pair_store_that_is_no_database_is_one_clear_error(tmp_path: Path) -> None:
    """`serve` stopped with sqlite's traceback (sidecar probe); the file is left as it was."""
    path = tmp_path / "p.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(FailedPrecondition, match="cannot be opened as the sidecar's pair store") as err:
        PairStore(path)
    assert err.value.reason == "BAD_DATA_DIR"
    assert path.read_bytes() == b"this is not a database" * 100


def test_pair_store_keeps_a_tenants_newest_sessions_up_to_its_cap(tmp_path: Path) -> None:
    rng = random.Random(2)
    store = PairStore(tmp_path / "p.sqlite", max_sessions=5)
    sessions = [synthetic_session(i, rng) for i in range(8)]
    for s in sessions:
        assert store.add_session("t", s, 0.5, None, None)
    other = synthetic_session(99, rng)
    store.add_session("other", other, 0.5, None, None)
    assert store.counts("t") == (5, 5 * 20)  # the pairs of the evicted sessions went with them
    assert store.sessions("t") == sessions[3:]  # the newest five, oldest first
    assert store.sessions("other") == [other]  # another tenant's are its own
    assert store.add_session("t", sessions[0], 0.5, None, None)  # evicted, so stored anew
    assert [x.session_id for x in store.sessions("t")] == [x.session_id for x in [*sessions[4:], sessions[0]]]
    store.close()
    reopened = PairStore(tmp_path / "p.sqlite", max_sessions=5)
    assert reopened.counts("t") == (5, 100)


def test_pair_store_counts_a_tenant_once_then_keeps_its_counts(tmp_path: Path) -> None:
    """Counting a tenant's pairs at the cap took ~87 ms, on every Score: the counts are
    kept by the store's one writer instead, and agree with a fresh count at every step
    (new sessions, a session sent again, evictions past the cap, another tenant's)."""
    rng = random.Random(5)
    store = PairStore(tmp_path / "p.sqlite", max_sessions=4)
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    sessions = [synthetic_session(i, rng, n=3 + i) for i in range(7)]  # pairs differ per session
    assert store.counts("t") == (0, 0)
    for s in [*sessions, sessions[5], synthetic_session(50, rng)]:
        store.add_session("t", s, 0.5, None, None)
        store.add_session("other", s, 0.5, None, None)
        fresh = PairStore(tmp_path / "p.sqlite", max_sessions=4)
        assert store.counts("t") == fresh.counts("t") and store.counts("other") == fresh.counts("other")
        fresh.close()
    assert store.counts("t")[0] == 4
    counted = [q for q in statements if "count(*)" in q]
    assert len(counted) == 2 * 2  # each tenant's two counts, once


def test_health_ema_floor_and_drift(tmp_path: Path) -> None:
    cfg = HealthConfig(
        alpha=0.1,
        early_sessions=5,
        early_min_baseline_weight=0.5,
        drift_window=4,
        drift_threshold=0.3,
        drift_predictor_weight=0.1,
    )
    store = PairStore(tmp_path / "p.sqlite")
    health = HealthTracker(store, cfg)
    rng = random.Random(0)
    assert health.snapshot("t", has_model=False).predictor_weight == 0.0  # cold start
    health.on_promotion("t")
    for i in range(8):  # the predictor wins every session
        store.add_session("t", synthetic_session(i, rng), 0.3, 0.9, 1.0)
        health.record("t", 1.0)
        snap = health.snapshot("t", has_model=True)
        if i < 4:
            assert snap.predictor_weight <= 0.5  # the baseline keeps its floor early on
    assert snap.win_ema == pytest.approx(1 - 0.5 * 0.9**8)
    assert snap.predictor_weight == pytest.approx(snap.win_ema, abs=1e-4) and not snap.drift
    for i in range(8, 12):  # then loses four in a row
        store.add_session("t", synthetic_session(i, rng), 0.9, 0.3, 0.0)
        health.record("t", 0.0)
    snap = health.snapshot("t", has_model=True)
    assert snap.drift and snap.window_win_rate == 0.0 and snap.predictor_weight == pytest.approx(0.1)
    # A model promoted over the drifting one is judged on its own sessions: it started out
    # flagged, capped at 0.1, until its wins pushed its predecessor's losses out of the window.
    health.on_promotion("t", 0.8)
    snap = health.snapshot("t", has_model=True)
    assert not snap.drift and snap.window_win_rate == 0.5 and snap.predictor_weight == pytest.approx(0.5)
    for i in range(12, 15):
        store.add_session("t", synthetic_session(i, rng), 0.9, 0.3, 0.0)
        health.record("t", 0.0)
        assert not health.snapshot("t", has_model=True).drift  # fewer than a window of its own
    store.add_session("t", synthetic_session(15, rng), 0.9, 0.3, 0.0)
    health.record("t", 0.0)
    assert health.snapshot("t", has_model=True).drift  # a window of its own losses


def test_ties_are_no_evidence_for_the_health_weight(tmp_path: Path) -> None:
    assert win_of(0.8, 0.5) == 1.0 and win_of(0.5, 0.8) == 0.0 and win_of(0.7, 0.7) is None
    # One win and one loss of prior: nothing decided is 0.5, three wins of three 0.8.
    assert decided_win_rate([None, None]) == 0.5
    assert decided_win_rate([1.0, None, 1.0, 1.0, None]) == pytest.approx(0.8)
    store = PairStore(tmp_path / "p.sqlite")
    health = HealthTracker(store, HealthConfig(early_sessions=0))
    health.on_promotion("t", 0.8)
    rng = random.Random(0)
    for i in range(30):  # thirty sessions where the two orders score the same
        store.add_session("t", synthetic_session(i, rng), 0.6, 0.6, win_of(0.6, 0.6))
        health.record("t", win_of(0.6, 0.6))
    snap = health.snapshot("t", has_model=True)
    assert snap.win_ema == pytest.approx(0.8) and snap.predictor_weight == pytest.approx(0.8)
    assert not snap.drift and snap.window_win_rate == 0.5  # no decided session in the window yet


def test_registry_promotes_atomically_and_reloads(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    assert reg.current("t", ModelKind.RANKER, lambda d: d.name) is None
    v1, d1 = reg.new_version("t", ModelKind.RANKER)
    reg.promote("t", ModelKind.RANKER, v1, "model-1", "test")
    assert reg.current("t", ModelKind.RANKER, lambda d: "loaded").model == "model-1"
    fresh = ModelRegistry(tmp_path)  # after a restart the pointer is read and the model loaded
    assert fresh.current("t", ModelKind.RANKER, lambda d: f"loaded {d.name}").model == f"loaded {v1}"
    v2, d2 = reg.new_version("t", ModelKind.RANKER)
    reg.discard("t", ModelKind.RANKER, v2)
    assert not d2.exists() and d1.exists()


def test_candidates_left_by_stopped_runs_are_removed_at_start_and_never_count_as_kept_versions(
    tmp_path: Path,
) -> None:
    """A run ended by a stop or kill -9 left its candidate for good (a fine-tune's is ~90 MB),
    and pruning kept the newest four directories by name, such leftovers among them."""
    from mnemo_sidecar.learning.registry import KEEP_VERSIONS

    reg = ModelRegistry(tmp_path)
    promoted = []
    for i in range(KEEP_VERSIONS + 1):
        _, left = reg.new_version("t", ModelKind.RANKER)  # a run that died before settling
        (left / "model.onnx").write_bytes(b"half")
        version, _ = reg.new_version("t", ModelKind.RANKER)
        reg.promote("t", ModelKind.RANKER, version, f"model-{i}", "test")
        promoted.append(version)
    _, other = reg.new_version("u", ModelKind.CROSS_ENCODER)
    kind_dir = tmp_path / "t" / ModelKind.RANKER.value
    on_disk = sorted(p.name for p in kind_dir.iterdir() if p.is_dir())
    assert set(promoted[-KEEP_VERSIONS:]) <= set(on_disk)  # leftovers pushed out no promoted version
    assert ModelRegistry(tmp_path).remove_abandoned() == KEEP_VERSIONS + 2
    assert {p.name for p in kind_dir.iterdir() if p.is_dir()} == set(promoted[-KEEP_VERSIONS:])
    assert not other.exists()
    fresh = ModelRegistry(tmp_path)
    assert fresh.current("t", ModelKind.RANKER, lambda d: d.name).model == promoted[-1]  # type: ignore[union-attr]
    assert fresh.remove_abandoned() == 0


def test_registry_loads_a_model_once_however_many_ask_at_once(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    v1, _ = reg.new_version("t", ModelKind.RANKER)
    reg.promote("t", ModelKind.RANKER, v1, "model-1", "test")
    fresh = ModelRegistry(tmp_path)
    loads: list[str] = []

    def slow_loader(d: Path) -> str:
        loads.append(d.name)
        time.sleep(0.2)  # long enough for every caller to arrive during the load
        return f"loaded {d.name}"

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: fresh.current("t", ModelKind.RANKER, slow_loader), range(8)))
    assert loads == [v1]
    assert {id(p) for p in got} == {id(got[0])} and got[0] is not None and got[0].model == f"loaded {v1}"


def test_registry_serves_a_model_that_does_not_load_as_none_until_a_promotion(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    v1, _ = reg.new_version("t", ModelKind.RANKER)
    reg.promote("t", ModelKind.RANKER, v1, "model-1", "test")
    fresh = ModelRegistry(tmp_path)
    attempts = 0

    def damaged(d: Path) -> str:
        nonlocal attempts
        attempts += 1
        raise ValueError(f"{d.name}/model.onnx is truncated")

    for _ in range(3):
        assert fresh.current("t", ModelKind.RANKER, damaged) is None
    assert attempts == 1  # remembered, not tried on every call
    assert fresh.broken("t", ModelKind.RANKER) == f"ValueError: {v1}/model.onnx is truncated"
    assert fresh.broken("t", ModelKind.CROSS_ENCODER) == ""
    v2, _ = fresh.new_version("t", ModelKind.RANKER)
    fresh.promote("t", ModelKind.RANKER, v2, "model-2", "test")
    promoted = fresh.current("t", ModelKind.RANKER, damaged)
    assert promoted is not None and promoted.model == "model-2" and fresh.broken("t", ModelKind.RANKER) == ""
    # A damaged pointer is the same: no model, the reason kept.
    (tmp_path / "u" / "ranker").mkdir(parents=True)
    (tmp_path / "u" / "ranker" / "current.json").write_text('{"version": ')
    assert fresh.current("u", ModelKind.RANKER, lambda d: "never") is None
    assert fresh.broken("u", ModelKind.RANKER).startswith("JSONDecodeError")
    # So is a promotion time no Timestamp holds: served, it failed every GetModelStatus.
    (tmp_path / "w" / "ranker").mkdir(parents=True)
    (tmp_path / "w" / "ranker" / "current.json").write_text(
        f'{{"version": "v1", "promote_time_ns": {10**30}}}'
    )
    assert fresh.current("w", ModelKind.RANKER, lambda d: "never") is None
    assert "is not a time" in fresh.broken("w", ModelKind.RANKER)


def test_registry_warm_up_loads_every_tenants_promoted_models(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    for tenant, kinds in (("a", list(ModelKind)), ("b", [ModelKind.RANKER])):
        for kind in kinds:
            version, _ = reg.new_version(tenant, kind)
            reg.promote(tenant, kind, version, "in memory", "test")
    (tmp_path / "c").mkdir()  # a tenant with nothing promoted yet
    fresh = ModelRegistry(tmp_path)
    loaded: list[tuple[str, str]] = []

    def loader(kind: ModelKind) -> Callable[[Path], str]:
        def load(version_dir: Path) -> str:  # <root>/<tenant>/<kind>/<version>
            loaded.append((version_dir.parent.parent.name, kind.value))
            return "from disk"

        return load

    assert fresh.warm_up({kind: loader(kind) for kind in ModelKind}) == 3
    assert sorted(loaded) == [("a", "cross_encoder"), ("a", "ranker"), ("b", "ranker")]
    promoted = fresh.current("b", ModelKind.RANKER, lambda d: "not again")
    assert promoted is not None and promoted.model == "from disk"


CE = ModelKind.CROSS_ENCODER


def _promote(reg: ModelRegistry, tenant: str, kind: ModelKind = CE) -> str:
    version, _ = reg.new_version(tenant, kind)
    reg.promote(tenant, kind, version, f"{tenant}'s model", "test")
    return version


def _in_memory(reg: ModelRegistry, kind: ModelKind = CE) -> set[str]:
    return {t for t in "abcd" if reg.resident(t, kind) is not None}


def test_registry_keeps_a_bounded_kind_to_its_most_recently_served_tenants(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path, resident={CE: 2})
    for tenant in "ab":
        _promote(reg, tenant)
        _promote(reg, tenant, ModelKind.RANKER)
    assert reg.serving("a", CE, lambda d: "unused") is not None  # a is now the most recently served
    _promote(reg, "c")
    _promote(reg, "c", ModelKind.RANKER)
    assert _in_memory(reg) == {"a", "c"}  # b, the least recently served, was dropped
    assert _in_memory(reg, ModelKind.RANKER) == {"a", "b", "c"}  # rankers are not bounded
    # A dropped model is still promoted: a caller that may wait loads it again, dropping
    # the least recently served in its turn.
    again = reg.current("b", CE, lambda d: f"reloaded {d.parent.parent.name}")
    assert again is not None and again.model == "reloaded b"
    assert _in_memory(reg) == {"b", "c"}
    # Promotions here put models in memory without loading them from disk.
    assert reg.residency(CE) == Residency(in_memory=2, bound=2, loads=1, drops=2)
    assert reg.residency(ModelKind.RANKER) == Residency(in_memory=3, bound=0, loads=0, drops=0)
    assert reg.unloaded_version("a", CE) != "" and reg.unloaded_version("b", CE) == ""
    assert reg.unloaded_version("d", CE) == ""  # nothing promoted


def test_registry_drops_nothing_while_a_bounded_kind_has_room(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path, resident={CE: 5})
    for n, tenant in enumerate("abcd", 1):
        _promote(reg, tenant)
        assert len(_in_memory(reg)) == n
    fresh = ModelRegistry(tmp_path, resident={CE: 5})
    assert fresh.warm_up({CE: lambda d: "from disk"}) == 4 and _in_memory(fresh) == set("abcd")


def test_registry_serving_loads_a_model_not_in_memory_in_the_background(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path, resident={CE: 1})
    version_a = _promote(reg, "a")
    _promote(reg, "b")
    assert _in_memory(reg) == {"b"}
    release = threading.Event()
    loads: list[str] = []

    def slow_loader(d: Path) -> str:
        loads.append(d.name)
        assert release.wait(10)
        return f"loaded {d.name}"

    # The load blocks until released, so the callers below can only have answered without it.
    for _ in range(5):
        assert reg.serving("a", CE, slow_loader) is None
    assert reg.resident("b", CE) is not None  # nothing is dropped before a load completes
    release.set()
    deadline = time.monotonic() + 10
    while reg.resident("a", CE) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    served = reg.serving("a", CE, slow_loader)
    assert served is not None and served.model == f"loaded {version_a}"
    assert loads == [version_a]  # one load however many callers asked meanwhile
    assert _in_memory(reg) == {"a"}
    assert reg.serving("d", CE, slow_loader) is None and loads == [version_a]  # nothing to load


def test_registry_loads_in_the_background_one_model_at_a_time_on_one_thread(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path, resident={CE: 1})
    for tenant in "abcd":
        _promote(reg, tenant)
    running, most, threads = 0, 0, set()
    lock = threading.Lock()

    def loader(d: Path) -> str:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            threads.add(threading.current_thread().name)
        time.sleep(0.05)  # long enough for the loads to overlap, were they on threads of their own
        with lock:
            running -= 1
        return d.parent.parent.name

    for tenant in "abc":  # d is in memory; a, b and c are not
        assert reg.serving(tenant, CE, loader) is None
    deadline = time.monotonic() + 10
    while reg.unloaded_version("c", CE) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert most == 1 and threads == {"model-load"}
    assert _in_memory(reg) == {"c"}  # loaded in the order asked, each dropping the one before


def test_registry_warm_up_loads_the_newest_promotions_of_a_bounded_kind(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    for tenant in "abc":
        _promote(reg, tenant)
    (tmp_path / "d" / "cross_encoder").mkdir(parents=True)
    (tmp_path / "d" / "cross_encoder" / "current.json").write_text('{"version": ')  # damaged
    fresh = ModelRegistry(tmp_path, resident={CE: 2})
    loaded: list[str] = []

    def loader(version_dir: Path) -> str:
        loaded.append(version_dir.parent.parent.name)
        return "from disk"

    assert fresh.warm_up({CE: loader}) == 2
    assert loaded == ["c", "b"] and _in_memory(fresh) == {"b", "c"}
    # The damaged pointer took no place: trying it recorded why it does not load.
    assert fresh.broken("d", CE).startswith("JSONDecodeError")
    assert fresh.unloaded_version("d", CE) == ""  # broken, not waiting to be loaded
    assert fresh.unloaded_version("a", CE) != ""
    # The newest promotion counts as the most recently served: loading a drops b.
    assert fresh.current("a", CE, loader) is not None and _in_memory(fresh) == {"a", "c"}


def test_session_matrix_puts_each_feature_in_the_models_column() -> None:
    """Built column by column, it holds what each candidate's row-by-row mapping gives:
    values by name, NaN for a name the server did not send, the last of a repeated name,
    and the cross-encoder's score where there is one (the server's value elsewhere)."""
    rng = random.Random(8)
    names = ("a", "b", "a", CE_FEATURE, "c")
    cands = tuple(
        FeedbackCandidate(Candidate(f"m{i}", "t", rng.random(), tuple(rng.random() for _ in names)), 0.0, 0)
        for i in range(6)
    )
    s = FeedbackSession("s", "q", names, cands)
    model_names = ("c", "missing", CE_FEATURE, "a", "b")
    ce = {"m1": 2.5, "m4": -1.0}

    def by_rows(session: FeedbackSession) -> list[list[float]]:
        return [
            feature_row(
                session.feature_names,
                c.candidate.features,
                model_names,
                {CE_FEATURE: ce[c.candidate.id]} if c.candidate.id in ce else {},
            )
            for c in session.candidates
        ]

    got = session_matrix(s, model_names, ce)
    assert got.dtype == np.float32 and got.shape == (6, 5)
    np.testing.assert_array_equal(got, np.asarray(by_rows(s), dtype=np.float32))
    assert (
        np.isnan(got[:, 1]).all()
        and got[1, 2] == 2.5
        and got[0, 2] == np.float32(cands[0].candidate.features[3])
    )
    np.testing.assert_array_equal(got[:, 3], [np.float32(c.candidate.features[2]) for c in cands])
    # A candidate with fewer values than names (never from the wire): the row-by-row rules.
    short = replace(
        s, candidates=(*cands[:5], FeedbackCandidate(Candidate("m5", "t", 0.1, (0.25, 0.5)), 0.0, 0))
    )
    np.testing.assert_array_equal(
        session_matrix(short, model_names, ce), np.asarray(by_rows(short), dtype=np.float32)
    )
    assert session_matrix(replace(s, candidates=()), model_names, None).shape == (0, 5)


def test_ranker_learns_an_informative_feature_and_exports_to_onnx(tmp_path: Path) -> None:
    rng = random.Random(1)
    sessions = [synthetic_session(i, rng) for i in range(60)]
    train, held = split_heldout(sessions, 0.25, 5)
    model, rows = train_ranker(
        train, None, RankerConfig(n_estimators=60, min_child_samples=5), tmp_path, "v1"
    )
    # The server's names, then the columns the ranker derives from the texts itself.
    assert rows == 20 * len(train) and model.feature_names == NAMES + TEXT_FEATURES
    assert ranker_ndcg(model, held, None) > 0.9 > baseline_ndcg(held) + 0.3
    plain, _ = train_ranker(
        train,
        None,
        RankerConfig(n_estimators=60, min_child_samples=5, text_features=False),
        tmp_path / "p",
        "v2",
    )
    assert plain.feature_names == NAMES


def test_trainer_promotes_only_when_better(tmp_path: Path) -> None:
    cfg = SidecarConfig().replace(
        storage={"data_dir": str(tmp_path)},
        training={"min_sessions": 20, "cross_encoder": False, "heldout_fraction": 0.25},
        ranker={"n_estimators": 60, "min_child_samples": 5},
    )
    store = PairStore(tmp_path / "p.sqlite")
    engine = RankingEngine.over(cfg, store, tmp_path / "models")
    trainer = Trainer(engine)
    rng = random.Random(2)
    noise = [synthetic_session(i, rng, informative=False) for i in range(40)]
    for s in noise:
        store.add_session("noisy", s, None, None, None)
    with pytest.raises(FailedPrecondition, match="needs 20"):
        Trainer(engine).train(
            "empty", {ModelKind.RANKER}, force=False, progress=lambda *a: None, should_stop=lambda: False
        )
    [out] = trainer.train(
        "noisy", {ModelKind.RANKER}, force=False, progress=lambda *a: None, should_stop=lambda: False
    )
    # No signal to learn: whether or not it edges the baseline by luck, the decision follows the numbers.
    assert out.promoted == (out.candidate_ndcg > out.baseline_ndcg)
    for s in (synthetic_session(i, rng) for i in range(40)):
        store.add_session("good", s, None, None, None)
    [good] = trainer.train(
        "good", {ModelKind.RANKER}, force=False, progress=lambda *a: None, should_stop=lambda: False
    )
    assert good.promoted and good.candidate_ndcg > good.baseline_ndcg + 0.3
    assert engine.ranker("good") is not None and store.outcomes("good")[0].promoted


def ranker_engine(tmp_path: Path, n_estimators: int = 60, **training: Any) -> RankingEngine:
    """A sidecar engine that trains rankers only (no cross-encoder), from 20 sessions on."""
    cfg = SidecarConfig().replace(
        storage={"data_dir": str(tmp_path)},
        training={"min_sessions": 20, "cross_encoder": False, "heldout_fraction": 0.25, **training},
        ranker={"n_estimators": n_estimators, "min_child_samples": 5},
    )
    store = PairStore(tmp_path / "p.sqlite")
    return RankingEngine.over(cfg, store, tmp_path / "models")


def test_a_refused_background_run_waits_for_its_schedule_like_any_run(tmp_path: Path) -> None:
    """Sessions ended without a used memory: with 20 stored but none useful, every next
    session started another training process, each refused (learning probe: 11 of 15)."""
    engine = ranker_engine(tmp_path, auto=True)
    attempts: list[int] = []

    def run_now(tenant: str) -> bool:  # what the runner's process would do, here and at once
        attempts.append(engine.store.counts(tenant)[0])
        with pytest.raises(FailedPrecondition, match="0 sessions with positive feedback"):
            Trainer(engine).train(
                tenant,
                {ModelKind.RANKER},
                force=False,
                progress=lambda *a: None,
                should_stop=lambda: False,
                scheduled=True,
            )
        return True

    engine.start_background_training = run_now
    rng = random.Random(5)
    for i in range(45):
        unused = synthetic_session(i, rng)
        engine.submit(
            "t", replace(unused, candidates=tuple(replace(c, relevance=0.0) for c in unused.candidates))
        )
    assert attempts == [20, 40]  # at the minimum, then once the minimum more had come


def test_sessions_that_come_during_a_run_count_towards_the_next(tmp_path: Path) -> None:
    """The count since training was set to 0 when a run ended, so sessions stored while it
    trained (which it never saw) counted for nothing: runs came every N + (a run's arrivals)."""
    engine = ranker_engine(tmp_path)
    store, health = engine.store, engine.health
    rng = random.Random(6)
    for i in range(40):
        store.add_session("t", synthetic_session(i, rng), None, None, None)
        health.record("t", None)
    arrived = iter(range(40, 48))

    def progress(*_: Any) -> None:  # eight sessions come while the run trains
        for i in itertools.islice(arrived, 8):
            store.add_session("t", synthetic_session(i, rng), None, None, None)
            health.record("t", None)

    Trainer(engine).train("t", {ModelKind.RANKER}, force=False, progress=progress, should_stop=lambda: False)
    assert health.sessions_since_training("t") == 8


def test_promoted_ranker_is_refit_on_every_session_and_judged_on_unseen_ones(tmp_path: Path) -> None:
    engine = ranker_engine(tmp_path, min_heldout=5)
    store, cfg = engine.store, engine.cfg
    rng = random.Random(3)
    first = [synthetic_session(i, rng) for i in range(40)]
    for s in first:
        store.add_session("t", s, None, None, None)

    def train() -> TrainingOutcome:
        [out] = Trainer(engine).train(
            "t", {ModelKind.RANKER}, force=False, progress=lambda *a: None, should_stop=lambda: False
        )
        return out

    out = train()
    served = engine.ranker("t")
    assert out.promoted and out.heldout_sessions == 10 and served is not None
    assert served.source.endswith("refit on 40")
    assert served.model.trained_sessions == {s.session_id for s in first}
    # Straight away again: every held-back session is known to the served model, so a ranker
    # like it fitted on the same training sessions stands in for it: the very candidate
    # (same data, same features), which therefore does not beat it.
    at_once = train()
    assert at_once.heldout_sessions == 10 and not at_once.promoted
    assert at_once.current_ndcg == at_once.candidate_ndcg
    assert at_once.reason.endswith("judged by a ranker like it fitted on the same 30 sessions)")
    # Ten new sessions: the next candidate is held back on those, which the served model has
    # not seen, rather than on older ones it was refit on.
    for s in (synthetic_session(i, rng) for i in range(40, 50)):
        store.add_session("t", s, None, None, None)
    again = train()
    assert again.heldout_sessions == 12 - 2  # the newest 12 held back; 2 of them the served model saw
    assert "ranker like it" not in again.reason
    # Without the refit the served model is the one judged on the held-back sessions.
    plain = RankingEngine.over(cfg.replace(ranker={"refit_on_all": False}), store, tmp_path / "models-plain")
    [kept] = Trainer(plain).train(
        "t", {ModelKind.RANKER}, force=False, progress=lambda *a: None, should_stop=lambda: False
    )
    model = plain.ranker("t")
    assert kept.promoted and model is not None and len(model.model.trained_sessions) == 50 - 12


def test_deadline_and_admission_gate() -> None:
    d = Deadline(-1)
    with pytest.raises(DeadlineExceeded):
        d.check("anything")
    gate = AdmissionGate(running=1, queued=0)
    # While one request holds the only slot and nothing may queue, the next is shed...
    with gate.admit(Deadline(1.0)), pytest.raises(ResourceExhausted), gate.admit(Deadline(1.0)):
        pass
    assert gate.shed == 1
    # ...and one allowed to queue waits for the slot only as long as its deadline.
    gate2 = AdmissionGate(running=1, queued=1)
    with gate2.admit(Deadline(1.0)), pytest.raises(DeadlineExceeded), gate2.admit(Deadline(0.05)):
        pass


def test_a_cancelled_call_leaves_the_queue_at_once_and_its_slot_goes_to_the_next() -> None:
    """A caller that cancels while its call waits for the only inference slot: the call
    leaves within ~0.05 s, not at its deadline, and never takes the slot."""
    gate = AdmissionGate(running=1, queued=2)
    caller_waits = threading.Event()
    caller_waits.set()
    outcome: list[BaseException] = []

    def queued() -> None:
        try:
            with gate.admit(Deadline(30.0, alive=caller_waits.is_set)):
                outcome.append(AssertionError("a cancelled call was admitted"))
        except Exception as exc:
            outcome.append(exc)

    with gate.admit(Deadline(30.0)):
        waiter = threading.Thread(target=queued)
        waiter.start()
        time.sleep(0.2)
        cancelled_at = time.monotonic()
        caller_waits.clear()
        waiter.join(5.0)
        assert time.monotonic() - cancelled_at < 1.0 and not waiter.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], Cancelled)
    with gate.admit(Deadline(1.0)):  # the slot and the queue place are free again
        pass
    with pytest.raises(Cancelled):
        Deadline(30.0, alive=lambda: False).check("scoring")


def test_out_of_fold_scores_never_come_from_a_model_that_saw_the_session(tmp_path: Path) -> None:
    """Each session is scored once, by the model of the one fold fitted without it; the
    split is fixed by session id. (Model = a directory naming the sessions it was fitted
    on; the real fine-tunes run in test_crossencoder's trainer test.)"""
    from mnemo_sidecar.learning.cross_fit import fold_of, out_of_fold_scores

    rng = random.Random(9)
    sessions = [synthetic_session(i, rng, n=4) for i in range(30)]

    def fit(on: Sequence[FeedbackSession], out_dir: Path) -> bool:
        out_dir.mkdir(parents=True)
        (out_dir / "seen").write_text("\n".join(s.session_id for s in on))
        return True

    def score(model: Any, s: FeedbackSession) -> dict[str, float]:
        seen = (Path(model) / "seen").read_text().split()
        assert s.session_id not in seen
        return {c.candidate.id: float(len(seen)) for c in s.candidates}

    oof = out_of_fold_scores(sessions, 3, fit, lambda model_dir, _cache: model_dir, score)
    assert set(oof) == {s.session_id for s in sessions}
    fold_size = Counter(fold_of(s.session_id, 3) for s in sessions)
    assert len(fold_size) == 3 and all(fold_size.values())
    for s in sessions:  # fitted on exactly the other folds' sessions
        assert set(oof[s.session_id].values()) == {30 - fold_size[fold_of(s.session_id, 3)]}
    # Fixed by the id (a hash, not Python's per-process one): a re-run splits the same way.
    assert [fold_of(f"s{i}", 3) for i in range(6)] == [2, 0, 1, 2, 0, 2]
    assert out_of_fold_scores(sessions[:1], 2, fit, lambda d, _c: d, score) == {}
    # A fold whose complement has nothing to learn from (here: lacks s0) gets no model and
    # no scores; the others are scored as before.
    picky = out_of_fold_scores(
        sessions, 3, lambda on, d: "s0" in {x.session_id for x in on} and fit(on, d), lambda d, _c: d, score
    )
    unscored = {s.session_id for s in sessions if fold_of(s.session_id, 3) != fold_of("s0", 3)}
    assert set(picky) == unscored and picky == {k: oof[k] for k in unscored}


def test_forced_training_without_pairs_keeps_the_cross_encoder_instead_of_failing(tmp_path: Path) -> None:
    """No session with both a used and an unused memory (every candidate used): the
    fine-tune has no pairs to learn from; the run says so and goes on, rather than failing
    the whole training (a fold of the cross-fitting did, in a bench)."""
    cfg = SidecarConfig().replace(
        storage={"data_dir": str(tmp_path)}, training={"min_sessions": 20, "heldout_fraction": 0.25}
    )
    store = PairStore(tmp_path / "p.sqlite")
    engine = RankingEngine.over(cfg, store, tmp_path / "models")
    rng = random.Random(4)
    for i in range(12):
        s = synthetic_session(i, rng)
        used = tuple(FeedbackCandidate(c.candidate, 1.0, c.baseline_rank) for c in s.candidates)
        store.add_session("t", replace(s, candidates=used), None, None, None)
    [out] = Trainer(engine).train(
        "t", {ModelKind.CROSS_ENCODER}, force=True, progress=lambda *a: None, should_stop=lambda: False
    )
    assert out.model is ModelKind.CROSS_ENCODER and not out.promoted and out.train_pairs == 0
    trained_on = 12 - out.heldout_sessions
    assert out.reason == f"kept the current version: {trained_on} training sessions give no pairs"
    assert engine.cross_encoder("t")[0] is None


def test_fine_tunes_are_due_by_sessions_arrived_also_at_the_stores_cap(tmp_path: Path) -> None:
    """At the cap the stored count stops growing; arrivals (sequence numbers) still count,
    so the cross-encoder is fine-tuned again once the stored window has been replaced. The
    mark survives a restart."""
    from mnemo_sidecar.learning.model import SessionMark
    from mnemo_sidecar.learning.trainer import sessions_until_fine_tune

    store = PairStore(tmp_path / "p.sqlite", max_sessions=10)
    rng = random.Random(7)
    for i in range(25):
        store.add_session("t", synthetic_session(i, rng), None, None, None)
    mark = store.session_mark("t")
    assert mark == SessionMark(stored=10, last_seq=25) and store.session_mark("other") == SessionMark(0, 0)
    assert store.last_fine_tune("t") is None and sessions_until_fine_tune(None, mark, 2.0) == 0
    store.record_fine_tune("t", mark)
    store.close()
    store = PairStore(tmp_path / "p.sqlite", max_sessions=10)
    assert store.last_fine_tune("t") == mark and store.last_fine_tune("other") is None
    for i in range(25, 34):
        store.add_session("t", synthetic_session(i, rng), None, None, None)
    now = store.session_mark("t")
    assert now == SessionMark(10, 34)
    assert sessions_until_fine_tune(mark, now, 2.0) == 1
    assert sessions_until_fine_tune(mark, now, 3.0) == 11
    assert sessions_until_fine_tune(mark, now, 1.5) == 0 and sessions_until_fine_tune(mark, now, 1.0) == 0
    store.add_session("t", synthetic_session(34, rng), None, None, None)
    assert sessions_until_fine_tune(mark, store.session_mark("t"), 2.0) == 0


def test_the_health_window_reads_decided_sessions_through_their_own_index(tmp_path: Path) -> None:
    """Most sessions are undecided (ties, cold start): the window must not walk them all."""
    store = PairStore(tmp_path / "p.sqlite")
    rng = random.Random(8)
    for i in range(60):
        decided = i in (5, 30, 58)
        store.add_session(
            "t", synthetic_session(i, rng), 0.5, 0.6 if decided else None, 1.0 if decided else None
        )
    assert store.recent_wins("t", 2) == [(1.0, 0.6, 0.5), (1.0, 0.6, 0.5)]
    assert len(store.recent_wins("t", 20)) == 3
    plan = store._conn.execute(
        "EXPLAIN QUERY PLAN SELECT win FROM sessions WHERE tenant = ? AND win IS NOT NULL "
        "ORDER BY seq DESC LIMIT 20",
        ("t",),
    ).fetchall()
    assert "decided_by_seq" in str(plan)


def test_health_updates_made_at_once_are_all_kept(tmp_path: Path) -> None:
    """Sessions stored at once (and a training run) change one health row: each change is
    read and written in one transaction, so none is lost (probe: 8 callers storing 60
    sessions applied ~45 of them)."""
    health = HealthTracker(PairStore(tmp_path / "p.sqlite"), HealthConfig(alpha=0.1))
    barrier = threading.Barrier(8)

    def store_wins(n: int) -> None:
        barrier.wait()
        for _ in range(n):
            health.record("t", 1.0)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(store_wins, [8] * 7 + [4]))
    ema, since_promotion, since_training = health.store.health_state("t")
    assert ema == pytest.approx(1 - 0.5 * 0.9**60, abs=1e-12)
    assert (since_promotion, since_training) == (60, 60)
    health.on_training("t", seen=60)
    assert health.store.health_state("t")[1:] == (60, 0)


def test_a_stored_session_sent_again_without_candidates_is_a_duplicate(tmp_path: Path) -> None:
    """An empty session is not stored, but one whose id is stored already was answered
    duplicate=false, though the contract says true when the session was submitted before."""
    engine = ranker_engine(tmp_path)
    session = synthetic_session(1, random.Random(9))
    assert not engine.submit("t", session).duplicate
    assert engine.submit("t", replace(session, candidates=())).duplicate
    assert not engine.submit("t", replace(session, session_id="never-stored", candidates=())).duplicate
    assert not engine.submit("other", replace(session, candidates=())).duplicate
    assert engine.store.counts("t")[0] == 1 and engine.store.counts("other")[0] == 0  # nothing more stored


def test_each_models_outcome_is_recorded_and_told_as_soon_as_it_is_decided(tmp_path: Path) -> None:
    """A run that decided the cross-encoder and then died in the ranker's turn (a kill, the
    watchdog, an error) lost that outcome, and the serving process, which swaps a model in
    when told of its promotion, kept the old one (probe)."""
    cfg = SidecarConfig().replace(
        storage={"data_dir": str(tmp_path)}, training={"min_sessions": 20, "heldout_fraction": 0.25}
    )
    store = PairStore(tmp_path / "p.sqlite")
    engine = RankingEngine.over(cfg, store, tmp_path / "models")
    rng = random.Random(4)
    for i in range(12):  # every candidate used: the fine-tune is decided at once (no pairs)
        s = synthetic_session(i, rng)
        used = tuple(FeedbackCandidate(c.candidate, 1.0, c.baseline_rank) for c in s.candidates)
        store.add_session("t", replace(s, candidates=used), None, None, None)
    told: list[ModelKind] = []

    def ranker_dies(model: ModelKind, stage: str, fraction: float, message: str) -> None:
        if model is ModelKind.RANKER:
            raise RuntimeError("killed in the ranker's turn")

    with pytest.raises(RuntimeError, match="ranker's turn"):
        Trainer(engine).train(
            "t",
            {ModelKind.CROSS_ENCODER, ModelKind.RANKER},
            force=True,
            progress=ranker_dies,
            should_stop=lambda: False,
            on_outcome=lambda o: told.append(o.model),
        )
    assert told == [ModelKind.CROSS_ENCODER]
    assert [o.model for o in store.outcomes("t")] == [ModelKind.CROSS_ENCODER]
