"""Commands that work on a data directory directly (the server must be stopped)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mnemo_server.app import Core, DataPaths
from mnemo_server.cli.common import build_config, config_options
from mnemo_server.config import Config
from mnemo_server.errors import FailedPrecondition


def _rebuild(core: Core, label: str) -> int:
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    ) as bar:
        task = bar.add_task(label, total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return core.rebuild_index(progress)


def _existing_store(cfg: Config) -> None:
    """These commands rebuild a store that exists: a mistyped --data-dir made a fresh empty
    one there and reported success ("re-indexed 0 memories")."""
    store = DataPaths(Path(cfg.storage.data_dir)).duckdb
    if not store.is_file():
        raise FailedPrecondition(
            f"{cfg.storage.data_dir} is not a Mnemo data directory (no {store.name}); nothing to rebuild",
            reason="BAD_DATA_DIR",
        )


@click.command()
@config_options
def reembed(config_file: Path | None, data_dir: Path | None) -> None:
    """Adopt the configured embedding model: re-embed every memory and rebuild the index."""
    cfg = build_config(config_file, data_dir)
    _existing_store(cfg)
    core = Core(cfg, accept_model_change=True)
    try:
        n = _rebuild(core, f"re-embedding with {core.embedder.model_id}")
    finally:
        core.close()
    click.echo(f"re-embedded {n} memories with {cfg.embedding.model}")


@click.command()
@config_options
def reindex(config_file: Path | None, data_dir: Path | None) -> None:
    """Rebuild the LanceDB index from DuckDB (the source of truth)."""
    cfg = build_config(config_file, data_dir)
    _existing_store(cfg)
    core = Core(cfg)
    try:
        n = _rebuild(core, "re-indexing")
    finally:
        core.close()
    click.echo(f"re-indexed {n} memories")
