"""A promoted ranker whose files disagree, or that fails when it scores, costs the tenant
its model order and nothing else: it is refused at load like any damaged version, its
failures are a clear FAILED_PRECONDITION (a fallback to the server), feedback is stored all
the same, and the next training is not kept out by it. Real files, real onnxruntime."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from mnemo_sidecar.config import RankerConfig
from mnemo_sidecar.deadlines import Deadline
from mnemo_sidecar.engine import RankingEngine
from mnemo_sidecar.learning.model import ModelKind
from mnemo_sidecar.learning.registry import ModelRegistry
from mnemo_sidecar.learning.trainer import Trainer
from mnemo_sidecar.ranker.model import RankerFailed, RankerModel, train_ranker
from tests.unit.test_sidecar_learning import NAMES, ranker_engine, synthetic_session

RANKER = ModelKind.RANKER


def promoted_ranker(registry: ModelRegistry, tenant: str = "t") -> Path:
    """A small ranker trained and promoted as a finished training leaves it: a version
    directory and the pointer. Its directory."""
    version, path = registry.new_version(tenant, RANKER)
    rng = random.Random(4)
    model, _ = train_ranker(
        [synthetic_session(i, rng) for i in range(30)],
        None,
        RankerConfig(n_estimators=20, min_child_samples=5),
        path,
        version,
    )
    registry.promote(tenant, RANKER, version, model, "test")
    return path


def failing_ranker(registry: ModelRegistry, tenant: str = "t", names: Sequence[str] = NAMES) -> Path:
    """A promoted ranker whose files agree and which scores one row, but whose ONNX graph
    (a Reshape to one row) fails in onnxruntime on every call with more: a model that
    passes every check at load and fails when it predicts. Its directory."""
    from onnx import TensorProto, helper

    width = len(names)
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["features", "one_row"], ["row"]),
            helper.make_node("ReduceSum", ["row", "axis"], ["variable"], keepdims=1),
        ],
        "fails-past-one-row",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [None, width])],
        [helper.make_tensor_value_info("variable", TensorProto.FLOAT, [None, 1])],
        initializer=[
            helper.make_tensor("one_row", TensorProto.INT64, [2], [1, width]),
            helper.make_tensor("axis", TensorProto.INT64, [1], [1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    version, path = registry.new_version(tenant, RANKER)
    (path / "ranker.onnx").write_bytes(model.SerializeToString())
    meta = {"version": version, "feature_names": list(names), "uses_ce": False, "session_ids": []}
    (path / "ranker.json").write_text(json.dumps(meta))
    registry.promote(tenant, RANKER, version, RankerModel.load(path), "test")
    return path


def _edit_names(directory: Path, change: int) -> int:
    """ranker.json with one feature name fewer (-1) or more (+1) than ranker.onnx takes, as
    a version half restored or mixed up with another leaves it; the names it had."""
    meta = json.loads((directory / "ranker.json").read_text())
    names = meta["feature_names"]
    meta["feature_names"] = names[:-1] if change < 0 else [*names, "added"]
    (directory / "ranker.json").write_text(json.dumps(meta))
    return len(names)


@pytest.mark.parametrize("change", [-1, 1])
def test_a_ranker_whose_json_disagrees_with_its_onnx_is_refused_at_load(tmp_path: Path, change: int) -> None:
    """It loaded, was served as ready, and failed every Score and every SubmitTrainingPairs
    (onnxruntime: "Got: 26 Expected: 27")."""
    directory = promoted_ranker(ModelRegistry(tmp_path))
    width = _edit_names(directory, change)
    with pytest.raises(
        ValueError, match=f"takes {width} features a row; its ranker.json names {width + change}"
    ):
        RankerModel.load(directory)
    fresh = ModelRegistry(tmp_path)  # as after a restart: refused, served as none, the reason kept
    assert fresh.current("t", RANKER, RankerModel.load) is None
    assert fresh.broken("t", RANKER).startswith("ValueError: ")
    assert f"ranker.json names {width + change}" in fresh.broken("t", RANKER)


def test_a_ranker_whose_onnx_takes_another_input_is_refused_at_load(tmp_path: Path) -> None:
    directory = failing_ranker(ModelRegistry(tmp_path))
    from onnx import load, save

    model = load(str(directory / "ranker.onnx"))
    model.graph.input[0].name = "input"
    model.graph.node[0].input[0] = "input"
    save(model, str(directory / "ranker.onnx"))
    with pytest.raises(ValueError, match="not one float matrix `features`"):
        RankerModel.load(directory)


def test_a_ranker_failing_when_it_scores_fails_score_clearly_and_feedback_is_stored(tmp_path: Path) -> None:
    engine = ranker_engine(tmp_path)
    failing_ranker(engine.registry)
    rng = random.Random(8)
    session = synthetic_session(0, rng, n=5)
    candidates = [c.candidate for c in session.candidates]
    with pytest.raises(RankerFailed) as err:
        engine.score("t", session.query, NAMES, candidates, Deadline.none())
    # FAILED_PRECONDITION: the server's client falls back to its own order and does not
    # count it against the sidecar's health, as it would an INTERNAL.
    assert err.value.reason == "RANKER_FAILED" and "failed to score" in err.value.message
    promoted = engine.ranker("t")
    assert promoted is not None and promoted.model.failures == 1
    # Feedback the model did not serve is judged by it in shadow: its failure loses the
    # judgement, not the feedback.
    result = engine.submit("t", session)
    assert not result.duplicate and engine.store.counts("t")[0] == 1
    assert engine.shadow_failures["t"] == 1 and promoted.model.failures == 2
    again = engine.submit("t", synthetic_session(1, rng, n=5))
    assert not again.duplicate and engine.store.counts("t")[0] == 2 and engine.shadow_failures["t"] == 2


def test_a_ranker_that_fails_to_score_keeps_no_trained_ranker_out(tmp_path: Path) -> None:
    """Judged against it, every candidate failed the run (or, refused, was kept out by it):
    the tenant could not learn its way past the broken version."""
    engine = ranker_engine(tmp_path, n_estimators=20)
    broken = failing_ranker(engine.registry)
    rng = random.Random(9)
    for i in range(24):
        engine.store.add_session("t", synthetic_session(i, rng), None, None, None)
    [out] = Trainer(engine).train(
        "t", {RANKER}, force=False, progress=lambda *a: None, should_stop=lambda: False
    )
    assert out.promoted, out.reason
    assert "beats the baseline" in out.reason
    assert f"(the current version fails to score: the ranker {broken.name} failed to score: " in out.reason
    served = engine.ranker("t")
    assert served is not None and served.version == out.candidate_version


def test_a_train_after_a_refused_ranker_promotes_against_the_baseline(tmp_path: Path) -> None:
    engine = ranker_engine(tmp_path, n_estimators=20)
    _edit_names(promoted_ranker(engine.registry), -1)
    fresh = RankingEngine.over(engine.cfg, engine.store, tmp_path / "models")  # as after a restart
    assert fresh.ranker("t") is None and fresh.registry.broken("t", RANKER)
    rng = random.Random(10)
    for i in range(24):
        fresh.store.add_session("t", synthetic_session(i, rng), None, None, None)
    [out] = Trainer(fresh).train(
        "t", {RANKER}, force=True, progress=lambda *a: None, should_stop=lambda: False
    )
    assert out.promoted and "beats the baseline" in out.reason
    served = fresh.ranker("t")
    assert (
        served is not None
        and served.version == out.candidate_version
        and not fresh.registry.broken("t", RANKER)
    )


def test_a_shadow_judgement_past_the_deadline_stores_the_session_unjudged(tmp_path: Path) -> None:
    """SubmitTrainingPairs judges the current model on feedback it did not serve within the
    caller's deadline: past it the session is stored all the same, without a judgement,
    and the model is not counted as failing."""
    engine = ranker_engine(tmp_path, n_estimators=20)
    promoted_ranker(engine.registry)
    rng = random.Random(12)
    late = engine.submit("t", synthetic_session(0, rng), Deadline(0.0))
    assert not late.duplicate and engine.store.counts("t")[0] == 1
    assert engine.store.recent_wins("t", 10) == [] and engine.shadow_failures["t"] == 0
    served = engine.ranker("t")
    assert served is not None and served.model.failures == 0
    # With time to judge it, the next one is judged against the baseline.
    engine.submit("t", synthetic_session(1, rng), Deadline(30.0))
    [(_, predictor_ndcg, baseline_ndcg)] = engine.store.recent_wins("t", 10)
    assert predictor_ndcg is not None and baseline_ndcg is not None
