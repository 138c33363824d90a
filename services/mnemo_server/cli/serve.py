"""`mnemo up` (local, everything in one go) and `mnemo serve` (the server, from config)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import NoReturn

import click

from mnemo_server.api.server import announce_listening, is_loopback, withdraw_port_file
from mnemo_server.app import MnemoServer, StartCancelled
from mnemo_server.cli.common import build_config, config_options
from mnemo_server.config import Config
from mnemo_server.errors import FailedPrecondition
from mnemo_server.launcher import wait_for_stop, watch_parent
from mnemo_server.process_memory import (
    HeapRefreezer,
    fix_malloc_thresholds,
    freeze_warm_heap,
    limit_malloc_arenas,
    thaw_heap,
)

log = logging.getLogger(__name__)

# The exit status of a server whose store failed (EX_SOFTWARE): restart it.
EXIT_STORE_FAILED = 70


PARENT_PID = click.option(
    "--parent-pid",
    type=int,
    hidden=True,
    help="Exit when this process is gone (set by the launcher of child processes).",
)


def run_until_signalled(
    server: MnemoServer,
    port_file: Path | None = None,
    parent_pid: int | None = None,
    on_signal_received: Callable[[], object] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or a failed store); `on_signal_received` runs at once
    from the signal handler, before the drain."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s; draining", signal.Signals(signum).name)
        stop.set()
        if on_signal_received is not None:
            on_signal_received()

    # The watcher holds this event, not the server: a thread holding the server would keep
    # its DuckDB objects alive past the interpreter's last collection (nanobind reports leaks).
    failed = server.core.db.failed

    def on_store_failure() -> None:
        while not stop.is_set():
            if failed.wait(0.5):
                stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if port_file is not None:
        # Left by a server killed -9: it named a port nothing served while this one warmed
        # up, and a supervisor waiting for the file took a starting server for a serving one.
        port_file.unlink(missing_ok=True)
    try:
        port = server.start(cancelled=stop.is_set)
    except StartCancelled:
        click.echo("mnemo stopped before serving", err=True)
        return
    refreezer: HeapRefreezer | None = None
    if server.config.server.gc_freeze_after_warm_up:
        freeze_warm_heap()
        if server.config.server.gc_refreeze_after_ms > 0:
            refreezer = HeapRefreezer(server.config.server.gc_refreeze_after_ms)
            refreezer.install()
    if parent_pid:
        watch_parent(parent_pid)
    announce_listening("mnemo", server.config.server.host, port, port_file)
    threading.Thread(target=on_store_failure, name="store-failure", daemon=True).start()
    try:
        wait_for_stop(stop, on_wake=refreezer.freeze_if_due if refreezer else None)
    finally:
        withdraw_port_file(port_file, port)  # first: it says this port is served
        if failed.is_set():
            abandon(server)
        server.stop()
        if refreezer is not None:
            refreezer.uninstall()
            log.info("garbage collector while serving: %s", refreezer.summary())
        thaw_heap()
        click.echo("mnemo stopped", err=True)


def _check_port_file(port_file: Path | None, data_dir: str) -> None:
    """Before anything starts: a port file that cannot be written failed only once the
    server was serving, with a traceback and no orderly stop (so no index seal either).
    Its directory may be the data directory, which is made before serving (D/port in a
    fresh D was refused)."""
    if port_file is None or port_file.parent.is_dir():
        return
    if port_file.parent.resolve() != Path(data_dir).resolve():
        raise click.BadParameter(f"{port_file.parent} is not a directory", param_hint="--port-file")


def abandon(server: MnemoServer) -> NoReturn:
    """The store failed for good in this process (DuckDB invalidated the database after a
    fatal error): every call would fail INTERNAL from now on. Stop answering (health reports
    NOT_SERVING, calls in flight get a moment) and exit at once, as a kill -9 would: an
    orderly close writes to the store (the index seal). Acknowledged writes are in DuckDB's
    WAL; the next start replays it and checks the index against the store."""
    log.critical(
        "the store failed and this process cannot use it again (%s); exiting with status %d so "
        "that the server is restarted",
        server.core.db.failure,
        EXIT_STORE_FAILED,
    )
    try:
        server.grpc.stop(1.0)
    finally:
        logging.shutdown()
        os._exit(EXIT_STORE_FAILED)


@click.command()
@config_options
@click.option("--host", help="Bind address (overrides server.host).")
@click.option("--port", type=int, help="Port, 0 for any free one (overrides server.port).")
@click.option(
    "--port-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the bound port here once serving.",
)
@PARENT_PID
def serve(
    config_file: Path | None,
    data_dir: Path | None,
    host: str | None,
    port: int | None,
    port_file: Path | None,
    parent_pid: int | None,
) -> None:
    """Run the memory server (configured by file and MNEMO_* environment variables)."""
    server_overrides: dict[str, object] = {}
    if host:
        server_overrides["host"] = host
    if port is not None:
        server_overrides["port"] = port
    cfg = build_config(config_file, data_dir, server=server_overrides)
    _check_port_file(port_file, cfg.storage.data_dir)
    limit_malloc_arenas(cfg.server.malloc_arenas)  # before the server's threads exist
    fix_malloc_thresholds(cfg.server.malloc_mmap_threshold_kb, cfg.server.malloc_trim_threshold_kb)
    run_until_signalled(MnemoServer(cfg), port_file, parent_pid)


def local_config(config_file: Path | None, data_dir: Path | None, port: int | None) -> Config:
    """The local-development profile: no API keys (one 'default' tenant), so loopback only.
    The rest as `serve` takes it: defaults < the config file < the environment < a flag
    given. (--port defaulted to 50051 and overrode server.port of both; a host that is not
    loopback was replaced by 127.0.0.1 without a word.)"""
    cfg = build_config(
        config_file, data_dir, server={} if port is None else {"port": port}, auth={"enabled": False}
    )
    if not is_loopback(cfg.server.host):
        raise FailedPrecondition(
            f"mnemo up serves without API keys, so only on a loopback address, not server.host = "
            f"{cfg.server.host!r} (from --config or MNEMO_SERVER__HOST); for any other, run "
            "`mnemo serve` with authentication",
            reason="INSECURE_BIND",
        )
    return cfg


@click.command()
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where DuckDB, LanceDB and model caches live (the sidecar's in DIR/sidecar); default: "
    "storage.data_dir of the config file or MNEMO_STORAGE__DATA_DIR, else ./mnemo-data.",
)
@click.option(
    "--port",
    type=int,
    help="Port, 0 for any free one (overrides server.port of --config or MNEMO_SERVER__PORT; default 50051).",
)
@click.option("--sidecar-port", type=int, default=50052, show_default=True, help="0 for any free port.")
@click.option("--no-sidecar", is_flag=True, help="Run without the ranking sidecar (baseline ordering).")
@click.option(
    "--cross-encoder",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="A Hugging Face-format cross-encoder for the sidecar to serve.",
)
@click.option("--config", "config_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--port-file", type=click.Path(dir_okay=False, path_type=Path))
@PARENT_PID
def up(
    data_dir: Path | None,
    port: int | None,
    sidecar_port: int,
    no_sidecar: bool,
    cross_encoder: Path | None,
    config_file: Path | None,
    port_file: Path | None,
    parent_pid: int | None,
) -> None:
    """Run Mnemo locally: the memory server on loopback (127.0.0.1 unless server.host names
    another) and the ranking sidecar as its own process, data in a local directory,
    unauthenticated (local mode). A sidecar that stops on its own is started again, on the
    same port. Ctrl-C stops both."""
    from mnemo_server.app import DataPaths
    from mnemo_server.launcher import Launcher, LaunchFailed
    from mnemo_server.store.database import make_data_dir, refuse_if_in_use
    from mnemo_server.supervisor import Supervisor

    # Without --data-dir, as `serve` takes it (the --data-dir default wrote over both).
    cfg = local_config(config_file, data_dir, port)
    if not no_sidecar and sidecar_port != 0 and cfg.server.port == sidecar_port:
        # Found only after the server's warm-up (~24 s) as "the port is in use", its own
        # sidecar holding it (CLI probe).
        raise click.BadParameter(
            f"{sidecar_port} is the server's port too (--port or server.port)", param_hint="--sidecar-port"
        )
    _check_port_file(port_file, cfg.storage.data_dir)
    data_dir = Path(cfg.storage.data_dir)
    make_data_dir(data_dir)
    refuse_if_in_use(DataPaths(data_dir).duckdb)  # before a sidecar starts on its files
    launcher = Launcher(root=data_dir, keep=True)
    supervisor: Supervisor | None = None
    try:
        if not no_sidecar:
            try:
                sidecar = launcher.start_sidecar(
                    data_dir=data_dir / "sidecar", port=sidecar_port, cross_encoder=cross_encoder
                )
            except LaunchFailed as exc:
                raise click.ClickException(str(exc)) from None
            cfg = cfg.replace(ranking={"sidecar_address": sidecar.address})
            click.echo(f"mnemo up: sidecar on {sidecar.address} (log: {sidecar.log})", err=True)
            supervisor = Supervisor(
                sidecar,
                # On the port it had: the one the server calls.
                lambda: launcher.start_sidecar(
                    data_dir=data_dir / "sidecar",
                    port=sidecar.port,
                    cross_encoder=cross_encoder,
                    append_log=True,
                ),
                lambda message: click.echo(message, err=True),
            )
            supervisor.start()
        click.echo(f"mnemo up: data in {data_dir.resolve()}, local mode (no API key needed)", err=True)
        run_until_signalled(
            MnemoServer(cfg), port_file, parent_pid, supervisor.halt if supervisor is not None else None
        )
    finally:
        if supervisor is not None:
            supervisor.stop()
        launcher.stop()
