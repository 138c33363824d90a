"""`mnemo bench`: a load test over gRPC (grpc.aio), from the outside, like real clients.

1. Load N synthetic memories into one tenant (batched, concurrent); time until searchable.
2. Optionally replay synthetic sessions with feedback and let the sidecar train, so the
   session-start path runs the learned ranker.
3. A mixed workload (Recall, CreateMemory, ListMemories, StartSession + EndSession) at
   concurrency C for S seconds: per-operation throughput, p50/p95/p99/max, errors by status
   code, how long fresh memories take to become searchable, and which path ordered each
   session (model, baseline, fallback and why).
4. When the bench started the sidecar itself, the same workload again while the sidecar
   trains both models (with step 2's sessions), then with the sidecar stopped (SIGSTOP) and
   then killed: StartSession must stay within its deadline and no call may fail because of
   the sidecar.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
from grpc import aio

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo.ranking.v1 import ranking_service_pb2_grpc as rpb_grpc
from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo.v1 import memory_service_pb2_grpc as pb_grpc
from mnemo_server.evaluation.synth import fresh_query_text, memory_text, query_text
from mnemo_server.latency_histogram import quantile
from mnemo_server.launcher import LaunchedProcess

Metadata = tuple[tuple[str, str], ...]
# A follow-up call an operation leaves to make (a session's end), timed as its own operation.
FollowUp = Callable[[], Awaitable[None]]
# One operation of the mix; it may hand back a follow-up.
Op = Callable[[], Awaitable[FollowUp | None]]


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
    mix: tuple[tuple[str, float], ...] = (
        ("Recall", 0.55),
        ("CreateMemory", 0.2),
        ("ListMemories", 0.1),
        ("StartSession", 0.15),
    )
    # Every n-th create in the mixed phase is watched until searchable.
    watch_every: int = 5
    # Every n-th session is ended with feedback (EndSession, measured too).
    end_every: int = 3
    # Synthetic sessions with feedback replayed before the workload (0: none).
    train_sessions: int = 60
    # The server's StartSession budget, reported with the scenarios.
    session_deadline_ms: float = 120.0
    # Recall queries and session contexts that never repeat. Off, they come from ~2,700
    # templates and ~80% of a 60 s run's hit the server's query-embedding cache.
    fresh_queries: bool = False
    # The training run of the "sidecar_training" phase fine-tunes the cross-encoder too, as a
    # background run does from time to time (off: the ranker alone, seconds instead of minutes).
    fine_tune_during_mix: bool = True


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


_SUBJECT = re.compile(
    r"(the [a-z-]+ (?:service|cluster|app|pipeline|gateway|database|runners|model|api|flow|"
    r"dashboard|worker|config|job|exporter))",
    re.I,
)


def _is_decision_about(content: str, subject: str) -> bool:
    text = content.lower()
    return subject in text and "decision:" in text


class Bench:
    def __init__(self, api_key: str | None, cfg: BenchConfig):
        self.md: Metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        # Request and session ids must not collide with an earlier run against the same
        # server, nor must the memories' texts: seeded, they would repeat, and a second run's
        # creates (a mix with --memories 0 on a loaded store) would all be answered as
        # duplicates of the first's, a lookup instead of a write. The run id is in each
        # memory's ticket.
        self.run_id = os.urandom(4).hex()
        self.counter = 0
        self.sessions = 0
        self._lags: list[float] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._probes = 0  # GetMemory calls of the watchers (not in the ops table)
        self.fallbacks: Counter[str] = Counter()
        self.deduplicated = 0  # the mixed phase's creates answered with an existing memory

    def _new_memory(self) -> memory_pb2.Memory:
        self.counter += 1
        return memory_pb2.Memory(
            content=memory_text(self.rng, self.counter, self.run_id),
            type=(common_pb2.MEMORY_TYPE_EPISODIC, common_pb2.MEMORY_TYPE_SEMANTIC)[self.counter % 2],
            category=f"cat{self.counter % 12}",
            scope=_scope(self.counter % self.cfg.scopes),
        )

    async def outbox_delivered(self, stub: pb_grpc.MemoryServiceAsyncStub, timeout_s: float = 60.0) -> None:
        """Wait until the server's outbox has handed every session's feedback to the sidecar
        (training before that would miss pairs); a fixed sleep raced a slow delivery."""
        deadline = time.monotonic() + timeout_s
        while (await self.status(stub)).feedback_outbox_pending and time.monotonic() < deadline:
            await asyncio.sleep(0.2)

    async def status(self, stub: pb_grpc.MemoryServiceAsyncStub) -> pb.GetStatusResponse:
        resp: pb.GetStatusResponse = await stub.GetStatus(pb.GetStatusRequest(), metadata=self.md, timeout=30)
        return resp

    # --- phase 1: load -----------------------------------------------------------------

    async def load(
        self, stub: pb_grpc.MemoryServiceAsyncStub, progress: Callable[[int, int], None] | None = None
    ) -> dict[str, float]:
        cfg = self.cfg
        batches = [
            [self._new_memory() for _ in range(min(cfg.load_batch, cfg.memories - start))]
            for start in range(0, cfg.memories, cfg.load_batch)
        ]
        queue: asyncio.Queue[tuple[int, list[memory_pb2.Memory]]] = asyncio.Queue()
        for n, b in enumerate(batches):
            queue.put_nowait((n, b))
        done = 0
        started = time.perf_counter()

        async def worker() -> None:
            nonlocal done
            while not queue.empty():
                n, batch = queue.get_nowait()
                req = pb.BatchCreateMemoriesRequest(
                    requests=[pb.CreateMemoryRequest(memory=m) for m in batch],
                    request_id=f"bench-load-{self.run_id}-{n}",
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

    # --- phase 2: sessions with feedback, then training ----------------------------------

    async def replay_sessions(self, stub: pb_grpc.MemoryServiceAsyncStub, n: int) -> int:
        """Sessions whose feedback marks as used the injected decisions about the system the
        question names: a plausible notion of relevance the baseline order does not know and
        a ranker can learn (its `decision` feature), so one is trained and promoted, and the
        mixed phase with the sidecar running measures Score with a model, not cold start.
        (Marking every memory about that system, about half of those injected, left the
        baseline at NDCG@10 ~0.96: nothing to learn, no model promoted.)"""
        pairs = 0
        for i in range(n):
            question = query_text(self.rng)
            m = _SUBJECT.search(question)
            subject = m.group(1).lower() if m else ""
            sid = f"bench-train-{self.run_id}-{i}"
            resp = await stub.StartSession(
                pb.StartSessionRequest(
                    session_id=sid,
                    project_id=f"bench-{i % self.cfg.scopes}",
                    context=question,
                    max_memories=30,
                    token_budget=100_000,
                ),
                metadata=self.md,
                timeout=30,
            )
            feedback = [
                pb.MemoryFeedback(
                    memory_id=x.memory.id,
                    relevance=1.0 if subject and _is_decision_about(x.memory.content, subject) else 0.0,
                )
                for x in resp.memories
            ]
            done = await stub.EndSession(
                pb.EndSessionRequest(session_id=sid, feedback=feedback), metadata=self.md, timeout=30
            )
            pairs += done.training_pairs
        return pairs

    # --- phase 3: the mixed workload ---------------------------------------------------------

    def _query(self) -> str:
        return fresh_query_text(self.rng) if self.cfg.fresh_queries else query_text(self.rng)

    def _ops(self, stub: pb_grpc.MemoryServiceAsyncStub, stats: dict[str, OpStats]) -> dict[str, Op]:
        cfg = self.cfg

        async def recall() -> None:
            await stub.Recall(
                pb.RecallRequest(query=self._query(), top_k=cfg.top_k), metadata=self.md, timeout=10
            )

        # Writes carry a request_id, as the shipped clients send one with every write: the
        # server then checks and records it in the write's transaction.
        async def create() -> None:
            memory = self._new_memory()
            resp = await stub.CreateMemory(
                pb.CreateMemoryRequest(
                    memory=memory, request_id=f"bench-{self.run_id}-create-{self.counter}"
                ),
                metadata=self.md,
                timeout=10,
            )
            self.deduplicated += resp.deduplicated
            if self.counter % cfg.watch_every == 0:
                self._watchers.append(
                    asyncio.create_task(self._watch(stub, resp.memory.id, time.perf_counter()))
                )

        async def list_memories() -> None:
            await stub.ListMemories(
                pb.ListMemoriesRequest(
                    page_size=20,
                    filter=memory_pb2.MemoryFilter(scopes=[_scope(self.rng.randrange(cfg.scopes))]),
                ),
                metadata=self.md,
                timeout=10,
            )

        async def start_session() -> FollowUp | None:
            self.sessions += 1
            sid = f"bench-{self.run_id}-{self.sessions}"
            resp = await stub.StartSession(
                pb.StartSessionRequest(
                    session_id=sid,
                    project_id=f"bench-{self.rng.randrange(cfg.scopes)}",
                    context=self._query(),
                    max_memories=10,
                    token_budget=800,
                ),
                metadata=self.md,
                timeout=10,
            )
            path = resp.ranking.path
            if path == pb.RANKING_PATH_MODEL:
                self.fallbacks["model"] += 1
            else:
                self.fallbacks[resp.ranking.fallback_reason or "baseline"] += 1
            if self.sessions % cfg.end_every != 0 or not resp.memories:
                return None
            used = resp.memories[0].memory.id

            async def end_session() -> None:
                ending = pb.EndSessionRequest(
                    session_id=sid,
                    feedback=[pb.MemoryFeedback(memory_id=used, used=True)],
                    request_id=f"{sid}-end",
                )
                await timed(
                    "EndSession", lambda: stub.EndSession(ending, metadata=self.md, timeout=10), stats
                )

            # Ended after StartSession's latency is taken: until this was a follow-up, every
            # third StartSession's latency included its EndSession's.
            return end_session

        return {
            "Recall": recall,
            "CreateMemory": create,
            "ListMemories": list_memories,
            "StartSession": start_session,
        }

    async def mixed(self, stub: pb_grpc.MemoryServiceAsyncStub) -> dict[str, Any]:
        cfg = self.cfg
        names = [n for n, _ in cfg.mix]
        weights = [w for _, w in cfg.mix]
        stats = {n: OpStats() for n in [*names, "EndSession"]}
        ops = self._ops(stub, stats)
        self._lags = []
        self._watchers = []
        self._probes = 0
        self.fallbacks = Counter()
        self.deduplicated = 0
        rss_peak = 0
        deadline = time.perf_counter() + cfg.duration_s

        async def worker() -> None:
            while time.perf_counter() < deadline:
                name = self.rng.choices(names, weights)[0]
                follow_up = await timed(name, ops[name], stats)
                if follow_up is not None:
                    await follow_up()

        async def sample_rss() -> None:
            nonlocal rss_peak
            while time.perf_counter() < deadline:
                rss_peak = max(rss_peak, (await self.status(stub)).process_rss_bytes)
                await asyncio.sleep(1.0)

        before = await self.status(stub)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(cfg.concurrency)), sample_rss())
        elapsed = time.perf_counter() - started
        after = await self.status(stub)
        await asyncio.gather(*self._watchers, return_exceptions=True)
        lags = sorted(self._lags)
        done = sum(len(s.latencies_ms) for s in stats.values())
        cpu_s = after.process_cpu_seconds - before.process_cpu_seconds
        inside = _server_side(before, after)
        return {
            "seconds": round(elapsed, 2),
            "ops": {
                n: {**s.summary(elapsed), **inside.get(n, {})}
                for n, s in stats.items()
                if s.latencies_ms or s.errors
            },
            # The server's CPU (all its threads) over the phase, per operation answered: far
            # steadier between runs on a shared machine than throughput or latency. The
            # watchers' probes and the RSS samples are served within it, not counted as ops.
            "server_cpu": {
                "ms_per_op": round(cpu_s * 1000.0 / done, 2) if done else 0.0,
                "cores_busy": round(cpu_s / elapsed, 2) if elapsed else 0.0,
                "searchability_probes": self._probes,
            },
            "fallbacks": dict(self.fallbacks),
            "create_searchable": {
                "samples": len(lags),
                "p50_s": round(percentile(lags, 0.5), 3),
                "p99_s": round(percentile(lags, 0.99), 3),
                "max_s": round(lags[-1], 3) if lags else 0.0,
            },
            "rss_peak_bytes": rss_peak,
            "write_locks": _lock_use(before.write_locks, after.write_locks, elapsed),
            "create_groups": {
                **_group_use(before.create_group_commit, after.create_group_commit),
                "deduplicated": self.deduplicated,
            },
            "interpreter_lock_wait": _lock_wait(before, after),
        }

    async def _watch(self, stub: pb_grpc.MemoryServiceAsyncStub, memory_id: str, acked_at: float) -> None:
        """Time from acknowledgement until the memory is searchable."""
        while time.perf_counter() - acked_at < 60:
            self._probes += 1
            m = await stub.GetMemory(pb.GetMemoryRequest(id=memory_id), metadata=self.md, timeout=10)
            if m.memory.index_state == memory_pb2.INDEX_STATE_INDEXED:
                self._lags.append(time.perf_counter() - acked_at)
                return
            await asyncio.sleep(0.05)
        self._lags.append(float("inf"))


def _window(start: Sequence[int], end: Sequence[int]) -> list[int]:
    """One phase's counts per bucket: a GetStatus histogram at its end less the same one at
    its start (empty at the start: nothing was counted yet)."""
    return [b - a for a, b in zip(start or [0] * len(end), end, strict=True)]


def _server_side(before: pb.GetStatusResponse, after: pb.GetStatusResponse) -> dict[str, dict[str, float]]:
    """Each MemoryService method's time inside the server over one phase (the difference of
    two GetStatus histograms), by short name: beside a client's latency it shows how much
    of it the transport and the wait for a worker thread took."""
    bounds = list(after.latency_bucket_upper_ms)
    start = {m.method: list(m.bucket_counts) for m in before.method_latencies}
    out: dict[str, dict[str, float]] = {}
    for m in after.method_latencies:
        if not m.method.startswith("/mnemo.v1.MemoryService/"):
            continue
        window = _window(start.get(m.method, ()), m.bucket_counts)
        if sum(window) > 0:
            out[m.method.rsplit("/", 1)[1]] = {
                "server_p50_ms": round(quantile(window, 0.5, bounds), 2),
                "server_p99_ms": round(quantile(window, 0.99, bounds), 2),
            }
    return out


def _lock_wait(before: pb.GetStatusResponse, after: pb.GetStatusResponse) -> dict[str, float]:
    """How long a thread ready to run waited for the server's interpreter lock over one
    phase (GetStatus.interpreter_lock_wait): the waits that make a client's latency longer
    than the server-side time, once per hand-over between threads. Zeros when not measured."""
    bounds = list(after.latency_bucket_upper_ms)
    window = _window(before.interpreter_lock_wait.bucket_counts, after.interpreter_lock_wait.bucket_counts)
    if not sum(window):
        return {"samples": 0, "p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0}
    return {
        "samples": sum(window),
        **{f"p{round(q * 100)}_ms": round(quantile(window, q, bounds), 2) for q in (0.5, 0.9, 0.99)},
    }


def _lock_use(
    before: Sequence[pb.WriteLockStats], after: Sequence[pb.WriteLockStats], seconds: float
) -> dict[str, dict[str, float]]:
    """Each write domain's lock over one phase: its busy share and the mean wait for it."""
    start = {x.domain: x for x in before}
    out = {}
    for end in after:
        was = start.get(end.domain, pb.WriteLockStats())
        n = end.transactions - was.transactions
        held, waited = end.held_seconds - was.held_seconds, end.waited_seconds - was.waited_seconds
        out[end.domain] = {
            "transactions": n,
            "utilization": round(held / seconds, 3) if seconds else 0.0,
            "mean_wait_ms": round(waited / n * 1000, 2) if n else 0.0,
        }
    return out


def _group_use(before: pb.GroupCommitStats, after: pb.GroupCommitStats) -> dict[str, float]:
    """Create calls over one phase and the transactions they were written in."""
    calls, groups = after.calls - before.calls, after.groups - before.groups
    return {"calls": calls, "groups": groups, "calls_per_group": round(calls / groups, 2) if groups else 0.0}


async def timed(name: str, call: Callable[[], Awaitable[Any]], stats: dict[str, OpStats]) -> Any:
    """Await one call and record its latency (or its error code) under `name`; returns what
    the call returned (None after an error)."""
    started = time.perf_counter()
    try:
        returned = await call()
    except grpc.RpcError as err:
        stats[name].errors[_code(err)] += 1
        return None
    stats[name].latencies_ms.append((time.perf_counter() - started) * 1000.0)
    return returned


def _code(err: grpc.RpcError) -> str:
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    return str(code.name)


async def train_sidecar(
    address: str, tenant: str, models: Sequence[rpb.ModelKind] = ()
) -> list[dict[str, Any]]:
    """A forced Train of `models` (none named: both), its outcomes."""
    from google.protobuf import json_format

    outcomes = []
    async with aio.insecure_channel(address) as channel:
        stub = rpb_grpc.RankingServiceStub(channel)
        request = rpb.TrainRequest(tenant_id=tenant, models=list(models), force=True)
        try:
            async for ev in stub.Train(request, timeout=3600):
                if ev.HasField("outcome"):
                    outcomes.append(json_format.MessageToDict(ev.outcome, preserving_proto_field_name=True))
        except aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            # Too few sessions with a used memory (few memories loaded): the run goes on
            # untrained and says why (it ended in a traceback; probe).
            return [{"model": "none", "reason": f"not trained: {err.details()}"}]
    return outcomes


def _scenario(mixed: dict[str, Any], deadline_ms: float) -> dict[str, Any]:
    start = mixed["ops"].get("StartSession", {})
    return {
        "deadline_ms": deadline_ms,
        "ops": mixed["ops"],
        "fallbacks": mixed["fallbacks"],
        "write_locks": mixed["write_locks"],
        "create_groups": mixed["create_groups"],
        "server_cpu": mixed["server_cpu"],
        "interpreter_lock_wait": mixed["interpreter_lock_wait"],
        # None when the mix had no StartSession (see --mix).
        "start_session_p99_within_deadline_plus_10ms": start["p99_ms"] <= deadline_ms + 10 if start else None,
        "failed_calls": sum(sum(s["errors"].values()) for s in mixed["ops"].values()),
    }


async def _while_training(
    bench: Bench, stub: pb_grpc.MemoryServiceAsyncStub, sidecar: str, tenant: str, cfg: BenchConfig
) -> dict[str, Any]:
    """A mixed minute while the sidecar trains, as it does in the background every so many
    sessions: the fine-tune and the ranker's fit share the machine with serving."""

    models = () if cfg.fine_tune_during_mix else (rpb.MODEL_KIND_RANKER,)

    async def train() -> tuple[list[dict[str, Any]], float]:
        return await train_sidecar(sidecar, tenant, models), time.perf_counter()

    started = time.perf_counter()
    training = asyncio.create_task(train())
    mixed = await bench.mixed(stub)
    mixed_s = time.perf_counter() - started
    outcomes, ended = await training
    training_s = ended - started
    return {
        **_scenario(mixed, cfg.session_deadline_ms),
        "training": {
            "seconds": round(training_s, 1),
            # How much of the mixed phase the training ran through (1: all of it).
            "share_of_phase": round(min(1.0, training_s / mixed_s), 2),
            "outcomes": outcomes,
        },
    }


async def run_bench(
    address: str,
    api_key: str | None,
    cfg: BenchConfig,
    progress: Callable[[int, int], None] | None = None,
    sidecar: LaunchedProcess | None = None,
    tenant: str = "default",
    say: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "memories": cfg.memories,
        "concurrency": cfg.concurrency,
        "duration_s": cfg.duration_s,
        "mix": dict(cfg.mix),
        "fresh_queries": cfg.fresh_queries,
    }
    async with aio.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 32 << 20)]
    ) as channel:
        stub = pb_grpc.MemoryServiceStub(channel)
        bench = Bench(api_key, cfg)
        say("loading memories")
        result["load"] = await bench.load(stub, progress)
        if sidecar is not None and cfg.train_sessions:
            say(f"replaying {cfg.train_sessions} sessions with feedback, then training the sidecar")
            await Bench(api_key, replace(cfg, seed=cfg.seed + 100)).replay_sessions(stub, cfg.train_sessions)
            await bench.outbox_delivered(stub)
            result["training"] = await train_sidecar(sidecar.address, tenant)
        scenarios: dict[str, Any] = {}
        say("mixed workload, sidecar running")
        ok = await Bench(api_key, replace(cfg, seed=cfg.seed + 1)).mixed(stub)
        scenarios["sidecar_ok"] = _scenario(ok, cfg.session_deadline_ms)
        if sidecar is not None and cfg.train_sessions:
            say("mixed workload, sidecar training (a Train of both models runs meanwhile)")
            scenarios["sidecar_training"] = await _while_training(
                Bench(api_key, replace(cfg, seed=cfg.seed + 4)), stub, sidecar.address, tenant, cfg
            )
        if sidecar is not None:
            say("mixed workload, sidecar stopped (SIGSTOP)")
            os.kill(sidecar.pid, signal.SIGSTOP)
            try:
                stopped = await Bench(api_key, replace(cfg, seed=cfg.seed + 2)).mixed(stub)
            finally:
                os.kill(sidecar.pid, signal.SIGCONT)
            scenarios["sidecar_stopped"] = _scenario(stopped, cfg.session_deadline_ms)
            say("mixed workload, sidecar killed (SIGKILL)")
            sidecar.kill9()
            killed = await Bench(api_key, replace(cfg, seed=cfg.seed + 3)).mixed(stub)
            scenarios["sidecar_killed"] = _scenario(killed, cfg.session_deadline_ms)
        status = await bench.status(stub)
    live = status.memory_count
    rss = max(ok["rss_peak_bytes"], status.process_rss_bytes)
    result.update(
        {
            "ops": ok["ops"],
            "create_searchable": ok["create_searchable"],
            "scenarios": scenarios,
            "server_rss_mb": round(rss / 2**20, 1),
            # The server's own high-water mark: every phase since it started, the load too
            # (server_rss_mb is sampled during the first mixed minute and at the end).
            "server_rss_high_water_mb": round(status.process_peak_rss_bytes / 2**20, 1),
            "data_mb": round(status.data_bytes / 2**20, 1),
            "disk_mb_per_100k": round(status.data_bytes / 2**20 * 100_000 / live, 1) if live else 0.0,
            "memories_after": live,
            # What the server kept in memory at the end (this tenant's search structures,
            # the shared row cache): where the RSS above goes, after the models.
            "server_caches": {
                **{f.name: getattr(status.cache_use, f.name) for f in status.cache_use.DESCRIPTOR.fields},
                "access_counts_pending": status.access_counts_pending,
            },
        }
    )
    return result
