"""`mnemo-sidecar bench-score`: Score's latency under its deadline, idle and while the
sidecar trains.

Score answers inside StartSession's deadline; a background training run is the sidecar's
normal state on a busy tenant, and its cost grows with the stored sessions (every run reads
them all). The command fills a fresh sidecar's pair store with N synthetic sessions, starts
the sidecar as its own process, trains a ranker (so Score runs a model), then has C clients
call Score for a while with the deadline, idle, and again while a Train of the ranker runs.
It reports both phases: count, p50, p99, max and the calls that failed, by status."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo.ranking.v1 import ranking_service_pb2_grpc as rpb_grpc
from mnemo_server.evaluation.bench import OpStats, train_sidecar
from mnemo_sidecar.learning.model import Candidate, FeedbackCandidate, FeedbackSession
from mnemo_sidecar.learning.pair_store import PairStore

FEATURES = ("baseline_score", "signal", "noise")
TENANT = "bench"
_WORDS = ("release", "billing", "staging", "mobile", "database", "deploy", "rollback", "schedule", "owner")


def synthetic_session(i: int, rng: random.Random, candidates: int) -> FeedbackSession:
    """A session whose used memory `signal` points at (the baseline mostly does not)."""
    used = rng.randrange(candidates)
    rows = []
    for j in range(candidates):
        base = rng.random()
        words = " ".join(rng.choice(_WORDS) for _ in range(12))
        signal = (1.0 if j == used else 0.0) + 0.3 * rng.random()
        rows.append(
            FeedbackCandidate(
                Candidate(f"m{i}-{j}", f"memory {j}: {words}", base, (base, signal, rng.random())),
                1.0 if j == used else 0.0,
                0,
            )
        )
    ranked = sorted(rows, key=lambda c: -c.candidate.baseline_score)
    with_ranks = tuple(FeedbackCandidate(c.candidate, c.relevance, ranked.index(c) + 1) for c in rows)
    return FeedbackSession(f"s{i}", f"who owns the {rng.choice(_WORDS)}?", FEATURES, with_ranks, i)


def fill_pair_store(path: Path, sessions: int, candidates: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    store = PairStore(path)
    try:
        for i in range(sessions):
            store.add_session(TENANT, synthetic_session(i, rng, candidates), None, None, None)
    finally:
        store.close()


def score_requests(n: int, candidates: int, seed: int = 1) -> list[rpb.ScoreRequest]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        s = synthetic_session(i, rng, candidates)
        out.append(
            rpb.ScoreRequest(
                tenant_id=TENANT,
                session_id=f"q{i}",
                query=s.query,
                feature_names=list(FEATURES),
                candidates=[
                    rpb.Candidate(
                        id=c.candidate.id,
                        text=c.candidate.text,
                        baseline_score=c.candidate.baseline_score,
                        features=c.candidate.features,
                    )
                    for c in s.candidates
                ],
            )
        )
    return out


def phase_summary(stats: OpStats, seconds: float) -> dict[str, Any]:
    """The bench's per-operation figures for one phase, failed calls counted in `count`."""
    s = stats.summary(seconds)
    return {
        "count": s["count"] + sum(stats.errors.values()),
        "p50_ms": s["p50_ms"],
        "p99_ms": s["p99_ms"],
        "max_ms": s["max_ms"],
        "failures": s["errors"],
    }


def call_score_while(
    stub: rpb_grpc.RankingServiceStub,
    requests: list[rpb.ScoreRequest],
    clients: int,
    deadline_s: float,
    running: Callable[[], bool],
    pause_s: float = 0.01,
) -> OpStats:
    """`clients` threads call Score (each with `deadline_s`), a short pause between calls,
    for as long as running() says; every answer's latency, every failure by status."""
    stats = OpStats()
    lock = threading.Lock()

    def client(n: int) -> None:
        i = n
        while running():
            started = time.perf_counter()
            try:
                stub.Score(requests[i % len(requests)], timeout=deadline_s)
                with lock:
                    stats.latencies_ms.append((time.perf_counter() - started) * 1000.0)
            except grpc.RpcError as err:
                with lock:
                    stats.errors[err.code().name] += 1
            i += clients
            time.sleep(pause_s)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return stats


def train_ranker(address: str) -> dict[str, Any]:
    """A forced Train of the ranker (the bench's call): its outcome and how long it took."""
    started = time.perf_counter()
    [outcome] = asyncio.run(train_sidecar(address, TENANT, [rpb.MODEL_KIND_RANKER]))
    return {
        "promoted": bool(outcome.get("promoted")),
        "reason": outcome.get("reason", ""),
        "seconds": round(time.perf_counter() - started, 1),
    }


def measure(address: str, clients: int, deadline_ms: float, idle_s: float, candidates: int) -> dict[str, Any]:
    """Against a sidecar whose store holds the synthetic sessions: a first ranker, then the
    idle phase, then the phase during a second training."""
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(address))
    first = train_ranker(address)
    requests = score_requests(200, candidates)
    deadline_s = deadline_ms / 1000.0
    until = time.monotonic() + idle_s
    idle = call_score_while(stub, requests, clients, deadline_s, lambda: time.monotonic() < until)
    training_done = threading.Event()
    second: dict[str, Any] = {}

    def train() -> None:
        second.update(train_ranker(address))
        training_done.set()

    trainer = threading.Thread(target=train)
    trainer.start()
    during = call_score_while(stub, requests, clients, deadline_s, lambda: not training_done.is_set())
    trainer.join()
    return {
        "clients": clients,
        "deadline_ms": deadline_ms,
        "first_training": first,
        "idle": phase_summary(idle, idle_s),
        "while_training": phase_summary(during, second["seconds"]),
        "training": second,
    }
