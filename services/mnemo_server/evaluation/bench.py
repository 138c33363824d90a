"""`mnemo bench`: a load test over gRPC (grpc.aio), from the outside, like real clients.

Phase 1 loads N synthetic memories into one tenant (batched, concurrent) and measures how
long until all are searchable. Phase 2 runs a mixed workload at concurrency C for S
seconds and reports per-operation throughput, latency percentiles and errors by status
code, plus how long freshly created memories take to become searchable under that load.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc import aio
from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo.v1 import memory_service_pb2_grpc as pb_grpc

from mnemo_server.evaluation.synth import memory_text, query_text

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class BenchConfig:
    memories: int = 100_000
    concurrency: int = 8
    duration_s: float = 60.0
    load_concurrency: int = 4
    load_batch: int = 250
    scopes: int = 20
    top_k: int = 10
    seed: int = 7
    # Share of each operation in the mixed phase.
    mix: tuple[tuple[str, float], ...] = (("Recall", 0.7), ("CreateMemory", 0.2), ("ListMemories", 0.1))
    # Every n-th create in the mixed phase is watched until searchable.
    watch_every: int = 5


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


@dataclass
class OpStats:
    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def summary(self, seconds: float) -> dict[str, Any]:
        lat = sorted(self.latencies_ms)
        return {
            "count": len(lat),
            "throughput_per_s": round(len(lat) / seconds, 1) if seconds else 0.0,
            "p50_ms": round(percentile(lat, 0.50), 2),
            "p95_ms": round(percentile(lat, 0.95), 2),
            "p99_ms": round(percentile(lat, 0.99), 2),
            "max_ms": round(lat[-1], 2) if lat else 0.0,
            "errors": dict(self.errors),
        }


def _scope(i: int) -> common_pb2.Scope:
    return common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id=f"bench-{i}")


class Bench:
    def __init__(self, address: str, api_key: str | None, cfg: BenchConfig):
        self.address = address
        self.md: Metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.counter = 0

    def _new_memory(self) -> memory_pb2.Memory:
        self.counter += 1
        return memory_pb2.Memory(
            content=memory_text(self.rng, self.counter),
            type=(common_pb2.MEMORY_TYPE_EPISODIC, common_pb2.MEMORY_TYPE_SEMANTIC)[self.counter % 2],
            category=f"cat{self.counter % 12}",
            scope=_scope(self.counter % self.cfg.scopes),
        )

    async def status(self, stub: pb_grpc.MemoryServiceAsyncStub) -> pb.GetStatusResponse:
        resp: pb.GetStatusResponse = await stub.GetStatus(pb.GetStatusRequest(), metadata=self.md, timeout=30)
        return resp

    # --- phase 1 -----------------------------------------------------------------------

    async def load(
        self, stub: pb_grpc.MemoryServiceAsyncStub, progress: Callable[[int, int], None] | None = None
    ) -> dict[str, float]:
        cfg = self.cfg
        batches = [
            [self._new_memory() for _ in range(min(cfg.load_batch, cfg.memories - start))]
            for start in range(0, cfg.memories, cfg.load_batch)
        ]
        queue: asyncio.Queue[list[memory_pb2.Memory]] = asyncio.Queue()
        for b in batches:
            queue.put_nowait(b)
        done = 0
        started = time.perf_counter()

        async def worker() -> None:
            nonlocal done
            while not queue.empty():
                batch = queue.get_nowait()
                req = pb.BatchCreateMemoriesRequest(
                    requests=[pb.CreateMemoryRequest(memory=m) for m in batch],
                    request_id=f"bench-load-{self.cfg.seed}-{id(batch)}",
                )
                await stub.BatchCreateMemories(req, metadata=self.md, timeout=300)
                done += len(batch)
                if progress:
                    progress(done, cfg.memories)

        await asyncio.gather(*(worker() for _ in range(cfg.load_concurrency)))
        acked = time.perf_counter() - started
        while (await self.status(stub)).pending_index_count:
            await asyncio.sleep(0.1)
        searchable = time.perf_counter() - started
        return {
            "seconds": round(acked, 2),
            "memories_per_s": round(cfg.memories / acked, 1),
            "searchable_after_s": round(searchable, 2),
        }

    # --- phase 2 -----------------------------------------------------------------------

    async def mixed(
        self,
        stub: pb_grpc.MemoryServiceAsyncStub,
        extra_ops: dict[str, Callable[[], Awaitable[Any]]] | None = None,
    ) -> dict[str, Any]:
        cfg = self.cfg
        ops: dict[str, Callable[[], Awaitable[Any]]] = {
            "Recall": lambda: stub.Recall(
                pb.RecallRequest(query=query_text(self.rng), top_k=cfg.top_k), metadata=self.md, timeout=10
            ),
            "CreateMemory": self._create(stub),
            "ListMemories": lambda: stub.ListMemories(
                pb.ListMemoriesRequest(
                    page_size=20,
                    filter=memory_pb2.MemoryFilter(scopes=[_scope(self.rng.randrange(cfg.scopes))]),
                ),
                metadata=self.md,
                timeout=10,
            ),
            **(extra_ops or {}),
        }
        names = [n for n, _ in cfg.mix]
        weights = [w for _, w in cfg.mix]
        stats = {n: OpStats() for n in names}
        self._lags: list[float] = []
        self._watchers: list[asyncio.Task[None]] = []
        rss_peak = 0
        deadline = time.perf_counter() + cfg.duration_s

        async def worker() -> None:
            while time.perf_counter() < deadline:
                name = self.rng.choices(names, weights)[0]
                t0 = time.perf_counter()
                try:
                    await ops[name]()
                    stats[name].latencies_ms.append((time.perf_counter() - t0) * 1000.0)
                except grpc.RpcError as err:
                    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
                    stats[name].errors[code.name] += 1

        async def sample_rss() -> None:
            nonlocal rss_peak
            while time.perf_counter() < deadline:
                rss_peak = max(rss_peak, (await self.status(stub)).process_rss_bytes)
                await asyncio.sleep(1.0)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(cfg.concurrency)), sample_rss())
        elapsed = time.perf_counter() - started
        await asyncio.gather(*self._watchers, return_exceptions=True)
        lags = sorted(self._lags)
        return {
            "seconds": round(elapsed, 2),
            "ops": {n: s.summary(elapsed) for n, s in stats.items()},
            "create_searchable": {
                "samples": len(lags),
                "p50_s": round(percentile(lags, 0.5), 3),
                "p99_s": round(percentile(lags, 0.99), 3),
                "max_s": round(lags[-1], 3) if lags else 0.0,
            },
            "rss_peak_bytes": rss_peak,
        }

    def _create(self, stub: pb_grpc.MemoryServiceAsyncStub) -> Callable[[], Awaitable[Any]]:
        async def create() -> None:
            resp = await stub.CreateMemory(
                pb.CreateMemoryRequest(memory=self._new_memory()), metadata=self.md, timeout=10
            )
            if self.counter % self.cfg.watch_every == 0:
                self._watchers.append(
                    asyncio.create_task(self._watch(stub, resp.memory.id, time.perf_counter()))
                )

        return create

    async def _watch(self, stub: pb_grpc.MemoryServiceAsyncStub, memory_id: str, acked_at: float) -> None:
        """Time from acknowledgement until the memory is searchable."""
        while time.perf_counter() - acked_at < 60:
            m = await stub.GetMemory(pb.GetMemoryRequest(id=memory_id), metadata=self.md, timeout=10)
            if m.memory.index_state == memory_pb2.INDEX_STATE_INDEXED:
                self._lags.append(time.perf_counter() - acked_at)
                return
            await asyncio.sleep(0.05)
        self._lags.append(float("inf"))


async def run_bench(
    address: str, api_key: str | None, cfg: BenchConfig, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    async with aio.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 32 << 20)]
    ) as channel:
        stub = pb_grpc.MemoryServiceStub(channel)
        load = await Bench(address, api_key, cfg).load(stub, progress)
        bench = Bench(address, api_key, BenchConfig(**{**cfg.__dict__, "seed": cfg.seed + 1}))
        mixed = await bench.mixed(stub)
        status = await bench.status(stub)
    live = status.memory_count
    return {
        "memories": cfg.memories,
        "concurrency": cfg.concurrency,
        "duration_s": cfg.duration_s,
        "load": load,
        "ops": mixed["ops"],
        "create_searchable": mixed["create_searchable"],
        "server_rss_mb": round(max(mixed["rss_peak_bytes"], status.process_rss_bytes) / 2**20, 1),
        "data_mb": round(status.data_bytes / 2**20, 1),
        "disk_mb_per_100k": round(status.data_bytes / 2**20 * 100_000 / live, 1) if live else 0.0,
        "memories_after": live,
    }
