"""The sidecar's RankingService refuses bad input with INVALID_ARGUMENT naming the field, over
real gRPC, and a refused submission stores nothing."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo.ranking.v1 import ranking_service_pb2_grpc as rpb_grpc
from tests.conftest import error_info

NAMES = ["a", "b"]
WHEN = timestamp_pb2.Timestamp(seconds=1_700_000_000)


def _candidate(i: int, baseline: float = 0.5, features: tuple[float, ...] = (0.1, 0.2)) -> rpb.Candidate:
    return rpb.Candidate(id=f"m{i}", text=f"memory {i}", baseline_score=baseline, features=features)


def _session(
    end_time: timestamp_pb2.Timestamp = WHEN, rank: int = 1, features: tuple[float, ...] = (0.1, 0.2)
) -> rpb.SubmitTrainingPairsRequest:
    return rpb.SubmitTrainingPairsRequest(
        tenant_id="acme",
        session=rpb.TrainingSession(
            session_id="s1",
            query="how do releases work",
            feature_names=NAMES,
            candidates=[
                rpb.TrainingCandidate(
                    candidate=_candidate(i, features=features),
                    relevance=1.0,
                    baseline_rank=rank,
                    predictor_rank=1,
                )
                for i in range(3)
            ],
            end_time=end_time,
        ),
    )


def _session_where(change: Callable[[rpb.TrainingSession], object]) -> rpb.SubmitTrainingPairsRequest:
    request = _session()
    change(request.session)
    return request


LONG = "x" * 20_001  # one past the default inference.max_text_chars

CASES: list[tuple[str, Callable[[Any], object], list[str]]] = [
    (
        "end time in year 1",
        lambda s: s.SubmitTrainingPairs(_session(timestamp_pb2.Timestamp(seconds=-62135596800))),
        ["session.end_time"],
    ),
    (
        "end time nanos of a second",
        lambda s: s.SubmitTrainingPairs(_session(timestamp_pb2.Timestamp(seconds=1, nanos=1_000_000_000))),
        ["session.end_time"],
    ),
    (
        "negative rank",
        lambda s: s.SubmitTrainingPairs(_session(rank=-5)),
        [f"session.candidates[{i}].baseline_rank" for i in range(3)],
    ),
    (
        "infinite feature",
        lambda s: s.SubmitTrainingPairs(_session(features=(math.inf, 0.0))),
        [f"session.candidates[{i}].features" for i in range(3)],
    ),
    (
        "NaN baseline score",
        lambda s: s.Rerank(
            rpb.RerankRequest(
                tenant_id="acme", query="q", candidates=[_candidate(0), _candidate(1, math.nan)]
            )
        ),
        ["candidates[1].baseline_score"],
    ),
    (
        "infinite baseline score",
        lambda s: s.Score(
            rpb.ScoreRequest(
                tenant_id="acme", query="q", feature_names=NAMES, candidates=[_candidate(0, -math.inf)]
            )
        ),
        ["candidates[0].baseline_score"],
    ),
    (
        "a candidate id twice in a session",
        lambda s: s.SubmitTrainingPairs(
            _session_where(lambda t: setattr(t.candidates[2].candidate, "id", "m0"))
        ),
        ["session.candidates[2].id"],
    ),
    (
        "a feature name twice in a session",
        lambda s: s.SubmitTrainingPairs(_session_where(lambda t: t.feature_names.append("a"))),
        ["session.feature_names[2]"],
    ),
    (
        "a session's query too long",
        lambda s: s.SubmitTrainingPairs(_session_where(lambda t: setattr(t, "query", LONG))),
        ["session.query"],
    ),
    (
        "a candidate id twice in a rerank",
        lambda s: s.Rerank(
            rpb.RerankRequest(tenant_id="acme", query="q", candidates=[_candidate(0), _candidate(0)])
        ),
        ["candidates[1].id"],
    ),
    (
        "a candidate text too long",
        lambda s: s.Rerank(
            rpb.RerankRequest(
                tenant_id="acme",
                query="q",
                candidates=[rpb.Candidate(id="m0", text=LONG, baseline_score=0.5)],
            )
        ),
        ["candidates[0].text"],
    ),
    (
        "a feature name twice in a score",
        lambda s: s.Score(
            rpb.ScoreRequest(
                tenant_id="acme", query="q", feature_names=["a", "a"], candidates=[_candidate(0)]
            )
        ),
        ["feature_names[1]"],
    ),
    (
        "a score's query too long",
        lambda s: s.Score(
            rpb.ScoreRequest(tenant_id="acme", query=LONG, feature_names=NAMES, candidates=[_candidate(0)])
        ),
        ["query"],
    ),
    (
        "unknown model kind",
        lambda s: list(
            s.Train(rpb.TrainRequest(tenant_id="acme", models=[rpb.MODEL_KIND_RANKER, 99], force=True))
        ),
        ["models"],
    ),
]


@pytest.mark.parametrize(("name", "call", "fields"), CASES, ids=[c[0] for c in CASES])
def test_bad_ranking_input_is_invalid_argument_and_stores_nothing(
    start_sidecar: Callable[..., Any], name: str, call: Callable[[Any], object], fields: list[str]
) -> None:
    side = start_sidecar()
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))

    class Bound:
        def __getattr__(self, rpc: str) -> Callable[..., object]:
            return lambda req: getattr(stub, rpc)(req, timeout=10)

    with pytest.raises(grpc.RpcError) as err:
        call(Bound())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert error_info(err.value)[1] == fields
    status = stub.GetModelStatus(rpb.GetModelStatusRequest(tenant_id="acme"), timeout=5)
    assert (status.stored_sessions, status.stored_pairs, len(status.recent_outcomes)) == (0, 0, 0)
    # The same session, well formed, is taken: what was refused was the field named.
    stored = stub.SubmitTrainingPairs(_session(), timeout=10)
    assert (stored.duplicate, stored.stored_pairs) == (False, 3)


def test_a_session_without_candidates_is_taken_and_changes_nothing(start_sidecar: Callable[..., Any]) -> None:
    side = start_sidecar()
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))
    empty = _session_where(lambda t: t.ClearField("candidates"))
    answer = stub.SubmitTrainingPairs(empty, timeout=10)
    assert (answer.duplicate, answer.stored_pairs, answer.health.sessions, answer.training_started) == (
        False,
        0,
        0,
        False,
    )
    status = stub.GetModelStatus(rpb.GetModelStatusRequest(tenant_id="acme"), timeout=5)
    assert (status.stored_sessions, status.stored_pairs, status.health.sessions) == (0, 0, 0)
    # Its id stays free: the session with its candidates is stored under it.
    assert stub.SubmitTrainingPairs(_session(), timeout=10).stored_pairs == 3
