"""`mnemo-sidecar bench-residency`: the sidecar's memory with many tenants' fine-tuned
cross-encoders, and what bounding them (cross_encoder.max_resident) costs its Reranks.

A fresh sidecar process gets T tenants' promoted fine-tunes (one model directory, linked
into each tenant's version, its ONNX exported beforehand as a training process leaves it),
then one client calls Rerank on each tenant in turn: the worst case for a bound below T,
where every call finds its tenant's fine-tune dropped. It reports the sidecar's resident
memory after start-up, at its peak and at the end, which model answered the calls, and
their latency."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo.ranking.v1 import ranking_service_pb2_grpc as rpb_grpc
from mnemo_server.diagnostics import rss_bytes
from mnemo_server.evaluation.bench import OpStats
from mnemo_sidecar.engine import RankingEngine
from mnemo_sidecar.learning.model import ModelKind
from mnemo_sidecar.learning.registry import ModelRegistry

QUERY = "what did we decide about the release schedule"


def promote_for_tenants(data_dir: Path, model_dir: Path, tenants: int, precision: str) -> list[str]:
    """What training runs would leave: each tenant's promoted version holding `model_dir`
    (linked, not copied), and its ONNX export, in the precision fine-tunes are served in, in
    the sidecar's cache."""
    from mnemo_sidecar.crossencoder.runtime import CrossEncoderRuntime

    CrossEncoderRuntime(model_dir, data_dir / "onnx-cache", precision=precision)  # once for all
    registry = ModelRegistry(data_dir / "models")
    names = [f"t{i}" for i in range(tenants)]
    for name in names:
        version, directory = registry.new_version(name, ModelKind.CROSS_ENCODER)
        RankingEngine.fine_tuned_model_dir(directory).symlink_to(
            model_dir.resolve(), target_is_directory=True
        )
        registry.promote(name, ModelKind.CROSS_ENCODER, version, None, f"fine-tune of {name}")
    return names


def rss_mb(pid: int) -> float:
    return rss_bytes(pid) / 2**20


def rerank_in_turn(address: str, pid: int, tenants: list[str], seconds: float) -> dict[str, Any]:
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(address))
    candidates = [
        rpb.Candidate(id=f"m{i}", text=f"note {i}: the release moves to week {i}", baseline_score=1 - i / 20)
        for i in range(20)
    ]
    after_start = peak = rss_mb(pid)
    methods = {"cross_encoder": 0, "embedding_blend": 0}
    stats = OpStats()
    ends = time.monotonic() + seconds
    n = 0
    while time.monotonic() < ends:
        tenant = tenants[n % len(tenants)]
        n += 1
        started = time.perf_counter()
        try:
            answer = stub.Rerank(
                rpb.RerankRequest(tenant_id=tenant, query=QUERY, candidates=candidates), timeout=2
            )
        except grpc.RpcError as exc:
            stats.errors[exc.code().name] += 1
            continue
        stats.latencies_ms.append((time.perf_counter() - started) * 1000)
        cross = answer.method == rpb.RERANK_METHOD_CROSS_ENCODER
        methods["cross_encoder" if cross else "embedding_blend"] += 1
        if n % 10 == 0:
            peak = max(peak, rss_mb(pid))
    end = rss_mb(pid)
    calls = stats.summary(seconds)
    return {
        "rss_mb": {"after_start": round(after_start), "peak": round(max(peak, end)), "end": round(end)},
        "reranks": {
            "count": calls["count"],
            "by": methods,
            "p50_ms": calls["p50_ms"],
            "p99_ms": calls["p99_ms"],
            "max_ms": calls["max_ms"],
            "failures": calls["errors"],
        },
    }
