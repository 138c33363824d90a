"""`mnemo bench`: load and latency figures as a table and as JSON (see evaluation/bench.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def print_tables(result: dict[str, Any]) -> None:
    console = Console()
    load = result["load"]
    console.print(
        f"[bold]load[/]: {result['memories']} memories in {load['seconds']} s "
        f"({load['memories_per_s']}/s acknowledged), all searchable after {load['searchable_after_s']} s"
    )
    table = Table(title=f"mixed workload, concurrency {result['concurrency']}, {result['duration_s']} s")
    for col in ("operation", "count", "ops/s", "p50 ms", "p95 ms", "p99 ms", "max ms", "errors"):
        table.add_column(col, justify="left" if col in ("operation", "errors") else "right")
    for name, s in result["ops"].items():
        table.add_row(
            name,
            str(s["count"]),
            f"{s['throughput_per_s']:.1f}",
            f"{s['p50_ms']:.1f}",
            f"{s['p95_ms']:.1f}",
            f"{s['p99_ms']:.1f}",
            f"{s['max_ms']:.1f}",
            ", ".join(f"{k}:{v}" for k, v in s["errors"].items()) or "-",
        )
    console.print(table)
    cs = result["create_searchable"]
    console.print(
        f"created → searchable under load: p50 {cs['p50_s']} s, p99 {cs['p99_s']} s, max {cs['max_s']} s "
        f"({cs['samples']} samples)"
    )
    console.print(
        f"server RSS peak {result['server_rss_mb']} MB; data {result['data_mb']} MB "
        f"({result['disk_mb_per_100k']} MB per 100k memories)"
    )


@click.command()
@click.option("--memories", type=int, default=100_000, show_default=True, help="Memories loaded first.")
@click.option(
    "--concurrency", type=int, default=8, show_default=True, help="Concurrent clients, mixed phase."
)
@click.option("--duration", type=float, default=60.0, show_default=True, help="Seconds of mixed workload.")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--server", help="host:port of a running server; default: start a fresh one.")
@click.option("--api-key", envvar="MNEMO_API_KEY")
@click.option(
    "--quick", is_flag=True, help="A small, fast run (2,000 memories, 5 s) to check the command works."
)
def bench(
    memories: int,
    concurrency: int,
    duration: float,
    json_out: Path | None,
    server: str | None,
    api_key: str | None,
    quick: bool,
) -> None:
    """Load-test a server over gRPC and report throughput, latency, RSS and disk use."""
    from mnemo_server.evaluation.bench import BenchConfig, run_bench
    from mnemo_server.launcher import Launcher

    if quick:
        memories, duration, concurrency = min(memories, 2_000), min(duration, 5.0), min(concurrency, 4)
    cfg = BenchConfig(memories=memories, concurrency=concurrency, duration_s=duration)
    console = Console(stderr=True)
    launcher = None if server else Launcher()
    try:
        if launcher is not None:
            console.print("starting a fresh server ...")
            server = launcher.start_server().address
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
                    server, api_key, cfg, lambda done, total: bar.update(task, completed=done, total=total)
                )
            )
    finally:
        if launcher is not None:
            launcher.stop()
    print_tables(result)
    click.echo(json.dumps(result, indent=1))
    if json_out:
        json_out.write_text(json.dumps(result, indent=1) + "\n")
