"""Options and helpers shared by the commands."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from mnemo_server.config import Config, load_config

F = TypeVar("F", bound=Callable[..., Any])


def config_options(fn: F) -> F:
    fn = click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="Data directory (overrides storage.data_dir).",
    )(fn)
    return click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        envvar="MNEMO_CONFIG",
        help="TOML config file (env: MNEMO_CONFIG).",
    )(fn)


def build_config(config_file: Path | None, data_dir: Path | None, **sections: dict[str, Any]) -> Config:
    cfg = load_config(config_file)
    overrides = {k: v for k, v in sections.items() if v}
    if data_dir is not None:
        overrides.setdefault("storage", {})["data_dir"] = str(data_dir)
    return cfg.replace(**overrides) if overrides else cfg
