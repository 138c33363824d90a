"""`mnemo memory import` reads a file of exported memories: a line that is not one is a
one-line error naming it, whatever JSON it holds (cli/remote.py)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from mnemo_server.cli.remote import _memories


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("7", "number"),
        ("2.5", "number"),
        ("null", "null"),
        ("true", "true or false"),
        ('"x"', "string"),
        ("[1]", "array"),
    ],
)
def test_a_line_that_is_json_but_not_an_object_is_one_error_naming_it(
    tmp_path: Path, line: str, kind: str
) -> None:
    """A number, null or true ended in a 30-line traceback (TypeError from ParseDict)."""
    path = tmp_path / "export.jsonl"
    path.write_text('{"content": "first", "create_time": "2026-01-01T00:00:00Z"}\n' + line + "\n")
    read = _memories(path)
    assert next(read)[1].content == "first"
    with pytest.raises(click.ClickException) as err:
        next(read)
    assert err.value.message == f"{path}:2: not an exported memory (a JSON {kind}, not an object)"
