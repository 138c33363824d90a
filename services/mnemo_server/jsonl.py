"""Reading JSONL input files (eval data, rerank pairs): each line's value with its number,
and one error naming the file, and the line, for whatever cannot be read."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def json_lines(path: Path, error: Callable[[str], Exception]) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line; `error(message)` is raised for a line
    that is not JSON, a file that cannot be opened, or one that is not UTF-8."""
    try:
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise error(f"{path}:{n}: bad JSON ({exc})") from None
                yield n, value
    except OSError as exc:
        raise error(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc})") from None
