"""`mnemo eval locomo`: retrieval quality through the public API (see evaluation/locomo.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from mnemo.v1 import memory_service_pb2 as pb
from mnemo_client.client import MnemoClient, MnemoError
from mnemo_server.cli.common import writable_output, write_output

if TYPE_CHECKING:
    from mnemo_server.evaluation.locomo import Naming

# CLI name -> proto enum name (the stubs accept enum names).
STAGES: dict[str, str] = {
    name.removeprefix("RECALL_STAGE_").lower(): name
    for name in pb.RecallStage.keys()  # noqa: SIM118 - an enum wrapper, not a dict
    if name != "RECALL_STAGE_UNSPECIFIED"
}


@click.group("eval")
def eval_group() -> None:
    """Measure retrieval quality."""


@eval_group.command("locomo")
@click.option(
    "--data",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    required=True,
    help="Directory with memories.jsonl and queries.jsonl (LoCoMo format).",
)
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="RUN.jsonl to write."
)
@click.option(
    "--json-out", type=click.Path(dir_okay=False, path_type=Path), help="Also write the metrics JSON."
)
@click.option("--server", help="host:port of a running server; default: start a fresh one for this run.")
@click.option("--api-key", envvar="MNEMO_API_KEY", help="Tenant key for --server (env: MNEMO_API_KEY).")
@click.option(
    "--disable-stage",
    "disabled",
    multiple=True,
    type=click.Choice(sorted(STAGES)),
    help="Switch a Recall stage off (repeatable) to measure its contribution.",
)
@click.option(
    "--top-k",
    type=click.IntRange(10, 100),
    default=50,
    show_default=True,
    help="Ids per query in the run file (10-100; 100 is the server's default limit).",
)
@click.option(
    "--keep-data",
    is_flag=True,
    help="Keep the temporary server's data directory (with --server: keep this run's memories there).",
)
@click.option(
    "--train-sessions",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Replay this split's queries as sessions with feedback, let the sidecar train, and "
    "compare DATA through StartSession before and after. RUN.jsonl is then the trained "
    "pipeline's run, and each phase's run is written beside it (RUN.<phase>.jsonl).",
)
@click.option("--sidecar", help="host:port of the sidecar of --server (for --train-sessions).")
@click.option(
    "--cross-encoder",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="A cross-encoder for a started sidecar to serve and fine-tune from.",
)
@click.option("--tenant", default="default", show_default=True, help="The tenant whose models are trained.")
def locomo(
    data: Path,
    out: Path,
    json_out: Path | None,
    server: str | None,
    api_key: str | None,
    disabled: tuple[str, ...],
    top_k: int,
    keep_data: bool,
    train_sessions: Path | None,
    sidecar: str | None,
    cross_encoder: Path | None,
    tenant: str,
) -> None:
    """Load a LoCoMo-format split, Recall every query within its conversation, score the run.
    With --train-sessions: measure learning from sessions instead (see session_eval.py)."""
    writable_output(out, "--out")  # checked before any work that a bad path would throw away
    if json_out is not None:
        writable_output(json_out, "--json-out")
    if train_sessions is not None:
        _locomo_sessions(
            data, out, json_out, server, sidecar, api_key, train_sessions, cross_encoder, tenant, keep_data
        )
        return
    from mnemo_server.evaluation.locomo import evaluate_locomo
    from mnemo_server.launcher import Launcher, stopped_after

    memories, queries = _dataset(data)  # checked before any server starts
    console = Console(stderr=True)
    launcher = None if server else Launcher(keep=keep_data)
    naming = _naming(fresh_server=launcher is not None)
    with stopped_after(launcher, console.print):
        if launcher is not None:
            console.print("starting a fresh server ...")
            server = launcher.start_server().address
        assert server is not None
        with (
            MnemoClient(server, api_key, timeout_s=120) as client,
            _cleared_after(
                client, naming, {m["conv_id"] for m in memories}, launcher is None and not keep_data
            ),
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            ) as bar,
        ):
            load_task = bar.add_task("loading memories", total=len(memories))
            query_task = bar.add_task("recall per query", total=len(queries))
            result = evaluate_locomo(
                client,
                memories,
                queries,
                out,
                naming,
                top_k=top_k,
                disabled_stages=[STAGES[s] for s in disabled],
                stage_names=list(disabled),
                on_load=lambda n: bar.update(load_task, completed=n),
                on_query=lambda n: bar.update(query_task, completed=n),
            )
    if result.short_lines:
        console.print(
            f"[yellow]warning: {result.short_lines} of {result.n_queries} queries got fewer than 10 ids: "
            "their conversation is smaller, or the stages left on found no more[/]"
        )
    table = Table(
        title=f"LoCoMo retrieval ({result.n_queries} queries, {result.n_memories} memories"
        + (f"; disabled: {', '.join(disabled)}" if disabled else "")
        + ")"
    )
    names = ["Recall@1", "Recall@5", "Recall@10", "MRR@10", "NDCG@10"]
    table.add_column("group")
    table.add_column("n", justify="right")
    for name in names:
        table.add_column(name, justify="right")
    for group, row in result.metrics.items():
        table.add_row(group, str(int(row["n"])), *(f"{row[n]:.4f}" for n in names))
    Console().print(table)
    doc = result.as_json()
    click.echo(json.dumps(doc, indent=1))
    if json_out:
        write_output(json_out, json.dumps(doc, indent=1) + "\n")


def _locomo_sessions(
    data: Path,
    out: Path,
    json_out: Path | None,
    server: str | None,
    sidecar: str | None,
    api_key: str | None,
    train: Path,
    cross_encoder: Path | None,
    tenant: str,
    keep_data: bool,
) -> None:
    from mnemo_server.evaluation.locomo import write_run
    from mnemo_server.evaluation.session_eval import SidecarControl, evaluate_with_training
    from mnemo_server.launcher import Launcher, stopped_after

    if (server is None) != (sidecar is None):
        raise click.UsageError("--server and --sidecar go together (or neither: both are started)")
    data_rows, data_queries = _dataset(data)  # both checked before any server starts
    train_rows, train_queries = _dataset(train)
    console = Console(stderr=True)
    launcher = None if server else Launcher(keep=keep_data)
    naming = _naming(fresh_server=launcher is not None)
    with stopped_after(launcher, console.print):
        if launcher is not None:
            console.print("starting a fresh sidecar and server ...")
            side = launcher.start_sidecar(
                {"MNEMO_SIDECAR_TRAINING__AUTO": "false"}, cross_encoder=cross_encoder
            )
            sidecar = side.address
            # A quality measurement: give the sidecar all the time it needs (bench measures latency).
            server = launcher.start_server(
                {
                    "MNEMO_RANKING__SIDECAR_ADDRESS": sidecar,
                    "MNEMO_RANKING__START_SESSION_DEADLINE_MS": "30000",
                }
            ).address
        assert server is not None
        assert sidecar is not None
        conversations = {r["conv_id"] for r in [*data_rows, *train_rows]}
        with (
            MnemoClient(server, api_key, timeout_s=120) as client,
            _cleared_after(client, naming, conversations, launcher is None and not keep_data),
        ):
            result = evaluate_with_training(
                client,
                SidecarControl(sidecar, tenant),
                data_rows,
                data_queries,
                train_rows,
                train_queries,
                console.print,
                naming,
            )
    names = ["Recall@1", "Recall@5", "Recall@10", "MRR@10", "NDCG@10"]
    table = Table(
        title=f"LoCoMo through StartSession: {len(data_queries)} queries, trained on "
        f"{result.train_sessions} sessions ({result.training_seconds:.0f} s of training)"
    )
    table.add_column("phase")
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("ordering")
    for p in result.phases:
        table.add_row(
            p.name,
            *(f"{p.metrics['overall'][n]:.4f}" for n in names),
            ", ".join(f"{k}:{v}" for k, v in p.paths.items()),
        )
    Console().print(table)
    doc = result.as_json()
    # RUN.jsonl is the fully trained pipeline's run (the last phase); each phase's run is
    # written beside it, so score.py can judge any of them.
    write_run(out, result.phases[-1].run)
    for p in result.phases:
        write_run(phase_run_path(out, p.name), p.run)
    click.echo(json.dumps(doc, indent=1))
    if json_out:
        write_output(json_out, json.dumps(doc, indent=1) + "\n")


def _dataset(data: Path, *, scored_only: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The directory's memories and queries (with gold ids only, unless `scored_only` is
    off), or a one-line error naming the file and line that is not in the format."""
    from mnemo_server.evaluation.locomo import DatasetError, read_dataset

    try:
        memories, queries = read_dataset(data, scored_only=scored_only)
    except DatasetError as exc:
        raise click.ClickException(str(exc)) from None
    if scored_only and not queries:
        raise click.ClickException(
            f"{data / 'queries.jsonl'}: no query has gold_memory_ids: nothing to score"
        )
    return memories, queries


def _naming(fresh_server: bool) -> Naming:
    """A fresh server holds this run alone; on a shared one the run's names are its own."""
    from mnemo_server.evaluation.locomo import Naming

    return Naming() if fresh_server else Naming.for_shared_server()


@contextmanager
def _cleared_after(
    client: MnemoClient, naming: Naming, conversations: set[str], clear: bool
) -> Iterator[None]:
    """On a shared server, the run's memories are purged once it ends (its scopes are its
    own), so runs neither pile up nor weigh on each other's BM25 statistics."""
    try:
        yield
    finally:
        if clear and conversations:
            try:
                client.purge_memories(naming.scopes(conversations), force=True)
            except MnemoError as exc:
                click.echo(f"could not purge this run's memories from the server: {exc}", err=True)


def phase_run_path(out: Path, phase: str) -> Path:
    """RUN.jsonl -> RUN.<phase>.jsonl ("+" in a phase's name becomes "-")."""
    return out.with_name(f"{out.stem}.{phase.replace('+', '-')}{out.suffix or '.jsonl'}")


@eval_group.command("locomo-split")
@click.option("--data", type=click.Path(file_okay=False, exists=True, path_type=Path), required=True)
@click.option("--convs", required=True, help="Comma-separated conversation ids to keep.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
def locomo_split(data: Path, convs: str, out: Path) -> None:
    """Write the subset of a LoCoMo-format directory that covers some conversations."""
    keep = {c.strip() for c in convs.split(",") if c.strip()}
    memories, queries = _dataset(data, scored_only=False)  # checked before anything is written
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("memories.jsonl", memories), ("queries.jsonl", queries)):
        lines = [json.dumps(row, ensure_ascii=False) for row in rows if row["conv_id"] in keep]
        (out / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        click.echo(f"{out / name}: {len(lines)} lines")
