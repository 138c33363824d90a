"""`mnemo bench-tenants`: many tenants under the bound on those whose search indices stay in
memory, as a table and as JSON (see evaluation/tenants_bench.py)."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from grpc import aio
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from mnemo_server.evaluation.tenants_bench import TenantsBenchConfig
    from mnemo_server.launcher import LaunchedProcess, Launcher


def _table(result: dict[str, Any]) -> Table:
    table = Table(title=f"Recall on random tenants, concurrency {result['concurrency']}")
    for col in ("tenant's indices", "count", "p50 ms", "p95 ms", "p99 ms", "max ms", "retried", "errors"):
        table.add_column(col, justify="left" if col in ("tenant's indices", "errors") else "right")
    for name, label in (("kept", "in memory"), ("loading", "loaded by the Recall")):
        s = result["recalls"][name]
        table.add_row(
            label,
            str(s["count"]),
            *(f"{s[k]:.1f}" for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")),
            str(s["retried_unavailable"]),
            ", ".join(f"{k}:{v}" for k, v in s["errors"].items()) or "-",
        )
    return table


def print_result(result: dict[str, Any]) -> None:
    console = Console()
    load, start, end = result["load"], result["restart"], result["end"]
    console.print(
        f"[bold]load[/]: {result['tenants']} tenants x {result['memories_per_tenant']} memories in "
        f"{load['seconds']} s ({load['memories_per_s']}/s), "
        f"all searchable after {load['searchable_after_s']} s"
    )
    console.print(
        f"[bold]restart[/] (max_resident_tenants {result['max_resident_tenants']}, max_resident_rows "
        f"{result['max_resident_rows']}): serving after {start['seconds_to_serving']} s, RSS "
        f"{start['rss_mb']} MiB, {start['residency']['tenants']} tenants open, "
        f"{start['residency']['rows']} rows loaded"
    )
    console.print(_table(result))
    r = result["recalls"]
    console.print(
        f"top hit is the memory asked for: {r['top_hit_is_the_memory_asked']:.1%}; at the end RSS "
        f"{end['rss_mb']} MiB (peak {end['rss_peak_mb']} MiB since the restart), "
        f"{end['residency']['tenants']} tenants open, {end['residency']['loads']} loads and "
        f"{end['residency']['drops']} drops since the restart"
    )


@click.command("bench-tenants")
@click.option("--tenants", type=int, default=200, show_default=True)
@click.option("--memories-per-tenant", type=int, default=300, show_default=True)
@click.option(
    "--max-resident-tenants",
    type=int,
    default=50,
    show_default=True,
    help="index.max_resident_tenants of the started server (0: no bound).",
)
@click.option(
    "--max-resident-rows",
    type=int,
    default=0,
    show_default=True,
    help="index.max_resident_rows of the started server (0: no bound).",
)
@click.option(
    "--min-idle-s",
    type=float,
    default=0.0,
    show_default=True,
    help="index.resident_min_idle_s of the started server (its default, 30, keeps every tenant "
    "the Recalls touched within the run).",
)
@click.option("--recalls", type=int, default=400, show_default=True)
@click.option("--concurrency", type=int, default=4, show_default=True)
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--quick", is_flag=True, help="A small, fast run (6 tenants x 40 memories) to check the command works."
)
def bench_tenants(
    tenants: int,
    memories_per_tenant: int,
    max_resident_tenants: int,
    max_resident_rows: int,
    min_idle_s: float,
    recalls: int,
    concurrency: int,
    json_out: Path | None,
    quick: bool,
) -> None:
    """Start a server, load many tenants, restart it under a bound on the tenants whose search
    indices stay in memory, then Recall on random tenants: start-up time, RSS, and Recall
    latency for tenants kept and tenants loaded by the Recall."""
    from mnemo_server.evaluation.tenants_bench import TenantsBenchConfig
    from mnemo_server.launcher import Launcher, stopped_after

    if quick:
        tenants, memories_per_tenant = min(tenants, 6), min(memories_per_tenant, 40)
        max_resident_tenants, recalls = min(max_resident_tenants, 2), min(recalls, 30)
    cfg = TenantsBenchConfig(
        tenants=tenants, memories_per_tenant=memories_per_tenant, recalls=recalls, concurrency=concurrency
    )
    admin_key = secrets.token_urlsafe(24)
    env = {
        "MNEMO_AUTH__ENABLED": "true",
        "MNEMO_AUTH__ADMIN_KEY": admin_key,
        "MNEMO_INDEX__MAX_RESIDENT_TENANTS": str(max_resident_tenants),
        "MNEMO_INDEX__MAX_RESIDENT_ROWS": str(max_resident_rows),
        "MNEMO_INDEX__RESIDENT_MIN_IDLE_S": str(min_idle_s),
    }
    console = Console(stderr=True)
    launcher = Launcher()
    with stopped_after(launcher, console.print):
        console.print("starting a fresh server ...")
        server = launcher.start_server(env)
        result = asyncio.run(_run(launcher, server, env, admin_key, cfg, console))
    result.update(
        max_resident_tenants=max_resident_tenants, max_resident_rows=max_resident_rows, min_idle_s=min_idle_s
    )
    print_result(result)
    click.echo(json.dumps(result, indent=1))
    if json_out:
        json_out.write_text(json.dumps(result, indent=1) + "\n")


async def _run(
    launcher: Launcher,
    server: LaunchedProcess,
    env: dict[str, str],
    admin_key: str,
    cfg: TenantsBenchConfig,
    console: Console,
) -> dict[str, Any]:
    from mnemo_server.evaluation import tenants_bench as tb

    result: dict[str, Any] = {
        "tenants": cfg.tenants,
        "memories_per_tenant": cfg.memories_per_tenant,
        "concurrency": cfg.concurrency,
    }
    async with aio.insecure_channel(server.address) as channel:
        console.print(f"creating {cfg.tenants} tenants and loading their memories ...")
        made = await tb.create_tenants(channel, admin_key, cfg)
        tenth = max(1, cfg.tenants * cfg.memories_per_tenant // 10)

        def progress(done: int, total: int) -> None:
            if done % tenth < cfg.batch:
                console.print(f"  {done}/{total} memories")

        result["load"] = await tb.load(channel, made, cfg, progress)
    console.print("restarting the server ...")
    launcher.end(server)
    started = time.perf_counter()
    server = launcher.start_server(env)
    serving_after = time.perf_counter() - started
    first = next(iter(made.metadata.values()))
    async with aio.insecure_channel(server.address) as channel:
        at_start = await tb.status(channel, first)
        result["restart"] = {
            "seconds_to_serving": round(serving_after, 2),
            "rss_mb": round(at_start.process_rss_bytes / 2**20, 1),
            "residency": tb.residency(at_start),
        }
        console.print(f"{cfg.recalls} Recalls on random tenants ...")
        result["recalls"] = await tb.recalls(channel, made, cfg)
        end = await tb.status(channel, first)
        result["end"] = {
            "rss_mb": round(end.process_rss_bytes / 2**20, 1),
            "rss_peak_mb": round(end.process_peak_rss_bytes / 2**20, 1),
            "residency": tb.residency(end),
        }
    return result
