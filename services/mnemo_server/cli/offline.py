"""Commands that work on a data directory directly (the server must be stopped)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mnemo_server.app import Core
from mnemo_server.cli.common import build_config, config_options


def _rebuild(core: Core, label: str) -> int:
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    ) as bar:
        task = bar.add_task(label, total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return core.rebuild_index(progress)


@click.command()
@config_options
def reembed(config_file: Path | None, data_dir: Path | None) -> None:
    """Adopt the configured embedding model: re-embed every memory and rebuild the index."""
    cfg = build_config(config_file, data_dir)
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
    core = Core(cfg)
    try:
        n = _rebuild(core, "re-indexing")
    finally:
        core.close()
    click.echo(f"re-indexed {n} memories")
