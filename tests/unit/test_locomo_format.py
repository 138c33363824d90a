"""Reading a LoCoMo-format directory: what the eval needs is checked, line by line, and a
directory not in the format is one error naming the file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mnemo_server.evaluation.locomo import DatasetError, read_dataset
from tests.conftest import SHARED

TURN = {
    "conv_id": "c1",
    "memory_id": "c1:D1:1",
    "session": 1,
    "speaker": "Ann",
    "text": "hi",
    "ts": "2023-05-08T13:56:00",
}
QUERY = {"conv_id": "c1", "query_id": "q1", "question": "who said hi?", "gold_memory_ids": ["c1:D1:1"]}


def _dir(tmp_path: Path, memories: list[Any], queries: list[Any]) -> Path:
    for name, rows in (("memories.jsonl", memories), ("queries.jsonl", queries)):
        (tmp_path / name).write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_the_dev_split_reads_whole() -> None:
    memories, queries = read_dataset(SHARED / "eval" / "locomo")
    assert (len(memories), len(queries)) == (2080, 582)


def test_what_the_eval_does_not_need_may_differ(tmp_path: Path) -> None:
    """A held-out split may carry other fields, or nulls: a turn's text is taken as given, a
    query without gold is left out (score.py leaves it out too)."""
    memories = [{**TURN, "text": None, "blip_caption": "a dog"}, {**TURN, "memory_id": "c1:D1:2", "ts": None}]
    queries = [
        QUERY,
        {**QUERY, "query_id": "q2", "gold_memory_ids": None},
        {**QUERY, "query_id": "q3"} | {"gold_memory_ids": []},
    ]
    got_memories, got_queries = read_dataset(_dir(tmp_path, memories, queries))
    assert len(got_memories) == 2 and [q["query_id"] for q in got_queries] == ["q1"]


@pytest.mark.parametrize(
    ("memories", "queries", "said"),
    [
        ([TURN, "{not json\n"], [QUERY], r"memories\.jsonl:2: bad JSON"),
        (
            [{k: v for k, v in TURN.items() if k != "speaker"}],
            [QUERY],
            r"memories\.jsonl:1: 'speaker' is missing",
        ),
        ([{**TURN, "memory_id": 7}], [QUERY], r"memories\.jsonl:1: 'memory_id' is not a string"),
        ([{**TURN, "ts": "last tuesday"}], [QUERY], r"memories\.jsonl:1: 'ts' is not an ISO 8601 time"),
        (
            [TURN],
            [{**QUERY, "gold_memory_ids": "c1:D1:1"}],
            r"queries\.jsonl:1: 'gold_memory_ids' is not a list or null",
        ),
        ([TURN], ["[1, 2]\n"], r"queries\.jsonl:1: expected a JSON object"),
    ],
)
def test_a_directory_not_in_the_format_is_one_error_naming_the_line(
    tmp_path: Path, memories: list[Any], queries: list[Any], said: str
) -> None:
    with pytest.raises(DatasetError, match=said):
        read_dataset(_dir(tmp_path, memories, queries))


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"memories\.jsonl: No such file"):
        read_dataset(tmp_path)
