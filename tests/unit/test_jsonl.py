"""The JSONL reader names the line of whatever it cannot read, wherever in the file it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnemo_server.jsonl import json_lines


class Refused(Exception):
    pass


def test_a_byte_that_is_not_utf8_is_named_by_its_line_far_into_the_file(tmp_path: Path) -> None:
    """Far past the first 8 KiB, where a text-mode reader only knows its chunk's position."""
    lines = [f'{{"n": {i}, "text": "some words on line {i}"}}\n'.encode() for i in range(1, 1201)]
    lines[999] = lines[999][:10] + b"\xff" + lines[999][11:]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(lines))
    read: list[int] = []

    def read_all() -> None:
        read.extend(value["n"] for _, value in json_lines(path, Refused))

    with pytest.raises(Refused, match=r"in\.jsonl:1000: not UTF-8 text \(byte 0xff, byte 11 of the line\)"):
        read_all()
    assert read == list(range(1, 1000))


def test_blank_lines_are_skipped_and_crlf_lines_read(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes('{"a": 1}\r\n\r\n  \n{"a": "é"}'.encode())
    assert list(json_lines(path, Refused)) == [(1, {"a": 1}), (4, {"a": "é"})]


def test_bad_json_and_a_missing_file_are_one_error_each(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"a": 1}\n{nope\n')
    with pytest.raises(Refused, match=r"in\.jsonl:2: bad JSON"):
        list(json_lines(path, Refused))
    with pytest.raises(Refused, match=r"missing\.jsonl: No such file"):
        list(json_lines(tmp_path / "missing.jsonl", Refused))
