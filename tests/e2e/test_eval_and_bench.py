"""`mnemo eval locomo` and `mnemo bench --quick` run end to end, and the eval's metrics agree
with the reference scorer on the same run file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from mnemo.v1 import memory_service_pb2 as pb
from mnemo.v1 import memory_service_pb2_grpc as pb_grpc
from mnemo_server.cli.evaluate import phase_run_path
from tests.conftest import SHARED
from tests.e2e.conftest import MNEMO, Proc, base_env

LOCOMO = SHARED / "eval" / "locomo"


def _mnemo(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the mnemo CLI as a user would; it must succeed."""
    cmd = [*MNEMO, *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _subset(tmp: Path, conv: str = "conv-26", n_queries: int = 40) -> Path:
    """A small LoCoMo-format directory: one conversation, some of its queries."""
    out = tmp / "locomo-subset"
    out.mkdir()
    mems = [line for line in (LOCOMO / "memories.jsonl").read_text().splitlines() if f'"{conv}"' in line]
    qs = [line for line in (LOCOMO / "queries.jsonl").read_text().splitlines() if f'"{conv}"' in line]
    (out / "memories.jsonl").write_text("\n".join(mems) + "\n")
    (out / "queries.jsonl").write_text("\n".join(qs[:n_queries]) + "\n")
    return out


def reference_metrics(data: Path, run: Path) -> dict[str, dict[str, float]]:
    """What ../shared/eval/locomo/score.py makes of a run."""
    ref = subprocess.run(
        ["python3", str(LOCOMO / "score.py"), str(data / "queries.jsonl"), str(run), "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    metrics: dict[str, dict[str, float]] = json.loads(ref.stdout)["metrics"]
    return metrics


def test_eval_locomo_agrees_with_reference_scorer(tmp_path: Path, model_cache: Path) -> None:
    data = _subset(tmp_path)
    run, metrics = tmp_path / "run.jsonl", tmp_path / "metrics.json"
    _mnemo(
        ["eval", "locomo", "--data", str(data), "--out", str(run), "--json-out", str(metrics)],
        base_env(model_cache),
    )
    lines = [json.loads(x) for x in run.read_text().splitlines()]
    assert len(lines) == 40 and all(len(x["ranked_memory_ids"]) >= 10 for x in lines)
    assert all(i.startswith("conv-26:") for x in lines for i in x["ranked_memory_ids"])
    ours = json.loads(metrics.read_text())
    reference = reference_metrics(data, run)
    assert ours["metrics"] == reference
    assert reference["overall"]["NDCG@10"] > 0.3  # far above random (0.01): the pipeline really ran
    assert ours["timings"]["query_p50_ms"] > 0


def test_eval_of_a_directory_not_in_the_format_is_one_line_and_starts_nothing(
    tmp_path: Path, model_cache: Path
) -> None:
    data = _subset(tmp_path)
    with (data / "memories.jsonl").open("a") as fh:
        fh.write("{not json\n")
    lines = len((data / "memories.jsonl").read_text().splitlines())
    for args in (
        ["locomo", "--data", str(data), "--out", str(tmp_path / "run.jsonl")],
        ["locomo-split", "--data", str(data), "--convs", "conv-26", "--out", str(tmp_path / "split")],
    ):
        out = subprocess.run(
            [*MNEMO, "eval", *args],
            env=base_env(model_cache),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 1 and f"memories.jsonl:{lines}: bad JSON" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and "starting" not in out.stderr
    assert not (tmp_path / "split").exists() and not (tmp_path / "run.jsonl").exists()


def test_eval_refuses_what_would_fail_late_before_starting_anything(
    tmp_path: Path, model_cache: Path
) -> None:
    """An --out it cannot write, a --top-k the server refuses, a split with nothing to score:
    one line, before any server starts (not a traceback after the whole run)."""
    data = _subset(tmp_path, n_queries=3)
    empty = tmp_path / "no-gold"
    empty.mkdir()
    (empty / "memories.jsonl").write_text((data / "memories.jsonl").read_text())
    (empty / "queries.jsonl").write_text(
        json.dumps({"conv_id": "conv-26", "query_id": "q", "question": "who?", "gold_memory_ids": []}) + "\n"
    )
    cases = [
        (["--data", str(data), "--out", str(tmp_path / "missing" / "run.jsonl")], "is not a directory"),
        (["--data", str(data), "--out", str(tmp_path)], "is a directory"),
        (
            [
                "--data",
                str(data),
                "--out",
                str(tmp_path / "r.jsonl"),
                "--json-out",
                str(tmp_path / "no" / "m.json"),
            ],
            "--json-out",
        ),
        (["--data", str(data), "--out", str(tmp_path / "r.jsonl"), "--top-k", "101"], "--top-k"),
        # os.access says yes to root: /proc refuses new files all the same (eval probe).
        (["--data", str(data), "--out", "/proc/run.jsonl"], "cannot be written"),
        (["--data", str(empty), "--out", str(tmp_path / "r.jsonl")], "nothing to score"),
    ]
    for args, said in cases:
        out = subprocess.run(
            [*MNEMO, "eval", "locomo", *args],
            env=base_env(model_cache),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode != 0 and said in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr and "starting" not in out.stderr, out.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_eval_runs_against_a_shared_server_are_their_own(
    spawn: Callable[..., Proc], tmp_path: Path, model_cache: Path
) -> None:
    """Against a running server (--server), a run's scopes, ids and sessions are its own:
    a run of a smaller split after a larger one ranks only its own turns, and each run's
    memories are purged from the server once it ends."""
    server = spawn(
        ["serve", "--data-dir", str(tmp_path / "srv"), "--port", "0"],
        env=base_env(model_cache, MNEMO_AUTH__ENABLED="false"),
    )
    whole = _subset(tmp_path, n_queries=10)
    part = tmp_path / "part"
    part.mkdir()
    turns = (whole / "memories.jsonl").read_text().splitlines()
    (part / "memories.jsonl").write_text("\n".join(turns[:120]) + "\n")
    (part / "queries.jsonl").write_text((whole / "queries.jsonl").read_text())
    for data in (whole, part):
        run = tmp_path / f"{data.name}.jsonl"
        _mnemo(
            ["eval", "locomo", "--data", str(data), "--out", str(run), "--server", server.address],
            base_env(model_cache),
        )
        own = {json.loads(line)["memory_id"] for line in (data / "memories.jsonl").read_text().splitlines()}
        ranked = [i for line in run.read_text().splitlines() for i in json.loads(line)["ranked_memory_ids"]]
        assert ranked and set(ranked) <= own
    with grpc.insecure_channel(server.address) as channel:
        status = pb_grpc.MemoryServiceStub(channel).GetStatus(pb.GetStatusRequest(), timeout=10)
    assert status.memory_count == 0 and status.deleted_count == len(turns) + 120


def test_a_stopped_eval_stops_its_server_and_leaves_no_temporary_data(
    tmp_path: Path, model_cache: Path
) -> None:
    """SIGTERM while the eval runs (as a CI job's timeout sends it): the command stops the
    server it started and removes its temporary directory, as Ctrl-C does."""
    data = _subset(tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [*MNEMO, "eval", "locomo", "--data", str(data), "--out", str(tmp_path / "run.jsonl")],
        env=base_env(model_cache, TMPDIR=str(tmp)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp.glob("mnemo-run-*/server.port")):  # the server is up
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "stopped; stopping the launched processes" in err, err
    assert "Traceback" not in err and not list(tmp.glob("mnemo-run-*"))


def test_eval_stage_switches_change_the_result(tmp_path: Path, model_cache: Path) -> None:
    data = _subset(tmp_path, n_queries=20)
    results = {}
    for stage in ("vector", "full_text"):
        run = tmp_path / f"{stage}.jsonl"
        _mnemo(
            ["eval", "locomo", "--data", str(data), "--out", str(run), "--disable-stage", stage],
            base_env(model_cache),
        )
        results[stage] = run.read_text()
    assert results["vector"] != results["full_text"]


def test_bench_quick_with_sidecar_scenarios(tmp_path: Path, model_cache: Path) -> None:
    out_json = tmp_path / "bench.json"
    args = ["bench", "--quick", "--memories", "600", "--duration", "3", "--train-sessions", "20"]
    out = _mnemo([*args, "--json-out", str(out_json)], base_env(model_cache), timeout=900)
    result = json.loads(out_json.read_text())
    assert result["memories"] == 600 and result["concurrency"] == 4
    assert result["load"]["memories_per_s"] > 0 and result["load"]["searchable_after_s"] > 0
    for op in ("Recall", "CreateMemory", "ListMemories", "StartSession"):
        stats = result["ops"][op]
        # The issue's fields, and the same calls' time inside the server.
        issue_fields = {"count", "throughput_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms", "errors"}
        assert set(stats) == issue_fields | {"server_p50_ms", "server_p99_ms"}
        assert stats["count"] > 0 and stats["errors"] == {}
        assert 0 < stats["p50_ms"] <= stats["p95_ms"] <= stats["p99_ms"] <= stats["max_ms"]
    assert set(result["scenarios"]) == {"sidecar_ok", "sidecar_training", "sidecar_stopped", "sidecar_killed"}
    for name, sc in result["scenarios"].items():
        assert sc["deadline_ms"] == 120.0 and sc["failed_calls"] == 0, (name, sc)
        assert sc["ops"]["StartSession"]["count"] > 0
        # A CreateMemory is a write of the memories domain, a StartSession one of the
        # session_starts' (grouped like creates), an EndSession one of the sessions'.
        locks = sc["write_locks"]
        creates, starts = sc["ops"]["CreateMemory"]["count"], sc["ops"]["StartSession"]["count"]
        # Creates that queue while another is written share its transaction (group commit).
        groups = sc["create_groups"]
        assert groups["calls"] == creates and 0 < groups["groups"] <= creates, (name, groups)
        assert groups["deduplicated"] == 0, (name, groups)  # every create wrote a new memory
        assert locks["memories"]["transactions"] >= groups["groups"], (name, locks)
        assert 0 < locks["session_starts"]["transactions"] <= starts, (name, locks)
        assert locks["sessions"]["transactions"] >= sc["ops"]["EndSession"]["count"], (name, locks)
        for lock in locks.values():
            assert 0 < lock["utilization"] < 1 and lock["mean_wait_ms"] >= 0, (name, locks)
        # The server's own CPU over the phase: some per operation, at most the machine's cores.
        cpu = sc["server_cpu"]
        assert 0 < cpu["ms_per_op"] < 1000 and 0 < cpu["cores_busy"] <= (os.cpu_count() or 1), (name, cpu)
        # Time inside the server, from GetStatus' histograms: each call's is within the
        # client's, so the median is too (up to the histogram's 19 % buckets). The p99s are
        # read at ranks that can differ by one call, so the server's is held to the client's
        # slowest call instead.
        for op, s in sc["ops"].items():
            assert 0 < s["server_p50_ms"] <= s["server_p99_ms"], (name, op, s)
            assert s["server_p50_ms"] <= s["p50_ms"] * 2**0.25, (name, op, s)
            assert s["server_p99_ms"] <= s["max_ms"] * 2**0.25, (name, op, s)
    # Every watched create is probed until searchable, at least once.
    probes = result["scenarios"]["sidecar_ok"]["server_cpu"]["searchability_probes"]
    assert probes >= result["create_searchable"]["samples"] > 0
    # With the sidecar gone every session is ordered by the baseline, for a stated reason.
    killed = result["scenarios"]["sidecar_killed"]["fallbacks"]
    assert set(killed) <= {"unavailable", "circuit_open", "deadline", "no_time"} and sum(killed.values()) > 0
    assert (
        "model" not in result["scenarios"]["sidecar_stopped"]["fallbacks"]
        or result["scenarios"]["sidecar_stopped"]["fallbacks"]["model"] == 0
    )
    assert result["training"] and all("reason" in t for t in result["training"])
    # A Train ran while the phase measured serving (a quick run's: the ranker alone).
    during = result["scenarios"]["sidecar_training"]["training"]
    assert 0 < during["share_of_phase"] <= 1 and during["seconds"] > 0, during
    assert [t["model"] for t in during["outcomes"]] == ["MODEL_KIND_RANKER"], during
    # The replayed sessions taught the sidecar a ranker, which then ordered the sessions of
    # the mix while it ran (cold start would be `cold_start` here).
    [ranker] = [t for t in result["training"] if t["model"] == "MODEL_KIND_RANKER"]
    assert ranker.get("promoted") and ranker["candidate_ndcg"] > ranker["baseline_ndcg"], ranker
    ok = result["scenarios"]["sidecar_ok"]
    assert ok["fallbacks"].get("model", 0) > ok["ops"]["StartSession"]["count"] / 2, ok["fallbacks"]
    assert result["server_rss_mb"] > 50 and result["disk_mb_per_100k"] > 0
    assert result["server_rss_high_water_mb"] >= result["server_rss_mb"]
    caches = result["server_caches"]
    assert caches["index_session_bytes"] > 0 and caches["text_posting_bytes"] > 0, caches
    assert caches["row_cache_rows"] > 0 and caches["row_cache_hits"] > 0, caches
    assert sum(v for k, v in caches.items() if k.endswith("_bytes")) < result["server_rss_mb"] * 2**20
    assert "in memory at the end: LanceDB session" in out.stdout
    # The launched processes' logs are kept beside the JSON (the launcher's directory is not).
    logs = [Path(p) for p in result["logs"]]
    assert {p.name for p in logs} == {"server.log", "sidecar.log"}, logs
    assert all(p.parent == tmp_path / "bench.logs" and p.stat().st_size > 0 for p in logs)
    # Copied once the server had stopped in order: its last lines are in the copy.
    assert "garbage collector while serving:" in (tmp_path / "bench.logs" / "server.log").read_text()
    assert "sidecar_killed" in out.stdout and "memories write lock: busy" in out.stdout  # the tables
    assert "ms per operation" in out.stdout


def test_eval_with_training_sessions_runs_every_phase(tmp_path: Path, model_cache: Path) -> None:
    """The session-learning measurement end to end on tiny data (the real one takes minutes)."""
    data = _subset(tmp_path, conv="conv-30", n_queries=12)
    (tmp_path / "train").mkdir()
    train = _subset(tmp_path / "train", conv="conv-26", n_queries=30)
    metrics = tmp_path / "sessions.json"
    env = base_env(
        model_cache,
        MNEMO_SIDECAR_CROSS_ENCODER__MAX_PAIRS="48",
        MNEMO_SIDECAR_CROSS_ENCODER__EPOCHS="1",
        MNEMO_SIDECAR_TRAINING__MIN_HELDOUT="4",
        MNEMO_SIDECAR_RANKER__N_ESTIMATORS="20",
        MNEMO_SIDECAR_RANKER__MIN_CHILD_SAMPLES="3",
    )
    run = tmp_path / "run.jsonl"
    args = ["eval", "locomo", "--data", str(data), "--train-sessions", str(train), "--out", str(run)]
    _mnemo([*args, "--json-out", str(metrics)], env, timeout=900)
    doc = json.loads(metrics.read_text())
    phases = doc["phases"]
    assert list(phases) == ["untrained", "ranker", "recall+cross_encoder_rerank", "ranker+cross_encoder"]
    assert phases["untrained"]["paths"] == {"baseline": 12}  # no training data: the baseline order
    assert all(p["metrics"]["overall"]["n"] == 12 for p in phases.values())
    kinds = [o["model"] for o in doc["training_outcomes"]]
    assert kinds == ["MODEL_KIND_RANKER", "MODEL_KIND_CROSS_ENCODER", "MODEL_KIND_RANKER"]
    for o in doc["training_outcomes"]:
        assert o["heldout_sessions"] >= 4 and o["reason"]
        # The decision follows the held-back numbers, whichever way it went.
        against = o.get("current_ndcg") or o["baseline_ndcg"]
        assert o.get("promoted", False) == (o["candidate_ndcg"] > against)
    assert doc["train_sessions"] == 30
    # RUN.jsonl is the trained pipeline's run and each phase's run is beside it: the
    # reference scorer gives each the metrics the command reported for its phase.
    assert run.read_text() == (tmp_path / "run.ranker-cross_encoder.jsonl").read_text()
    for name, phase in phases.items():
        phase_run = phase_run_path(run, name)
        lines = [json.loads(x) for x in phase_run.read_text().splitlines()]
        assert len(lines) == 12 and all(len(x["ranked_memory_ids"]) >= 10 for x in lines)
        assert phase["metrics"] == reference_metrics(data, phase_run)


def test_bench_tenants_quick(tmp_path: Path, model_cache: Path) -> None:
    """Six tenants, two kept in memory: the restarted server loads the two most recently
    written, Recalls on the others load them (answered UNAVAILABLE at once, the server told
    to wait 0 s for a load, and retried until the load is done), and every Recall finds the
    memory it asks for."""
    out_json = tmp_path / "tenants.json"
    env = base_env(model_cache, MNEMO_INDEX__LOAD_WAIT_S="0")
    _mnemo(["bench-tenants", "--quick", "--json-out", str(out_json)], env, timeout=600)
    result = json.loads(out_json.read_text())
    assert (result["tenants"], result["memories_per_tenant"], result["max_resident_tenants"]) == (6, 40, 2)
    assert result["load"]["memories"] == 240 and result["load"]["searchable_after_s"] > 0
    assert result["restart"]["residency"]["rows"] == 80  # two tenants' 40 memories
    recalls = result["recalls"]
    assert recalls["kept"]["count"] + recalls["loading"]["count"] == 30
    assert recalls["kept"]["errors"] == recalls["loading"]["errors"] == {}
    assert recalls["loading"]["count"] > 0 and recalls["top_hit_is_the_memory_asked"] == 1.0
    assert recalls["loading"]["retried_unavailable"] > 0  # then answered: no errors above
    assert result["end"]["residency"]["loads"] > result["restart"]["residency"]["loads"]
