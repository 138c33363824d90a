"""`mnemo bench-tenants`: a server with many tenants and a bound on those whose search indices
stay in memory (index.max_resident_*, index/residency.py), measured from the outside.

1. Create T tenants with an API key each and load M synthetic memories into each.
2. Restart the server: its time to serving and RSS (start-up loads only the most recently
   written tenants that fit the bounds).
3. Recall on tenants picked at random, a few at a time. Each Recall asks for one of the
   tenant's own memories by its text; GetStatus says beforehand whether the tenant's indices
   were loaded, so the latencies split into tenants kept and tenants whose indices the
   Recall loaded first (an UNAVAILABLE answer, the load outlasting index.load_wait_s, is
   retried with backoff as the shipped clients do, and the Recall timed to its answer). The
   share of Recalls whose top hit is the memory asked for shows the loaded indices answer as
   the kept ones do.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc import aio

from mnemo.v1 import admin_service_pb2 as admin_pb
from mnemo.v1 import admin_service_pb2_grpc as admin_grpc
from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo.v1 import memory_service_pb2_grpc as pb_grpc
from mnemo_server.evaluation.bench import Metadata, OpStats
from mnemo_server.evaluation.synth import memory_text


@dataclass(frozen=True)
class TenantsBenchConfig:
    tenants: int = 200
    memories_per_tenant: int = 300
    recalls: int = 400
    concurrency: int = 4
    load_concurrency: int = 4
    batch: int = 250
    # Memories per tenant kept to be asked for by the Recalls.
    probes_per_tenant: int = 5
    seed: int = 11


@dataclass(frozen=True)
class Probe:
    memory_id: str
    content: str


@dataclass
class Tenants:
    """The tenants made: each one's bearer metadata and the memories the Recalls ask for."""

    metadata: dict[str, Metadata] = field(default_factory=dict)
    probes: dict[str, list[Probe]] = field(default_factory=dict)


def _bearer(key: str) -> Metadata:
    return (("authorization", f"Bearer {key}"),)


def tenant_name(i: int) -> str:
    return f"bench-t{i:05d}"


async def _gather_bounded(jobs: list[Callable[[], Awaitable[None]]], concurrency: int) -> None:
    queue = list(reversed(jobs))

    async def worker() -> None:
        while queue:
            await queue.pop()()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def create_tenants(channel: aio.Channel, admin_key: str, cfg: TenantsBenchConfig) -> Tenants:
    admin = admin_grpc.AdminServiceStub(channel)
    md = _bearer(admin_key)
    made = Tenants()
    for i in range(cfg.tenants):
        name = tenant_name(i)
        await admin.CreateTenant(
            admin_pb.CreateTenantRequest(tenant=admin_pb.Tenant(id=name)), metadata=md, timeout=30
        )
        key = await admin.CreateApiKey(
            admin_pb.CreateApiKeyRequest(tenant_id=name, description="bench-tenants"), metadata=md, timeout=30
        )
        made.metadata[name] = _bearer(key.secret)
    return made


async def load(
    channel: aio.Channel,
    tenants: Tenants,
    cfg: TenantsBenchConfig,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Every tenant's memories, in batches, a few tenants at a time; then wait until all are
    searchable."""
    stub = pb_grpc.MemoryServiceStub(channel)
    rng = random.Random(cfg.seed)
    total = cfg.tenants * cfg.memories_per_tenant
    done = 0
    started = time.perf_counter()

    def job(tenant: str, texts: list[str], keep: set[int]) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            nonlocal done
            for start in range(0, len(texts), cfg.batch):
                part = texts[start : start + cfg.batch]
                reqs = [pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=t)) for t in part]
                res = await stub.BatchCreateMemories(
                    pb.BatchCreateMemoriesRequest(requests=reqs),
                    metadata=tenants.metadata[tenant],
                    timeout=120,
                )
                for n, r in enumerate(res.results, start):
                    if n in keep:
                        tenants.probes[tenant].append(Probe(r.memory.id, r.memory.content))
                done += len(part)
                if progress:
                    progress(done, total)

        return run

    jobs = []
    for i, tenant in enumerate(tenants.metadata):
        texts = [memory_text(rng, i * cfg.memories_per_tenant + n) for n in range(cfg.memories_per_tenant)]
        keep = set(rng.sample(range(len(texts)), min(cfg.probes_per_tenant, len(texts))))
        tenants.probes[tenant] = []
        jobs.append(job(tenant, texts, keep))
    await _gather_bounded(jobs, cfg.load_concurrency)
    acknowledged = time.perf_counter() - started
    for md in tenants.metadata.values():
        while (await stub.GetStatus(pb.GetStatusRequest(), metadata=md, timeout=30)).pending_index_count:
            await asyncio.sleep(0.2)
    return {
        "memories": total,
        "seconds": round(acknowledged, 2),
        "memories_per_s": round(total / acknowledged, 1) if acknowledged else 0.0,
        "searchable_after_s": round(time.perf_counter() - started, 2),
    }


async def status(channel: aio.Channel, md: Metadata) -> pb.GetStatusResponse:
    return await pb_grpc.MemoryServiceStub(channel).GetStatus(pb.GetStatusRequest(), metadata=md, timeout=30)


def residency(s: pb.GetStatusResponse) -> dict[str, Any]:
    r = s.index_residency
    return {
        "tenants": r.tenants,
        "rows": r.rows,
        "max_tenants": r.max_tenants,
        "max_rows": r.max_rows,
        "loads": r.loads,
        "drops": r.drops,
    }


async def recalls(channel: aio.Channel, tenants: Tenants, cfg: TenantsBenchConfig) -> dict[str, Any]:
    """Recalls on random tenants; latencies split by whether the tenant was loaded before."""
    stub = pb_grpc.MemoryServiceStub(channel)
    rng = random.Random(cfg.seed + 1)
    kept, loading = OpStats(), OpStats()
    found = 0
    peak_rss = 0
    retries = {True: 0, False: 0}  # UNAVAILABLE answers retried, by whether the tenant was kept
    names = list(tenants.probes)

    def job() -> Callable[[], Awaitable[None]]:
        tenant = rng.choice(names)
        probe = rng.choice(tenants.probes[tenant])

        async def run() -> None:
            nonlocal found, peak_rss
            md = tenants.metadata[tenant]
            before = await stub.GetStatus(pb.GetStatusRequest(), metadata=md, timeout=30)
            peak_rss = max(peak_rss, before.process_rss_bytes)
            stats = kept if before.index_residency.tenant_loaded else loading
            started = time.perf_counter()
            backoff = 0.1
            while True:
                try:
                    res = await stub.Recall(
                        pb.RecallRequest(query=probe.content, top_k=5), metadata=md, timeout=60
                    )
                    break
                except grpc.RpcError as err:
                    # The index still loading after index.load_wait_s: retried with backoff,
                    # as the shipped clients do, and timed to the answer.
                    if err.code() == grpc.StatusCode.UNAVAILABLE and time.perf_counter() - started < 60:
                        retries[stats is kept] += 1
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, 2.0)
                        continue
                    stats.errors[err.code().name] += 1
                    return
            stats.latencies_ms.append((time.perf_counter() - started) * 1000.0)
            found += bool(res.hits) and res.hits[0].memory.id == probe.memory_id

        return run

    started = time.perf_counter()
    await _gather_bounded([job() for _ in range(cfg.recalls)], cfg.concurrency)
    seconds = time.perf_counter() - started
    answered = len(kept.latencies_ms) + len(loading.latencies_ms)
    return {
        "seconds": round(seconds, 2),
        "kept": {**kept.summary(seconds), "retried_unavailable": retries[True]},
        "loading": {**loading.summary(seconds), "retried_unavailable": retries[False]},
        "top_hit_is_the_memory_asked": round(found / answered, 4) if answered else 0.0,
        "rss_peak_sampled_mb": round(peak_rss / 2**20, 1),
    }
