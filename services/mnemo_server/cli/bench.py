"""`mnemo bench`: load and latency figures as a table and as JSON (see evaluation/bench.py)."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from mnemo_server.cli.common import finite_at_least, writable_output, write_output

if TYPE_CHECKING:
    from mnemo_server.launcher import Launcher


def _ops_table(title: str, ops: dict[str, Any]) -> Table:
    table = Table(title=title)
    columns: tuple[str, ...] = ("operation", "count", "ops/s", "p50 ms", "p95 ms", "p99 ms", "max ms")
    # In the server: from a worker thread taking the call to its handler returning.
    columns += ("in server p50", "in server p99", "errors")
    for col in columns:
        table.add_column(col, justify="left" if col in ("operation", "errors") else "right")
    for name, s in ops.items():
        table.add_row(
            name,
            str(s["count"]),
            f"{s['throughput_per_s']:.1f}",
            f"{s['p50_ms']:.1f}",
            f"{s['p95_ms']:.1f}",
            f"{s['p99_ms']:.1f}",
            f"{s['max_ms']:.1f}",
            f"{s['server_p50_ms']:.1f}" if "server_p50_ms" in s else "-",
            f"{s['server_p99_ms']:.1f}" if "server_p99_ms" in s else "-",
            ", ".join(f"{k}:{v}" for k, v in s["errors"].items()) or "-",
        )
    return table


def print_tables(result: dict[str, Any]) -> None:
    console = Console()
    load = result["load"]
    console.print(
        f"[bold]load[/]: {result['memories']} memories in {load['seconds']} s "
        f"({load['memories_per_s']}/s acknowledged), all searchable after {load['searchable_after_s']} s"
    )
    for t in result.get("training", []):
        console.print(f"[bold]training[/] {t.get('model')}: {t.get('reason')}")
    for name, sc in result["scenarios"].items():
        console.print(
            _ops_table(
                f"{name}: concurrency {result['concurrency']}, {result['duration_s']} s, "
                f"StartSession deadline {sc['deadline_ms']:.0f} ms",
                sc["ops"],
            )
        )
        within = sc["start_session_p99_within_deadline_plus_10ms"]
        ok = "n/a (no StartSession in the mix)" if within is None else "yes" if within else "NO"
        console.print(
            f"  session ordering: {sc['fallbacks']}; StartSession p99 within deadline + 10 ms: {ok}; "
            f"failed calls: {sc['failed_calls']}"
        )
        if "training" in sc:
            t = sc["training"]
            console.print(
                f"  the sidecar trained for {t['seconds']} s, through {t['share_of_phase']:.0%} of this phase"
            )
        for domain, lock in sc["write_locks"].items():
            console.print(
                f"  {domain} write lock: busy {lock['utilization']:.0%} of the time, "
                f"{lock['transactions']} writes waited {lock['mean_wait_ms']} ms on average"
            )
        cpu = sc["server_cpu"]
        console.print(
            f"  server CPU: {cpu['ms_per_op']} ms per operation, {cpu['cores_busy']} cores busy "
            f"({cpu['searchability_probes']} GetMemory probes of fresh memories served beside the ops)"
        )
        w = sc["interpreter_lock_wait"]
        if w["samples"]:
            console.print(
                f"  a thread ready to run waited for the interpreter lock p50 {w['p50_ms']} ms, "
                f"p90 {w['p90_ms']} ms, p99 {w['p99_ms']} ms ({w['samples']} samples)"
            )
        g = sc["create_groups"]
        console.print(
            f"  create calls: {g['calls']} written in {g['groups']} transactions "
            f"({g['calls_per_group']} a transaction), {g['deduplicated']} answered as duplicates"
        )
    cs = result["create_searchable"]
    console.print(
        f"created → searchable under load: p50 {cs['p50_s']} s, p99 {cs['p99_s']} s, "
        f"max {cs['max_s']} s ({cs['samples']} samples)"
    )
    console.print(
        f"server RSS peak {result['server_rss_mb']} MiB in the mixed phase, "
        f"{result['server_rss_high_water_mb']} MiB since the server started; data {result['data_mb']} MiB "
        f"({result['disk_mb_per_100k']} MiB per 100k memories)"
    )
    c = result["server_caches"]
    mib = {k: c[k] / 2**20 for k in ("index_session_bytes", "scope_vector_bytes", "text_posting_bytes")}
    reads = c["row_cache_hits"] + c["row_cache_misses"]
    console.print(
        f"in memory at the end: LanceDB session {mib['index_session_bytes']:.1f} MiB, scope vectors "
        f"{mib['scope_vector_bytes']:.1f} MiB, full-text postings {mib['text_posting_bytes']:.1f} MiB; "
        f"row cache {c['row_cache_rows']} rows, {c['row_cache_hits'] / max(reads, 1):.0%} of "
        f"{reads} reads answered; newest ids of {c['recent_id_scopes']} scopes, "
        f"{c['recent_id_hits'] / max(c['recent_id_hits'] + c['recent_id_misses'], 1):.0%} of newest-first "
        f"reads answered; fills skipped for a racing write: {c['row_cache_fills_skipped']} rows, "
        f"{c['recent_id_fills_skipped']} lists"
    )


def stop_and_keep_logs(launcher: Launcher, json_out: Path) -> list[str]:
    """Copies of the launched processes' logs beside the JSON (`<name>.logs/`): what explains
    a figure (a stall, an error's incident id) is only there, and the launcher's directory
    goes when the bench ends. The processes are stopped first, so that the logs end with
    what they say as they stop (the server's garbage-collector summary, say)."""
    logs = [proc.log for proc in launcher.processes]
    launcher.stop_processes()
    dest = json_out.with_name(json_out.stem + ".logs")
    dest.mkdir(parents=True, exist_ok=True)
    kept = []
    for log in logs:
        shutil.copyfile(log, dest / log.name)
        kept.append(str(dest / log.name))
    return kept


def parse_mix(text: str, known: list[str]) -> tuple[tuple[str, float], ...]:
    """'Recall=0.7,CreateMemory=0.3' -> (("Recall", 0.7), ("CreateMemory", 0.3))."""
    mix: list[tuple[str, float]] = []
    for part in text.split(","):
        name, _, weight = part.strip().partition("=")
        if name not in known or name in dict(mix):
            raise click.BadParameter(
                f"{name!r}: expected each of {', '.join(known)} at most once", param_hint="--mix"
            )
        try:
            value = float(weight)
        except ValueError:
            value = -1.0
        if not (math.isfinite(value) and value > 0):
            raise click.BadParameter(f"the weight of {name} must be a number above 0", param_hint="--mix")
        mix.append((name, value))
    return tuple(mix)


@click.command()
@click.option(
    "--memories",
    type=click.IntRange(min=0),
    default=100_000,
    show_default=True,
    help="Memories loaded first (0: the mix runs on what the server holds).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Concurrent clients, mixed phase.",
)
@click.option(
    "--duration",
    type=float,
    callback=finite_at_least(0.0, above=True),
    default=60.0,
    show_default=True,
    help="Seconds of each mixed workload.",
)
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--server", help="host:port of a running server; default: start a fresh server and sidecar.")
@click.option("--api-key", envvar="MNEMO_API_KEY")
@click.option(
    "--session-deadline-ms",
    type=float,
    callback=finite_at_least(0.0, above=True),
    default=120.0,
    show_default=True,
    help="StartSession budget of a started server.",
)
@click.option(
    "--train-sessions",
    type=click.IntRange(min=0),
    default=60,
    show_default=True,
    help="Synthetic sessions with feedback replayed (then the sidecar trains) before the workload.",
)
@click.option("--no-sidecar", is_flag=True, help="Start the server without a sidecar (no fault scenarios).")
@click.option(
    "--cross-encoder",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="A cross-encoder for the started sidecar.",
)
@click.option(
    "--mix",
    help="Operations of the mixed workload and their weights, e.g. 'Recall=1' for Recalls alone "
    "(default: all four, Recall the most; the JSON records the mix used).",
)
@click.option(
    "--fresh-queries",
    is_flag=True,
    help="Recall queries and session contexts that never repeat (default: templates, which "
    "mostly hit the server's query-embedding cache).",
)
@click.option(
    "--quick", is_flag=True, help="A small, fast run (2,000 memories, 5 s each) to check the command works."
)
def bench(
    memories: int,
    concurrency: int,
    duration: float,
    json_out: Path | None,
    server: str | None,
    api_key: str | None,
    session_deadline_ms: float,
    train_sessions: int,
    no_sidecar: bool,
    cross_encoder: Path | None,
    mix: str | None,
    fresh_queries: bool,
    quick: bool,
) -> None:
    """Load-test a server over gRPC: throughput, latency, RSS, disk, and StartSession with the
    sidecar running, stopped and killed."""
    from mnemo_server.evaluation.bench import BenchConfig, run_bench
    from mnemo_server.launcher import Launcher, stopped_after

    if json_out is not None:  # before a run a bad path would throw away (probe: after it)
        writable_output(json_out, "--json-out")

    scopes = BenchConfig.scopes
    if quick:
        memories, duration = min(memories, 2_000), min(duration, 5.0)
        concurrency, train_sessions = min(concurrency, 4), min(train_sessions, 20)
        # Few memories over the default 20 scopes leave a session ~30 visible ones, all
        # injected whatever their order: nothing for the replayed sessions to teach, so no
        # model would serve the quick run's StartSessions. Over 2 scopes the order matters.
        scopes = 2
    cfg = BenchConfig(
        memories=memories,
        concurrency=concurrency,
        duration_s=duration,
        train_sessions=train_sessions,
        session_deadline_ms=session_deadline_ms,
        fresh_queries=fresh_queries,
        scopes=scopes,
        fine_tune_during_mix=not quick,
    )
    if mix:
        cfg = replace(cfg, mix=parse_mix(mix, [name for name, _ in cfg.mix]))
    console = Console(stderr=True)
    launcher = None if server else Launcher()
    sidecar = None
    with stopped_after(launcher, console.print):
        if launcher is not None:
            console.print("starting a fresh server" + ("" if no_sidecar else " and sidecar") + " ...")
            env = {"MNEMO_RANKING__START_SESSION_DEADLINE_MS": str(session_deadline_ms)}
            if not no_sidecar:
                sidecar = launcher.start_sidecar(
                    {"MNEMO_SIDECAR_TRAINING__AUTO": "false"}, cross_encoder=cross_encoder
                )
                env["MNEMO_RANKING__SIDECAR_ADDRESS"] = sidecar.address
            server = launcher.start_server(env).address
        assert server is not None
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as bar:
            task = bar.add_task("loading", total=memories)
            result = asyncio.run(
                run_bench(
                    server,
                    api_key,
                    cfg,
                    lambda done, total: bar.update(task, completed=done, total=total),
                    sidecar=sidecar,
                    say=bar.console.print,
                )
            )
        if launcher is not None and json_out is not None:
            result["logs"] = stop_and_keep_logs(launcher, json_out)
    print_tables(result)
    click.echo(json.dumps(result, indent=1))
    if json_out:
        write_output(json_out, json.dumps(result, indent=1) + "\n")
