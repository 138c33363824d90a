"""`mnemo bench --mix` against a real server: one operation type alone, as used to measure
what each operation costs under concurrency."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from grpc import aio

from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo.v1 import memory_service_pb2_grpc as pb_grpc
from mnemo_server.cli.bench import bench, parse_mix
from mnemo_server.evaluation.bench import Bench, BenchConfig, OpStats, timed
from mnemo_server.evaluation.synth import fresh_query_text, query_text
from tests.conftest import LiveServer, provision

KNOWN = ["Recall", "CreateMemory", "ListMemories", "StartSession"]


def test_parse_mix() -> None:
    assert parse_mix("Recall=1", KNOWN) == (("Recall", 1.0),)
    assert parse_mix("Recall=0.7, CreateMemory=0.3", KNOWN) == (("Recall", 0.7), ("CreateMemory", 0.3))
    bad = ["Recal=1", "Recall", "Recall=0", "Recall=-1", "Recall=nan", "Recall=inf", "Recall=1,Recall=1"]
    for text in bad:
        with pytest.raises(click.BadParameter):
            parse_mix(text, KNOWN)


def test_bench_runs_one_operation_alone(server: LiveServer, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--server", server.address, "--api-key", provision(server, "bench-mix"), "--memories", "40"]
    args += ["--concurrency", "2", "--duration", "1.5", "--mix", "Recall=1", "--json-out", str(out)]
    result = CliRunner().invoke(bench, [*args, "--fresh-queries"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["mix"] == {"Recall": 1.0} and data["fresh_queries"] is True
    assert set(data["ops"]) == {"Recall"} and data["ops"]["Recall"]["count"] > 0
    assert data["ops"]["Recall"]["errors"] == {}
    locks = data["scenarios"]["sidecar_ok"]["write_locks"]
    assert set(locks) == {"memories", "sessions", "session_starts"}
    assert all(0 <= lock["utilization"] < 1 for lock in locks.values())
    assert data["scenarios"]["sidecar_ok"]["create_groups"] == {
        "calls": 0,
        "groups": 0,
        "calls_per_group": 0.0,
        "deduplicated": 0,
    }
    assert data["scenarios"]["sidecar_ok"]["start_session_p99_within_deadline_plus_10ms"] is None
    assert "n/a (no StartSession in the mix)" in " ".join(result.output.split())  # rich wraps lines

    refused = CliRunner().invoke(bench, ["--server", server.address, "--mix", "Search=1"])
    assert refused.exit_code == 2 and "--mix" in refused.output


def test_a_second_run_on_the_same_store_creates_new_memories(server: LiveServer, tmp_path: Path) -> None:
    """The texts are seeded, so they repeat from run to run; without the run's id in them, a
    second run's creates were all answered as duplicates of the first's (a lookup, not a
    write), and a mix on a loaded store measured something else than creating."""
    key = provision(server, "bench-rerun")
    created = []
    for i, memories in enumerate(("20", "0")):
        out = tmp_path / f"bench{i}.json"
        args = ["--server", server.address, "--api-key", key, "--memories", memories, "--concurrency", "2"]
        args += ["--duration", "1", "--mix", "CreateMemory=1", "--json-out", str(out)]
        result = CliRunner().invoke(bench, args)
        assert result.exit_code == 0, result.output
        sc = json.loads(out.read_text())["scenarios"]["sidecar_ok"]
        assert sc["create_groups"]["calls"] > 0, sc
        created.append(sc["create_groups"]["deduplicated"])
    assert created == [0, 0]


def test_fresh_queries_do_not_repeat_where_template_queries_mostly_do() -> None:
    rng = random.Random(11)
    fresh = [fresh_query_text(rng) for _ in range(5000)]
    assert len(set(fresh)) == 5000
    templates = [query_text(rng) for _ in range(5000)]
    assert len(set(templates)) < 1500  # most template queries are repeats


def test_a_session_is_ended_after_its_start_was_timed(server: LiveServer) -> None:
    """StartSession's latency is its own: the session's end is handed back as a follow-up,
    made and timed as an EndSession after StartSession's clock stopped."""
    key = provision(server, "bench-follow-up")
    stats = {name: OpStats() for name in ("StartSession", "EndSession")}
    bench_run = Bench(key, BenchConfig(end_every=1))

    async def run() -> None:
        async with aio.insecure_channel(server.address) as channel:
            stub = pb_grpc.MemoryServiceStub(channel)
            await stub.CreateMemory(
                pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="the deploy runs at noon")),
                metadata=bench_run.md,
                timeout=10,
            )
            ops = bench_run._ops(stub, stats)
            follow_up = await timed("StartSession", ops["StartSession"], stats)
            assert follow_up is not None
            sid = f"bench-{bench_run.run_id}-1"
            got = await stub.GetSession(
                pb.GetSessionRequest(session_id=sid), metadata=bench_run.md, timeout=10
            )
            assert got.session.state == pb.SESSION_STATE_ACTIVE  # timed, not yet ended
            assert len(stats["StartSession"].latencies_ms) == 1 and not stats["EndSession"].latencies_ms
            await follow_up()
            got = await stub.GetSession(
                pb.GetSessionRequest(session_id=sid), metadata=bench_run.md, timeout=10
            )
            assert got.session.state == pb.SESSION_STATE_ENDED
            assert len(stats["EndSession"].latencies_ms) == 1 and not stats["EndSession"].errors

    asyncio.run(run())


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--concurrency", "0"], "--concurrency"),
        (["--duration", "nan"], "--duration"),
        (["--duration", "0"], "--duration"),
        (["--memories", "-5"], "--memories"),
        (["--train-sessions", "-1"], "--train-sessions"),
        (["--session-deadline-ms", "-5"], "--session-deadline-ms"),
        (["--json-out", "/proc/bench.json"], "--json-out"),
    ],
)
def test_bench_refuses_values_it_cannot_run_before_starting_anything(args: list[str], option: str) -> None:
    """Each ran (an empty table, NaN in the JSON, -5 memories) or failed with a traceback,
    some after the whole run (eval probe)."""
    result = CliRunner().invoke(bench, ["--server", "127.0.0.1:1", *args])
    assert result.exit_code == 2 and option in result.output, result.output
