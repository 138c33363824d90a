"""Options and helpers shared by the commands."""

from __future__ import annotations

import math
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


_MAX_TIMEOUT_S = 365 * 24 * 3600


class Seconds(click.ParamType[float, Any]):
    """A deadline: more than 0 seconds, at most a year. 0, a negative, nan or inf made every
    call fail at once with DEADLINE_EXCEEDED, which blamed a healthy server; so did a finite
    value past about 7e9 s (grpc's deadline, now + timeout in int64 nanoseconds, overflows)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        seconds = click.FLOAT.convert(value, param, ctx)
        if not 0 < seconds <= _MAX_TIMEOUT_S:  # nan fails every comparison
            self.fail(
                f"{value!r}: must be more than 0 seconds and at most {_MAX_TIMEOUT_S} (a year)", param, ctx
            )
        return seconds


def writable_output(path: Path, option: str) -> None:
    """Refuse, before any work a bad path would throw away, an output file the command could
    not write at its end: its folder must exist and take the file. Opened for append (and
    removed again if it was not there), since os.access says yes to root for anything."""
    folder = path.parent  # "." for a bare file name
    if not folder.is_dir():
        raise click.BadParameter(f"{folder} is not a directory", param_hint=option)
    existed = path.exists()
    if path.is_dir():
        raise click.BadParameter(f"{path} is a directory", param_hint=option)
    try:
        with path.open("a"):
            pass
    except OSError as exc:
        raise click.BadParameter(
            f"{path} cannot be written: {exc.strerror or exc}", param_hint=option
        ) from None
    if not existed:
        path.unlink(missing_ok=True)


def write_output(path: Path, text: str) -> None:
    """Write a result file; failing (a full disk), one line instead of a traceback."""
    try:
        path.write_text(text)
    except OSError as exc:
        raise click.ClickException(f"{path} could not be written: {exc.strerror or exc}") from None


def finite_at_least(
    low: float, *, above: bool = False
) -> Callable[[click.Context, click.Parameter, float], float]:
    """A click callback: the value must be a finite number >= low (> low with `above`);
    click's FloatRange lets NaN through."""

    def check(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
        if value is None:
            return value
        if not math.isfinite(value) or value < low or (above and value == low):
            raise click.BadParameter(f"must be a finite number {'above' if above else 'of at least'} {low:g}")
        return value

    return check
