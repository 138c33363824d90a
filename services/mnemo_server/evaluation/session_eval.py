"""`mnemo eval locomo --train-sessions DIR`: does learning from sessions help?

1. Load the memories of both splits; evaluate DATA through StartSession (cold start: the
   baseline order).
2. Replay TRAIN's queries as sessions: StartSession with the question, EndSession marking
   the gold memories as used and every other injected memory as unused.
3. Train the ranker alone (no cross-encoder feature) and evaluate DATA through StartSession.
4. Fine-tune the cross-encoder and measure it alone (Recall with the head reranked).
5. Train the ranker again, now with the cross-encoder's scores as a feature, and evaluate.
Every training run reports its held-back promotion decision. Everything goes through the
public gRPC APIs of the two processes."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo.ranking.v1 import ranking_service_pb2_grpc as rpb_grpc
from mnemo.v1 import memory_service_pb2 as pb
from mnemo_client.client import MnemoClient
from mnemo_server.errors import FailedPrecondition
from mnemo_server.evaluation.locomo import Naming, judged, load_memories
from mnemo_server.evaluation.metrics import evaluate

POOL = 50
Say = Callable[[str], None]


@dataclass
class Phase:
    name: str
    metrics: dict[str, dict[str, float]]
    paths: dict[str, int]
    query_p50_ms: float
    run: dict[str, list[str]] = field(default_factory=dict)  # query id -> memory ids, best first


@dataclass
class SessionEvalResult:
    phases: list[Phase] = field(default_factory=list)
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    train_sessions: int = 0
    training_seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "train_sessions": self.train_sessions,
            "training_seconds": round(self.training_seconds, 1),
            "phases": {
                p.name: {"metrics": p.metrics, "paths": p.paths, "query_p50_ms": p.query_p50_ms}
                for p in self.phases
            },
            "training_outcomes": self.outcomes,
        }


def _median(values: list[float]) -> float:
    s = sorted(values)
    return round(s[len(s) // 2], 2) if s else 0.0


def run_sessions(
    client: MnemoClient, queries: Sequence[dict[str, Any]], naming: Naming, prefix: str, feedback: bool
) -> tuple[dict[str, list[str]], dict[str, int], list[float]]:
    """StartSession per query (and EndSession with gold feedback when `feedback`)."""
    run: dict[str, list[str]] = {}
    paths: dict[str, int] = {}
    timings: list[float] = []
    for q in queries:
        sid = naming.session_id(prefix, q["query_id"])
        t0 = time.perf_counter()
        resp = client.call(
            client.memory.StartSession,
            pb.StartSessionRequest(
                session_id=sid,
                project_id=naming.conversation(q["conv_id"]),
                context=q["question"],
                max_memories=POOL,
                token_budget=100_000,
                request_id=sid,
            ),
            timeout_s=60,
        )
        timings.append((time.perf_counter() - t0) * 1000.0)
        name = pb.RankingPath.Name(resp.ranking.path).removeprefix("RANKING_PATH_").lower()
        paths[name] = paths.get(name, 0) + 1
        ranked = naming.dataset_ids([m.memory.external_id for m in resp.memories])
        run[q["query_id"]] = ranked
        if feedback:
            gold = set(q["gold_memory_ids"])
            client.call(
                client.memory.EndSession,
                pb.EndSessionRequest(
                    session_id=sid,
                    request_id=naming.request_id("end", sid),
                    feedback=[
                        pb.MemoryFeedback(
                            memory_id=m.memory.id,
                            relevance=1.0 if naming.dataset_id(m.memory.external_id) in gold else 0.0,
                        )
                        for m in resp.memories
                    ],
                ),
                timeout_s=60,
            )
    return run, paths, timings


def run_reranked_recall(
    client: MnemoClient, queries: Sequence[dict[str, Any]], naming: Naming
) -> tuple[dict[str, list[str]], dict[str, int], list[float]]:
    run: dict[str, list[str]] = {}
    outcome: dict[str, int] = {}
    timings: list[float] = []
    for q in queries:
        req = pb.RecallRequest(
            query=q["question"], top_k=POOL, options=pb.RecallOptions(rerank=True, rerank_deadline_ms=30_000)
        )
        req.filter.scopes.append(naming.scope(q["conv_id"]))
        t0 = time.perf_counter()
        resp = client.call(client.memory.Recall, req, timeout_s=60)
        timings.append((time.perf_counter() - t0) * 1000.0)
        key = "reranked" if resp.reranked else f"fallback:{resp.rerank_fallback_reason}"
        outcome[key] = outcome.get(key, 0) + 1
        run[q["query_id"]] = naming.dataset_ids([h.memory.external_id for h in resp.hits])
    return run, outcome, timings


class SidecarControl:
    def __init__(self, address: str, tenant: str):
        self.stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(address))
        self.tenant = tenant

    def status(self) -> rpb.GetModelStatusResponse:
        resp: rpb.GetModelStatusResponse = self.stub.GetModelStatus(
            rpb.GetModelStatusRequest(tenant_id=self.tenant), timeout=30
        )
        return resp

    def train(self, models: Sequence[rpb.ModelKind], say: Say) -> list[dict[str, Any]]:
        from google.protobuf import json_format

        outcomes = []
        request = rpb.TrainRequest(tenant_id=self.tenant, models=list(models), force=True)
        try:
            for ev in self.stub.Train(request, timeout=3600):
                if ev.HasField("outcome"):
                    outcomes.append(json_format.MessageToDict(ev.outcome, preserving_proto_field_name=True))
                    kind = rpb.ModelKind.Name(ev.model)
                    say(f"  {kind}: {ev.outcome.reason} ({ev.outcome.train_seconds:.0f} s)")
                elif ev.stage != "done" and ev.progress in (0.0, 1.0):
                    say(f"  {rpb.ModelKind.Name(ev.model)}: {ev.stage} {ev.message}")
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            # No training session used a memory (their gold turns are not in the split's
            # memories, say): one line, not the stream's traceback (probe).
            raise FailedPrecondition(
                f"the sidecar would not train: {err.details()}",
                reason="NOT_ENOUGH_SESSIONS",
            ) from None
        return outcomes


def evaluate_with_training(
    client: MnemoClient,
    sidecar: SidecarControl,
    data_rows: Sequence[dict[str, Any]],
    data_queries: Sequence[dict[str, Any]],
    train_rows: Sequence[dict[str, Any]],
    train_queries: Sequence[dict[str, Any]],
    say: Say,
    naming: Naming,
) -> SessionEvalResult:
    result = SessionEvalResult(train_sessions=len(train_queries))
    # A conversation in both splits is loaded once.
    rows = list({(r["conv_id"], r["memory_id"]): r for r in [*data_rows, *train_rows]}.values())
    say(f"loading {len(rows)} memories")
    load_memories(client, rows, naming)
    gold = judged(data_queries)

    def phase(name: str, run_and_paths: tuple[dict[str, list[str]], dict[str, int], list[float]]) -> None:
        run, paths, timings = run_and_paths
        p = Phase(name, evaluate(gold, run), paths, _median(timings), run)
        result.phases.append(p)
        overall = p.metrics["overall"]
        say(f"{name}: NDCG@10 {overall['NDCG@10']:.4f}  R@10 {overall['Recall@10']:.4f}  paths {paths}")

    phase("untrained", run_sessions(client, data_queries, naming, "untrained", feedback=False))
    say(f"replaying {len(train_queries)} training sessions")
    run_sessions(client, train_queries, naming, "train", feedback=True)
    # A query of a conversation with no memories injects nothing, so its session sends the
    # sidecar no pairs: waiting for it waited 10 minutes, then failed (probe).
    with_memories = {r["conv_id"] for r in rows}
    sent = sum(1 for q in train_queries if q["conv_id"] in with_memories)
    deadline = time.monotonic() + 600
    while sidecar.status().stored_sessions < sent:
        if time.monotonic() > deadline:
            raise TimeoutError("training sessions did not reach the sidecar in 10 minutes")
        time.sleep(0.5)
    started = time.perf_counter()
    say("training the ranker (no cross-encoder feature)")
    result.outcomes += sidecar.train([rpb.MODEL_KIND_RANKER], say)
    phase("ranker", run_sessions(client, data_queries, naming, "ranker", feedback=False))
    say("fine-tuning the cross-encoder")
    result.outcomes += sidecar.train([rpb.MODEL_KIND_CROSS_ENCODER], say)
    phase("recall+cross_encoder_rerank", run_reranked_recall(client, data_queries, naming))
    say("training the ranker with the cross-encoder feature")
    result.outcomes += sidecar.train([rpb.MODEL_KIND_RANKER], say)
    result.training_seconds = time.perf_counter() - started
    phase("ranker+cross_encoder", run_sessions(client, data_queries, naming, "trained", feedback=False))
    return result
