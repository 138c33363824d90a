"""Reading a LoCoMo-format directory: what the eval needs is checked, line by line, and a
directory not in the format is one error naming the file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mnemo_server.evaluation.locomo import DatasetError, Naming, in_session_order, read_dataset, server_name
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
        # What the server would refuse, found before any server starts.
        ([TURN, TURN], [QUERY], r"memories\.jsonl:2: memory_id 'c1:D1:1' is already in conversation 'c1'"),
        ([TURN], [QUERY, QUERY], r"queries\.jsonl:2: query_id 'q1' is already used"),
        ([{**TURN, "text": "x" * 20_000}], [QUERY], r"memories\.jsonl:1: 'speaker' and 'text' make 20005"),
        ([{**TURN, "text": "a\x00b"}], [QUERY], r"memories\.jsonl:1: 'speaker' or 'text' holds a NUL"),
        ([{**TURN, "speaker": "S" * 257}], [QUERY], r"memories\.jsonl:1: 'speaker' is longer than 256"),
        (
            [
                TURN,
                json.dumps({**TURN, "memory_id": "m", "turn": float("nan")}) + "\n",  # NaN, as JSON allows
            ],
            [QUERY],
            r"memories\.jsonl:2: 'turn' is not a finite number",
        ),
        ([{**TURN, "ts": "1500-01-01T00:00:00"}], [QUERY], r"memories\.jsonl:1: 'ts' is outside 1677-09-21"),
        (
            [{**TURN, "memory_id": "m" * 17_000}],
            [QUERY],
            r"memories\.jsonl:1: 'memory_id', 'speaker', 'session' and 'turn' make 17\d{3} bytes",
        ),
        ([TURN], [{**QUERY, "question": "  "}], r"queries\.jsonl:1: 'question' is empty"),
        ([TURN], [{**QUERY, "question": "q" * 4_001}], r"queries\.jsonl:1: 'question' is 4001 characters"),
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


def test_a_memory_id_need_only_be_unique_in_its_conversation(tmp_path: Path) -> None:
    """Ids of real splits begin with their conversation's, but the format does not say so:
    the same memory_id in two conversations is two turns, with two external ids."""
    memories = [TURN, {**TURN, "conv_id": "c2"}]
    got, _ = read_dataset(_dir(tmp_path, memories, [QUERY]))
    naming = Naming()
    names = [naming.to_memory(r).external_id for r in got]
    assert names == ["c1/c1:D1:1", "c2/c1:D1:1"]
    assert naming.dataset_ids([*names, "someone-else"]) == ["c1:D1:1", "c1:D1:1"]  # foreign hits left out
    # A "/" in either id: conversation "a" with turn "b/c" and conversation "a/b" with turn
    # "c" were one external id, "a/b/c", and the load failed ALREADY_EXISTS (probe).
    one = naming.to_memory({**TURN, "conv_id": "a", "memory_id": "b/c"}).external_id
    other = naming.to_memory({**TURN, "conv_id": "a/b", "memory_id": "c"}).external_id
    assert one != other and one.count("/") == other.count("/") == 1
    assert naming.dataset_ids([one, other]) == ["b/c", "c"]


def test_ids_the_server_would_refuse_become_digests_and_a_shared_server_run_gets_a_tag() -> None:
    assert server_name("conv-26:D1:3") == "conv-26:D1:3"
    for odd in ("conv 26", "konversation-ü", "x" * 65, ""):
        name = server_name(odd)
        assert name.startswith("h-") and len(name) == 42 and name == server_name(odd)
    row = {**TURN, "conv_id": "a conversation", "memory_id": "turn one", "session": "S 1"}
    m = Naming().to_memory(row)
    assert m.external_id == f"{server_name('a conversation')}/{server_name('turn one')}"
    assert m.scope.id == server_name("a conversation") and m.metadata["memory_id"] == "turn one"
    assert m.source.session_id == f"{server_name('a conversation')}:{server_name('S 1')}"
    shared = Naming.for_shared_server()
    assert (
        shared.scope("c1").id == f"c1@{shared.tag}" and shared.session_id("p", "q1") == f"p-q1@{shared.tag}"
    )
    assert shared.request_id("c1", "0") != Naming().request_id("c1", "0")


def test_turns_are_stored_in_session_and_turn_order_whatever_the_files() -> None:
    """A memory's neighbours are the turns stored before and after it in its session."""
    rows = [
        {**TURN, "memory_id": m, "session": s, "turn": t}
        for m, s, t in [("b", 2, 1), ("a", 1, 10), ("c", 1, 2), ("d", "x", 1), ("e", 1, 2), ("f", "10", 1)]
    ]
    assert [r["memory_id"] for r in in_session_order(rows)] == ["c", "e", "a", "b", "f", "d"]
