"""`mnemo-sidecar`: serve the ranking sidecar, fine-tune a cross-encoder, inspect or train."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import click

from mnemo_server.api.server import announce_listening, withdraw_port_file
from mnemo_server.cli.common import Seconds
from mnemo_server.errors import MnemoError
from mnemo_server.launcher import wait_for_stop, watch_parent
from mnemo_server.process_memory import fix_malloc_thresholds
from mnemo_sidecar import __version__
from mnemo_sidecar.crossencoder.command import finetune_cross_encoder

F = TypeVar("F", bound=Callable[..., Any])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mnemo-sidecar")
@click.option("-v", "--verbose", is_flag=True)
def cli(verbose: bool) -> None:
    """The Mnemo ranking sidecar."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@cli.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    envvar="MNEMO_SIDECAR_CONFIG",
)
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--host")
@click.option("--port", type=int)
@click.option("--port-file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--cross-encoder",
    "cross_encoder",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="A Hugging Face-format cross-encoder directory to serve.",
)
@click.option("--parent-pid", type=int, hidden=True, help="Exit when this process is gone.")
def serve(
    config_file: Path | None,
    data_dir: Path | None,
    host: str | None,
    port: int | None,
    port_file: Path | None,
    cross_encoder: Path | None,
    parent_pid: int | None,
) -> None:
    """Run the sidecar until SIGTERM/SIGINT."""
    from mnemo_sidecar.app import SidecarServer
    from mnemo_sidecar.config import load_sidecar_config

    cfg = load_sidecar_config(config_file)
    server: dict[str, Any] = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    overrides: dict[str, dict[str, Any]] = {"server": server} if server else {}
    if data_dir is not None:
        overrides["storage"] = {"data_dir": str(data_dir)}
    if cross_encoder is not None:
        overrides["cross_encoder"] = {"path": str(cross_encoder)}
    if overrides:
        cfg = cfg.replace(**overrides)
    s = cfg.server
    fix_malloc_thresholds(s.malloc_mmap_threshold_kb, s.malloc_trim_threshold_kb)  # before any model loads
    app = SidecarServer(cfg)
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    bound = app.start()
    if parent_pid:
        watch_parent(parent_pid)
    announce_listening("mnemo-sidecar", cfg.server.host, bound, port_file)
    try:
        wait_for_stop(stop)
    finally:
        withdraw_port_file(port_file, bound)
        app.stop()


def _stub(address: str) -> Any:
    import grpc

    from mnemo.ranking.v1 import ranking_service_pb2_grpc as rpb_grpc

    return rpb_grpc.RankingServiceStub(grpc.insecure_channel(address))


def _metadata(auth_token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {auth_token}"),) if auth_token else ()


@contextmanager
def _one_line_errors() -> Iterator[None]:
    """A failed call is one line naming its status (it was a 30-line traceback)."""
    import grpc

    try:
        yield
    except grpc.RpcError as err:
        raise click.ClickException(f"{err.code().name}: {err.details()}") from None


def _sidecar_options(command: F) -> F:
    command = click.option(
        "--sidecar", default="127.0.0.1:50052", show_default=True, envvar="MNEMO_SIDECAR_ADDRESS"
    )(command)
    command = click.option("--tenant", default="default", show_default=True)(command)
    return click.option(
        "--auth-token",
        envvar="MNEMO_SIDECAR_SERVER__AUTH_TOKEN",
        help="The sidecar's server.auth_token, when it has one (env: MNEMO_SIDECAR_SERVER__AUTH_TOKEN, "
        "as the sidecar itself reads it).",
    )(command)


@cli.command()
@_sidecar_options
@click.option("--timeout", type=Seconds(), default=10.0, show_default=True, help="Deadline in seconds.")
def status(sidecar: str, tenant: str, auth_token: str | None, timeout: float) -> None:
    """Model versions, cold start, health, pair counts and latency for a tenant."""
    from google.protobuf import json_format

    from mnemo.ranking.v1 import ranking_service_pb2 as rpb

    with _one_line_errors():
        resp = _stub(sidecar).GetModelStatus(
            rpb.GetModelStatusRequest(tenant_id=tenant), timeout=timeout, metadata=_metadata(auth_token)
        )
    click.echo(json.dumps(json_format.MessageToDict(resp, preserving_proto_field_name=True), indent=1))


@cli.command()
@_sidecar_options
@click.option("--force", is_flag=True, help="Train even below the minimum number of sessions.")
@click.option(
    "--timeout", type=Seconds(), default=3600.0, show_default=True, help="Deadline of the run, in seconds."
)
def train(sidecar: str, tenant: str, auth_token: str | None, force: bool, timeout: float) -> None:
    """Train both models now and stream the progress."""
    from google.protobuf import json_format

    from mnemo.ranking.v1 import ranking_service_pb2 as rpb

    request = rpb.TrainRequest(tenant_id=tenant, force=force)
    with _one_line_errors():
        for event in _stub(sidecar).Train(request, timeout=timeout, metadata=_metadata(auth_token)):
            if event.HasField("outcome"):
                click.echo(
                    json.dumps(json_format.MessageToDict(event.outcome, preserving_proto_field_name=True))
                )
            else:
                click.echo(
                    f"[{rpb.ModelKind.Name(event.model)}] {event.stage} {event.progress:.0%} {event.message}",
                    err=True,
                )


@cli.command("bench-score")
@click.option("--sessions", default=5000, show_default=True, help="Synthetic sessions stored first.")
@click.option("--candidates", default=50, show_default=True, help="Candidates per session and Score.")
@click.option("--clients", default=2, show_default=True, help="Threads calling Score.")
@click.option("--deadline-ms", default=120.0, show_default=True, help="Each Score call's deadline.")
@click.option("--idle-s", default=10.0, show_default=True, help="Length of the idle phase.")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--quick", is_flag=True, help="200 sessions, 2 s idle: check that the command works.")
def bench_score(
    sessions: int,
    candidates: int,
    clients: int,
    deadline_ms: float,
    idle_s: float,
    json_out: Path | None,
    quick: bool,
) -> None:
    """Score's latency under its deadline, idle and while the sidecar trains a ranker on
    SESSIONS stored sessions (a fresh sidecar process on a free port)."""
    from mnemo_server.launcher import Launcher, stopped_after
    from mnemo_sidecar.score_bench import fill_pair_store, measure

    if quick:
        sessions, idle_s = min(sessions, 200), min(idle_s, 2.0)
    launcher = Launcher()
    with stopped_after(launcher, click.echo):
        data = launcher.root / "sidecar"
        click.echo(f"storing {sessions} synthetic sessions ...", err=True)
        fill_pair_store(data / "pairs.sqlite", sessions, candidates)
        side = launcher.start_sidecar({"MNEMO_SIDECAR_TRAINING__AUTO": "false"}, data_dir=data)
        result = {"sessions": sessions, **measure(side.address, clients, deadline_ms, idle_s, candidates)}
    click.echo(f"Score, {clients} clients, deadline {deadline_ms:.0f} ms, {sessions} stored sessions")
    click.echo(f"{'phase':<16}{'count':>8}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}  failures")
    for phase in ("idle", "while_training"):
        s = result[phase]
        figures = f"{s['count']:>8}{s['p50_ms']:>10}{s['p99_ms']:>10}{s['max_ms']:>10}"
        click.echo(f"{phase:<16}{figures}  {s['failures'] or '-'}")
    click.echo(f"the ranker's training took {result['training']['seconds']} s")
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=1) + "\n")


@cli.command("bench-residency")
@click.option(
    "--model",
    "model_dir",
    required=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="A fine-tuned cross-encoder (e.g. from finetune-cross-encoder), promoted for every tenant.",
)
@click.option("--tenants", default=12, show_default=True)
@click.option("--max-resident", default=8, show_default=True, help="cross_encoder.max_resident (0: all).")
@click.option("--seconds", default=30.0, show_default=True, help="Reranks, each tenant in turn.")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path))
def bench_residency(
    model_dir: Path, tenants: int, max_resident: int, seconds: float, json_out: Path | None
) -> None:
    """The sidecar's memory holding TENANTS tenants' fine-tunes with MAX_RESIDENT kept in
    memory, while one client calls Rerank on each tenant in turn (a fresh sidecar process)."""
    from mnemo_server.launcher import Launcher, stopped_after
    from mnemo_sidecar.config import load_sidecar_config
    from mnemo_sidecar.residency_bench import promote_for_tenants, rerank_in_turn

    precision = load_sidecar_config().cross_encoder.fine_tune_precision  # as the sidecar will read it
    launcher = Launcher()
    with stopped_after(launcher, click.echo):
        data = launcher.root / "sidecar"
        names = promote_for_tenants(data, model_dir, tenants, precision)
        env = {
            "MNEMO_SIDECAR_TRAINING__AUTO": "false",
            "MNEMO_SIDECAR_CROSS_ENCODER__MAX_RESIDENT": str(max_resident),
        }
        started = time.monotonic()
        side = launcher.start_sidecar(env, data_dir=data)
        ready_s = round(time.monotonic() - started, 1)
        result = {
            "tenants": tenants,
            "max_resident": max_resident,
            "precision": precision,
            "ready_s": ready_s,
            **rerank_in_turn(side.address, side.popen.pid, names, seconds),
        }
    rss, calls = result["rss_mb"], result["reranks"]
    click.echo(
        f"{tenants} tenants' fine-tunes ({precision}), max_resident {max_resident}, ready in {ready_s} s"
    )
    click.echo(f"RSS MB: after start {rss['after_start']}, peak {rss['peak']}, end {rss['end']}")
    click.echo(
        f"Reranks: {calls['count']} ({calls['by']['cross_encoder']} by the fine-tune, "
        f"{calls['by']['embedding_blend']} by the blend), p50 {calls['p50_ms']} ms, "
        f"p99 {calls['p99_ms']} ms, failures {calls['failures'] or '-'}"
    )
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=1) + "\n")


cli.add_command(finetune_cross_encoder, "finetune-cross-encoder")


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except MnemoError as exc:
        click.echo(f"error: {exc.message}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
