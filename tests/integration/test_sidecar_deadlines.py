"""Calls past their deadline (a real sidecar on port 0, real models): they stop within a
step of work rather than holding an inference slot that live calls wait for."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo.ranking.v1 import ranking_service_pb2_grpc as rpb_grpc
from tests.integration.test_sidecar_models import _promote_a_ranker
from tests.unit.test_sidecar_learning import NAMES

WORDS = ("Alice", "moved", "to", "Paris", "last", "spring", "with", "friends", "and", "the", "Louvre")


def long_texts(n: int, seed: int, chars: int = 19_000) -> list[str]:
    """Texts near inference.max_text_chars (20,000), every one different."""
    rng = random.Random(seed)
    return [
        " ".join(f"{rng.choice(WORDS)}{rng.randint(0, 10**6)}" for _ in range(chars // 8))[:chars]
        for _ in range(n)
    ]


def _code(call: Callable[[], Any]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as err:
        code: grpc.StatusCode = err.code()
        return code
    return grpc.StatusCode.OK


def _at_once(method: Callable[..., Any], requests: list[Any], timeout: float) -> list[grpc.StatusCode]:
    """The codes of the requests sent at once, each from a thread of its own."""
    codes: list[grpc.StatusCode] = []
    threads = [
        threading.Thread(target=lambda r=r: codes.append(_code(lambda: method(r, timeout=timeout))))
        for r in requests
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def _await_calls(stub: rpb_grpc.RankingServiceStub, rpc: str, calls: int) -> rpb.LatencyStats:
    """The rpc's figures once `calls` of them have ended in the sidecar (a call whose caller
    gave up may still be working there)."""
    give_up = time.monotonic() + 10
    while True:
        stats: rpb.LatencyStats = stub.GetModelStatus(
            rpb.GetModelStatusRequest(tenant_id="acme"), timeout=10
        ).latency[rpc]
        if stats.calls >= calls or time.monotonic() > give_up:
            return stats
        time.sleep(0.05)


def test_reranks_past_their_deadline_stop_within_a_step_and_leave_the_slots_to_live_ones(
    start_sidecar: Callable[..., Any],
) -> None:
    """Two Reranks of 100 long texts with 30 ms deadlines hold both inference slots: they
    used to embed a whole batch of 16 texts (~1 s) before looking at the deadline again, and
    a tiny live Rerank sent after them failed DEADLINE_EXCEEDED waiting for a slot."""
    side = start_sidecar()
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))

    def rerank(candidates: list[rpb.Candidate], timeout: float) -> rpb.RerankResponse:
        request = rpb.RerankRequest(tenant_id="acme", query="when did she move?", candidates=candidates)
        answer: rpb.RerankResponse = stub.Rerank(request, timeout=timeout)
        return answer

    short = [rpb.Candidate(id="a", text="a short memory", baseline_score=0.5)]
    rerank(short, 10)  # its text is embedded and cached now
    cached = len(side.engine.blend._vectors)
    hogs = [
        [rpb.Candidate(id=f"m{i}", text=t, baseline_score=0.5) for i, t in enumerate(long_texts(100, seed))]
        for seed in (1, 2)
    ]
    codes: list[grpc.StatusCode] = []
    threads = [
        threading.Thread(target=lambda h=h: codes.append(_code(lambda: rerank(h, 0.03)))) for h in hogs
    ]
    for t in threads:
        t.start()
    time.sleep(0.05)  # both expired by now
    live = rerank(short, 0.5)
    for t in threads:
        t.join()
    assert len(live.scores) == 1
    assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * 2
    _await_calls(stub, "Rerank", 4)
    # Each expired call embedded at most the one text its deadline left time for.
    assert len(side.engine.blend._vectors) - cached <= 2


def test_calls_whose_callers_deadline_passed_are_counted_as_deadline_exceeded(
    start_sidecar: Callable[..., Any], tmp_path: Path
) -> None:
    """Reranks and Scores of long texts with 30 ms deadlines: every caller sees
    DEADLINE_EXCEEDED, and GetModelStatus counts each of them so, none among the latencies.
    Most used to end on finding their caller gone (Cancelled) and were booked as answered
    calls with their whole running time."""
    _promote_a_ranker(tmp_path / "side")
    side = start_sidecar(data_dir=tmp_path / "side")
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))

    def request(rpc: str, texts: list[str]) -> Any:
        candidates = [
            rpb.Candidate(id=f"m{i}", text=t, baseline_score=0.5, features=(0.5, 0.0, 0.1))
            for i, t in enumerate(texts)
        ]
        if rpc == "Rerank":
            return rpb.RerankRequest(tenant_id="acme", query="when?", candidates=candidates)
        return rpb.ScoreRequest(tenant_id="acme", query="when?", feature_names=NAMES, candidates=candidates)

    late = 3
    for rpc in ("Rerank", "Score"):
        method = getattr(stub, rpc)
        method(request(rpc, ["a short memory"]), timeout=10)  # answered
        # Made before any is sent: the sidecar runs in this process, and its calls should
        # not wait for the test's Python.
        requests = [request(rpc, long_texts(100, seed)) for seed in range(late)]
        assert _at_once(method, requests, 0.03) == [grpc.StatusCode.DEADLINE_EXCEEDED] * late
        stats = _await_calls(stub, rpc, 1 + late)
        # (A call whose deadline passed before gRPC handed it to the sidecar is not its call.)
        assert stats.calls >= 2 and stats.deadline_exceeded == stats.calls - 1 and stats.shed == 0, rpc
        assert len(side.stats.snapshot()[rpc].latencies_ms) == 1, rpc
