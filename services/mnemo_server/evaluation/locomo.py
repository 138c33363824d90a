"""`mnemo eval locomo`: load a LoCoMo-format directory into Mnemo through the public gRPC
API, run one Recall per query limited to its conversation, write the run file, and score it
with the same definitions as shared/eval/locomo/score.py.

Each conversation is its own project scope; each turn one episodic memory whose content
keeps the speaker ("Speaker: text"), whose event time is the session time, whose source
session is the dataset session, and whose external_id is the dataset memory_id (so the run
file names dataset ids)."""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo_client.client import MnemoClient
from mnemo_server.evaluation.metrics import Judged, category_label, evaluate
from mnemo_server.jsonl import json_lines

BATCH = 500


class DatasetError(ValueError):
    """A data directory not in the format of ../shared/eval/locomo (its README), said in
    one line that names the file and line."""


# What a line must hold (a JSON type, or None for any value), and what it may hold, of
# which type. Only what the eval needs is checked: a held-out split in the same format may
# carry other fields, or null where DEV has none (a turn's text is put into its memory as
# given; a query without gold ids is neither run nor scored, as score.py does).
Fields = dict[str, type | tuple[type, ...] | None]
MEMORY_FIELDS: Fields = {"conv_id": str, "memory_id": str, "speaker": None, "text": None, "session": None}
MEMORY_OPTIONAL: Fields = {"ts": (str, type(None))}
QUERY_FIELDS: Fields = {"conv_id": str, "query_id": str, "question": str}
QUERY_OPTIONAL: Fields = {"gold_memory_ids": (list, type(None))}


def read_jsonl(
    path: Path, required: Fields | None = None, optional: Fields | None = None
) -> Iterator[dict[str, Any]]:
    """The file's JSON objects, each checked to hold the `required` fields (of their types)
    and the `optional` ones, where present, of theirs."""
    for n, row in json_lines(path, DatasetError):
        problem = _problem(row, required or {}, optional or {})
        if problem:
            raise DatasetError(f"{path}:{n}: {problem}")
        yield row


def _problem(row: Any, required: Fields, optional: Fields) -> str:
    """What is wrong with a line's value ("" if nothing)."""
    if not isinstance(row, dict):
        return "expected a JSON object"
    missing = [name for name in required if name not in row]
    if missing:
        return f"{missing[0]!r} is missing"
    for name, kind in (*required.items(), *optional.items()):
        if name in row and kind is not None and not isinstance(row[name], kind):
            return f"{name!r} is not a {_kind_name(kind)}"
    if row.get("ts"):
        try:
            datetime.fromisoformat(row["ts"])
        except ValueError:
            return "'ts' is not an ISO 8601 time"
    return ""


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "string", list: "list", type(None): "null"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def conversation_scope(conv_id: str) -> common_pb2.Scope:
    return common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id=conv_id)


def to_memory(row: dict[str, Any]) -> memory_pb2.Memory:
    m = memory_pb2.Memory(
        content=f"{row['speaker']}: {row['text']}",
        external_id=row["memory_id"],
        type=common_pb2.MEMORY_TYPE_EPISODIC,
        category="conversation",
        scope=conversation_scope(row["conv_id"]),
        source=common_pb2.Source(
            who=str(row["speaker"]), why="dialog turn", session_id=f"{row['conv_id']}:{row['session']}"
        ),
    )
    if row.get("ts"):
        m.event_time.FromDatetime(datetime.fromisoformat(row["ts"]).replace(tzinfo=UTC))
    m.metadata.update({"speaker": row["speaker"], "session": row["session"], "turn": row.get("turn", 0)})
    return m


@dataclass
class EvalResult:
    metrics: dict[str, dict[str, float]]
    n_memories: int
    n_queries: int
    load_s: float
    searchable_s: float
    query_ms: list[float] = field(default_factory=list)
    disabled_stages: list[str] = field(default_factory=list)

    def timings(self) -> dict[str, float]:
        q = sorted(self.query_ms)
        return {
            "load_s": round(self.load_s, 2),
            "searchable_after_s": round(self.searchable_s, 2),
            "memories_per_s": round(self.n_memories / self.load_s, 1) if self.load_s else 0.0,
            "query_p50_ms": round(statistics.median(q), 2) if q else 0.0,
            "query_p95_ms": round(q[int(0.95 * (len(q) - 1))], 2) if q else 0.0,
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "n_memories": self.n_memories,
            "n_queries": self.n_queries,
            "disabled_stages": self.disabled_stages,
            "metrics": self.metrics,
            "timings": self.timings(),
        }


def load_memories(
    client: MnemoClient, rows: Sequence[dict[str, Any]], progress: Callable[[int], None] | None = None
) -> tuple[float, float]:
    """Returns (seconds until all acknowledged, seconds until all searchable)."""
    started = time.perf_counter()
    by_conv: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_conv[r["conv_id"]].append(r)
    done = 0
    for conv_id, conv_rows in by_conv.items():
        for start in range(0, len(conv_rows), BATCH):
            chunk = conv_rows[start : start + BATCH]
            # Deterministic request ids make a re-run against the same server a no-op.
            client.batch_create_memories(
                [to_memory(r) for r in chunk], request_id=f"locomo-{conv_id}-{start}", timeout_s=120
            )
            done += len(chunk)
            if progress:
                progress(done)
    acked = time.perf_counter() - started
    while client.status().pending_index_count:
        time.sleep(0.05)
    searchable = time.perf_counter() - started
    # Then wait until every row is inside the search indices, so the measurement does not
    # depend on when the background optimizer happens to run.
    while client.status().search_index_lag_rows:
        time.sleep(0.1)
    return acked, searchable


def run_queries(
    client: MnemoClient,
    queries: Sequence[dict[str, Any]],
    *,
    top_k: int,
    disabled_stages: Sequence[str],
    progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, list[str]], list[float]]:
    run: dict[str, list[str]] = {}
    timings: list[float] = []
    for n, q in enumerate(queries, 1):
        req = pb.RecallRequest(
            query=q["question"], top_k=top_k, options=pb.RecallOptions(disabled_stages=list(disabled_stages))
        )
        req.filter.scopes.append(conversation_scope(q["conv_id"]))
        t0 = time.perf_counter()
        resp = client.call(client.memory.Recall, req, timeout_s=30)
        timings.append((time.perf_counter() - t0) * 1000.0)
        run[q["query_id"]] = [h.memory.external_id for h in resp.hits]
        if progress:
            progress(n)
    return run, timings


def judged(queries: Sequence[dict[str, Any]]) -> list[Judged]:
    return [Judged(q["query_id"], category_label(q), frozenset(q["gold_memory_ids"])) for q in queries]


def write_run(path: Path, run: dict[str, list[str]]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for qid, ids in run.items():
            out.write(json.dumps({"query_id": qid, "ranked_memory_ids": ids}) + "\n")


def read_dataset(
    data: Path, *, scored_only: bool = True
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(memories, queries) of a data directory, the queries with gold ids only unless
    `scored_only` is off; DatasetError if it is not in the format."""
    memories = list(read_jsonl(data / "memories.jsonl", MEMORY_FIELDS, MEMORY_OPTIONAL))
    queries = list(read_jsonl(data / "queries.jsonl", QUERY_FIELDS, QUERY_OPTIONAL))
    return memories, [q for q in queries if q.get("gold_memory_ids") or not scored_only]


def evaluate_locomo(
    client: MnemoClient,
    memories: Sequence[dict[str, Any]],
    queries: Sequence[dict[str, Any]],
    out: Path,
    *,
    top_k: int = 50,
    disabled_stages: Sequence[str] = (),
    stage_names: Sequence[str] = (),
    on_load: Callable[[int], None] | None = None,
    on_query: Callable[[int], None] | None = None,
) -> EvalResult:
    load_s, searchable_s = load_memories(client, memories, on_load)
    run, timings = run_queries(
        client, queries, top_k=top_k, disabled_stages=disabled_stages, progress=on_query
    )
    write_run(out, run)
    return EvalResult(
        evaluate(judged(queries), run),
        len(memories),
        len(queries),
        load_s,
        searchable_s,
        timings,
        list(stage_names),
    )
