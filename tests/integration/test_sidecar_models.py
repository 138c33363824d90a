"""A restarted sidecar (real process parts, real gRPC on port 0) serves the ranker it had
promoted from its first call, loaded before it served; a promoted ranker whose files are
damaged is served as none (cold start, the caller keeps its baseline), says why in
GetModelStatus, and is not loaded again on every call."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo.ranking.v1 import ranking_service_pb2_grpc as rpb_grpc
from mnemo_sidecar.learning.model import FeedbackSession, ModelKind
from mnemo_sidecar.learning.registry import ModelRegistry
from tests.unit.test_ranker_files import failing_ranker, promoted_ranker
from tests.unit.test_sidecar_learning import NAMES, synthetic_session


def _promote_a_ranker(data_dir: Path) -> str:
    """What a finished training leaves on disk: a version directory and the pointer."""
    return promoted_ranker(ModelRegistry(data_dir / "models"), "acme").name


def _score(stub: rpb_grpc.RankingServiceStub) -> rpb.ScoreResponse:
    request = rpb.ScoreRequest(
        tenant_id="acme",
        session_id="s1",
        query="how do releases work",
        feature_names=NAMES,
        candidates=[
            rpb.Candidate(id=f"m{i}", text=f"memory {i}", baseline_score=0.5, features=(0.5, float(i), 0.1))
            for i in range(5)
        ],
    )
    response: rpb.ScoreResponse = stub.Score(request, timeout=10)
    return response


def _never(directory: Path) -> object:
    raise AssertionError(f"{directory} loaded again")


def test_a_restarted_sidecar_serves_its_promoted_ranker_loaded_before_it_serves(
    start_sidecar: Callable[..., Any], tmp_path: Path
) -> None:
    version = _promote_a_ranker(tmp_path / "side")
    side = start_sidecar(data_dir=tmp_path / "side")
    # Before any call: the ranker is in memory already.
    promoted = side.engine.registry.current("acme", ModelKind.RANKER, _never)
    assert promoted is not None and promoted.version == version
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))
    scored = _score(stub)
    assert not scored.cold_start and scored.model_version == version and len(scored.scores) == 5


def test_a_promoted_ranker_that_does_not_load_is_served_as_none_and_said_so(
    start_sidecar: Callable[..., Any], tmp_path: Path
) -> None:
    version = _promote_a_ranker(tmp_path / "side")
    onnx = tmp_path / "side" / "models" / "acme" / "ranker" / version / "ranker.onnx"
    onnx.write_bytes(onnx.read_bytes()[:100])  # cut short, as a full disk would leave it
    side = start_sidecar(data_dir=tmp_path / "side")
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))
    for _ in range(3):
        scored = _score(stub)
        assert scored.cold_start and not scored.scores
    status = stub.GetModelStatus(rpb.GetModelStatusRequest(tenant_id="acme"), timeout=5)
    assert status.cold_start and not status.ranker.ready
    assert "the promoted ranker does not load and is not served" in status.note
    assert side.engine.registry.current("acme", ModelKind.RANKER, _never) is None  # not tried again


def test_status_counts_down_the_sessions_until_the_next_fine_tune(
    start_sidecar: Callable[..., Any], tmp_path: Path
) -> None:
    """What a finished fine-tune leaves in the pair store (its mark) is read after a
    restart; every session submitted since brings the next background fine-tune closer."""
    from google.protobuf import timestamp_pb2

    from mnemo_sidecar.learning.pair_store import PairStore

    store = PairStore(tmp_path / "side" / "pairs.sqlite")
    rng = random.Random(5)
    for i in range(6):
        store.add_session("acme", synthetic_session(i, rng), None, None, None)
    store.record_fine_tune("acme", store.session_mark("acme"))
    store.close()
    side = start_sidecar(data_dir=tmp_path / "side")
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))

    def until(tenant: str = "acme") -> int:
        status = stub.GetModelStatus(rpb.GetModelStatusRequest(tenant_id=tenant), timeout=5)
        return int(status.sessions_until_fine_tune)

    assert until() == 6 and until("other") == 0  # never fine-tuned: the next run does
    for i in range(6):
        stub.SubmitTrainingPairs(
            rpb.SubmitTrainingPairsRequest(
                tenant_id="acme",
                session=rpb.TrainingSession(
                    session_id=f"new-{i}",
                    query="how do releases work",
                    feature_names=NAMES,
                    candidates=[
                        rpb.TrainingCandidate(
                            candidate=rpb.Candidate(
                                id="m1", text="memory 1", baseline_score=0.5, features=(0.5, 1.0, 0.1)
                            ),
                            relevance=1.0,
                            baseline_rank=1,
                        )
                    ],
                    end_time=timestamp_pb2.Timestamp(seconds=1_700_000_000 + i),
                ),
            ),
            timeout=5,
        )
        assert until() == 5 - i


def test_status_says_when_no_fine_tune_will_come_whatever_the_count_down(
    start_sidecar: Callable[..., Any], tmp_path: Path
) -> None:
    def note(**training: Any) -> str:
        side = start_sidecar(data_dir=tmp_path / f"side{len(training)}", training=training)
        stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))
        status = stub.GetModelStatus(rpb.GetModelStatusRequest(tenant_id="acme"), timeout=5)
        assert status.sessions_until_fine_tune == 0  # never fine-tuned
        return str(status.note)

    on = note(auto=True)
    assert "switched off" not in on
    off = note(auto=False, cross_encoder=False)
    assert "cross-encoder fine-tuning is switched off (training.cross_encoder = false)" in off
    assert "background training is switched off (training.auto = false)" in off


def test_a_starting_sidecar_clears_what_a_killed_training_process_left_in_its_scratch(
    start_sidecar: Callable[..., Any], tmp_path: Path
) -> None:
    left = tmp_path / "side" / "training-scratch" / "ce-fold-x1" / "model"
    left.mkdir(parents=True)
    (left / "model.safetensors").write_bytes(b"\0" * 1024)
    side = start_sidecar(data_dir=tmp_path / "side")
    assert side.cfg.training_scratch == tmp_path / "side" / "training-scratch"
    assert not side.cfg.training_scratch.exists()


def test_a_sidecar_without_a_cross_encoder_prepares_the_embedding_blend_before_it_serves(
    start_sidecar: Callable[..., Any],
) -> None:
    """The blend answers every Rerank without a cross-encoder; preparing its embedder in a
    new data directory took ~9 s, which the first such Rerank spent past its deadline."""
    side = start_sidecar()
    assert side.engine.blend._embedder is not None  # loaded before the port opened
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))
    candidates = [rpb.Candidate(id=f"m{i}", text=f"memory {i}", baseline_score=0.5) for i in range(3)]
    answer = stub.Rerank(rpb.RerankRequest(tenant_id="acme", query="q", candidates=candidates), timeout=10)
    assert answer.method == rpb.RERANK_METHOD_EMBEDDING_BLEND and len(answer.scores) == 3


def test_train_streams_follow_max_train_streams_past_the_memory_servers_stream_caps(
    start_sidecar: Callable[..., Any],
) -> None:
    """The sidecar shares the memory server's interceptor, whose stream caps (4 a caller,
    every sidecar caller being one) refused a 5th Train whatever server.max_train_streams
    said, naming the memory server's settings. Six followers of a run, at 6, are followed."""
    from mnemo_sidecar.learning.model import ProgressEvent
    from mnemo_sidecar.learning.runner import TrainingRun

    side = start_sidecar(server={"max_train_streams": 6})
    run = TrainingRun("t", kinds=frozenset({ModelKind.RANKER}))  # a ranker run in progress
    side.runner._runs["t"] = run
    run.emit(ProgressEvent(ModelKind.RANKER, "fit", 0.5, "halfway"))
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))
    request = rpb.TrainRequest(tenant_id="t", models=[rpb.MODEL_KIND_RANKER])
    followers = [stub.Train(request, timeout=30) for _ in range(6)]
    assert [next(f).message for f in followers] == ["halfway"] * 6
    with pytest.raises(grpc.RpcError) as err:
        next(stub.Train(request, timeout=10))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_train_streams" in (err.value.details() or "")
    for f in followers:
        f.cancel()


def test_train_calls_join_only_a_run_that_does_what_they_ask_and_streams_are_bounded(
    start_sidecar: Callable[..., Any],
) -> None:
    """A Train call that joined the tenant's run in progress streamed that run's outcome as
    its own, whatever it asked (probe: a Train of the cross-encoder answered OK with the
    ranker's run). And followers each hold a worker for the whole run: past
    server.max_train_streams they are refused, so Score and Rerank keep workers."""
    from mnemo_sidecar.learning.model import ProgressEvent
    from mnemo_sidecar.learning.runner import TrainingRun

    side = start_sidecar(server={"max_train_streams": 1})
    run = TrainingRun("t", kinds=frozenset({ModelKind.RANKER}))  # a ranker run in progress
    side.runner._runs["t"] = run
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))
    ranker_only = [rpb.MODEL_KIND_RANKER]
    follower = stub.Train(rpb.TrainRequest(tenant_id="t", models=ranker_only), timeout=30)
    run.emit(ProgressEvent(ModelKind.RANKER, "fit", 0.5, "halfway"))
    assert next(follower).message == "halfway"  # joined: the run does what it asks
    with pytest.raises(grpc.RpcError) as err:
        next(stub.Train(rpb.TrainRequest(tenant_id="u"), timeout=10))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_train_streams" in (err.value.details() or "")
    assert _score(stub).cold_start  # Score is still answered
    # A follower that leaves gives its worker back while the run is quiet, not at its next event.
    follower.cancel()
    deadline, refused = time.monotonic() + 10, []
    while True:
        again = stub.Train(rpb.TrainRequest(tenant_id="t", models=ranker_only), timeout=30)
        try:
            first = next(again)  # the run's events from its start
            break
        except grpc.RpcError as err:
            refused.append(err.code())
        assert time.monotonic() < deadline, refused
        time.sleep(0.2)
    assert first.message == "halfway" and set(refused) <= {grpc.StatusCode.RESOURCE_EXHAUSTED}
    run.finish()
    assert list(again) == []
    side.runner._runs["t"] = TrainingRun("t", kinds=frozenset({ModelKind.RANKER}))
    for asks in ({"models": [rpb.MODEL_KIND_CROSS_ENCODER]}, {"models": ranker_only, "force": True}):
        with pytest.raises(grpc.RpcError) as err:
            next(stub.Train(rpb.TrainRequest(tenant_id="t", **asks), timeout=10))  # type: ignore[arg-type]
        assert err.value.code() == grpc.StatusCode.ABORTED, asks
        assert "already training (RANKER)" in (err.value.details() or ""), asks


def test_a_configured_cross_encoder_directory_that_holds_none_is_one_config_error(
    start_sidecar: Callable[..., Any], tmp_path: Path
) -> None:
    """It was the model loader's whole traceback, printed by `mnemo up` under its error."""
    from mnemo_server.errors import FailedPrecondition

    empty = tmp_path / "ce"
    empty.mkdir()
    with pytest.raises(FailedPrecondition) as err:
        start_sidecar(cross_encoder={"path": str(empty)})
    assert err.value.reason == "BAD_CONFIG"
    assert str(err.value).startswith(f"cross_encoder.path '{empty}' holds no cross-encoder that loads: ")


def _session_pb(s: FeedbackSession) -> rpb.TrainingSession:
    out = rpb.TrainingSession(session_id=s.session_id, query=s.query, feature_names=s.feature_names)
    out.end_time.FromNanoseconds(1_700_000_000 * 10**9 + s.end_time_ns)
    for c in s.candidates:
        out.candidates.append(
            rpb.TrainingCandidate(
                candidate=rpb.Candidate(
                    id=c.candidate.id,
                    text=c.candidate.text,
                    baseline_score=c.candidate.baseline_score,
                    features=c.candidate.features,
                ),
                relevance=c.relevance,
                baseline_rank=c.baseline_rank,
            )
        )
    return out


def _submit(stub: rpb_grpc.RankingServiceStub, sessions: list[FeedbackSession]) -> int:
    """Submits every session (each must be answered OK); the stored sessions after."""
    for s in sessions:
        answer = stub.SubmitTrainingPairs(
            rpb.SubmitTrainingPairsRequest(tenant_id="acme", session=_session_pb(s)), timeout=10
        )
        assert not answer.duplicate
    status = stub.GetModelStatus(rpb.GetModelStatusRequest(tenant_id="acme"), timeout=5)
    return int(status.stored_sessions)


def test_a_promoted_ranker_whose_files_disagree_is_refused_and_the_tenant_learns_past_it(
    start_sidecar: Callable[..., Any], tmp_path: Path
) -> None:
    """ranker.json naming one feature fewer than ranker.onnx takes (a version half restored
    or mixed up) was served as ready; every Score and every SubmitTrainingPairs then failed
    INTERNAL (the feedback lost), and a forced Train kept it ("does not beat the current
    version"): the tenant could neither be served nor learn its way out."""
    version = _promote_a_ranker(tmp_path / "side")
    meta_file = tmp_path / "side" / "models" / "acme" / "ranker" / version / "ranker.json"
    meta = json.loads(meta_file.read_text())
    meta["feature_names"] = meta["feature_names"][:-1]
    meta_file.write_text(json.dumps(meta))
    side = start_sidecar(
        data_dir=tmp_path / "side",
        training={"cross_encoder": False, "min_sessions": 10, "min_heldout": 4},
        ranker={"n_estimators": 20, "min_child_samples": 5},
    )
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))
    assert _score(stub).cold_start  # the caller keeps its baseline
    status = stub.GetModelStatus(rpb.GetModelStatusRequest(tenant_id="acme"), timeout=5)
    assert status.cold_start and not status.ranker.ready
    width = len(meta["feature_names"]) + 1
    assert "the promoted ranker does not load and is not served" in status.note
    assert f"ranker.onnx takes {width} features a row; its ranker.json names {width - 1}" in status.note
    rng = random.Random(6)
    assert _submit(stub, [synthetic_session(i, rng) for i in range(24)]) == 24  # every one stored
    outcomes = [
        e.outcome
        for e in stub.Train(
            rpb.TrainRequest(tenant_id="acme", models=[rpb.MODEL_KIND_RANKER], force=True), timeout=120
        )
        if e.HasField("outcome")
    ]
    assert outcomes and outcomes[-1].promoted, outcomes
    assert "beats the baseline" in outcomes[-1].reason  # the refused version judged nothing
    status = stub.GetModelStatus(rpb.GetModelStatusRequest(tenant_id="acme"), timeout=5)
    assert status.ranker.ready and status.ranker.version not in ("", version)
    assert "does not load" not in status.note
    scored = _score(stub)
    assert not scored.cold_start and scored.model_version == status.ranker.version and len(scored.scores) == 5


def test_a_ranker_failing_when_it_scores_is_a_fallback_for_the_server_and_feedback_is_stored(
    start_sidecar: Callable[..., Any], tmp_path: Path
) -> None:
    """An onnxruntime error at Score answered INTERNAL, which the server's client counts
    against the sidecar's health (its circuit opens for every tenant); the shadow prediction
    of SubmitTrainingPairs failed the submission with it."""
    from mnemo_server.config import RankingConfig
    from mnemo_server.ranking.client import RankingClient

    failing_ranker(ModelRegistry(tmp_path / "side" / "models"), "acme")
    side = start_sidecar(data_dir=tmp_path / "side")
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))
    with pytest.raises(grpc.RpcError) as err:
        _score(stub)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "failed to score" in (err.value.details() or "")
    client = RankingClient(RankingConfig(sidecar_address=f"127.0.0.1:{side.port}", breaker_failures=2))
    try:
        request = rpb.ScoreRequest(
            tenant_id="acme",
            query="q",
            feature_names=NAMES,
            candidates=[rpb.Candidate(id=f"m{i}", text="t", features=(0.5, 1.0, 0.1)) for i in range(3)],
        )
        for _ in range(3):
            answer = client.score(request, 5.0)
            assert not answer.ok and answer.fallback_reason == "error:FAILED_PRECONDITION"
        assert client.breaker.allow()  # the sidecar's health is not in question
    finally:
        client.close()
    rng = random.Random(7)
    assert _submit(stub, [synthetic_session(i, rng) for i in range(3)]) == 3
    assert side.engine.shadow_failures["acme"] == 3
    note = stub.GetModelStatus(rpb.GetModelStatusRequest(tenant_id="acme"), timeout=10).note
    # 4 Scores and 3 shadow predictions, each a failed score of the model.
    assert "failed to score 7 times" in note and "3 submitted sessions were stored unjudged" in note
