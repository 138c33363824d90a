"""Reading JSONL input files (eval data, rerank pairs, imports): each line's value with its
number, and one error naming the file, and the line, for whatever cannot be read."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def json_lines(path: Path, error: Callable[[str], Exception]) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line; `error(message)` is raised for a line
    that is not JSON or not UTF-8, and for a file that cannot be opened."""
    try:
        # Bytes, decoded a line at a time: a text-mode reader reports a bad byte by its
        # position in the decoder's current chunk, which is neither the line nor the offset.
        with path.open("rb") as fh:
            for n, raw in enumerate(fh, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    bad = f"byte {raw[exc.start]:#04x}, byte {exc.start + 1} of the line"
                    raise error(f"{path}:{n}: not UTF-8 text ({bad})") from None
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise error(f"{path}:{n}: bad JSON ({exc})") from None
                yield n, value
    except OSError as exc:
        raise error(f"{path}: {exc.strerror or exc}") from None
