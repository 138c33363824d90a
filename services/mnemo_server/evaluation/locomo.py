"""`mnemo eval locomo`: load a LoCoMo-format directory into Mnemo through the public gRPC
API, run one Recall per query limited to its conversation, write the run file, and score it
with the same definitions as shared/eval/locomo/score.py.

Each conversation is its own project scope; each turn one episodic memory whose content
keeps the speaker ("Speaker: text"), whose event time is the session time, whose source
session is the dataset session, and whose dataset memory_id is kept in its metadata and, with
its conversation's, in its external_id (Naming), so the run file names dataset ids. Turns
are stored in (session, turn) order, whatever the file's: a memory's neighbours in its
session are the turns stored before and after it.

Everything the server would refuse is checked first, naming the file and line, before any
server starts: a split that gets that far loads whole."""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo_client.client import MnemoClient
from mnemo_server.errors import MnemoError
from mnemo_server.evaluation.metrics import Judged, category_label, evaluate
from mnemo_server.jsonl import json_lines

BATCH = 500
# How long the loaded memories may take to become searchable before the run gives up.
INDEX_WAIT_S = 1800.0
# The server's default limits (config.LimitsConfig), which a split is checked against.
MAX_TEXT_CHARS = 20_000
MAX_QUESTION_CHARS = 4_000
MAX_SPEAKER_CHARS = 256
MAX_METADATA_BYTES = 16_384
# The times a memory may carry: 64-bit nanoseconds from the epoch.
EARLIEST = datetime(1677, 9, 21, 0, 12, 44, tzinfo=UTC)
LATEST = datetime(2262, 4, 11, 23, 47, 16, tzinfo=UTC)
_SERVER_NAME = re.compile(r"[\x21-\x7e]{1,64}")  # what a dataset id may be as a server name


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
# What is wrong with a line's value beyond its fields' types ("" if nothing).
Check = Callable[[dict[str, Any]], str]


def read_jsonl(
    path: Path,
    required: Fields | None = None,
    optional: Fields | None = None,
    check: Check | None = None,
) -> Iterator[dict[str, Any]]:
    """The file's JSON objects, each checked to hold the `required` fields (of their types)
    and the `optional` ones, where present, of theirs, then by `check` (what is wrong, or "")."""
    for n, row in json_lines(path, DatasetError):
        problem = _problem(row, required or {}, optional or {}) or (check(row) if check else "")
        if problem:
            raise DatasetError(f"{path}:{n}: {problem}")
        yield row


def _memory_problem(row: dict[str, Any]) -> str:
    """What the server would refuse in a turn's memory ("" if nothing)."""
    content = f"{row['speaker']}: {row['text']}"
    if len(content) > MAX_TEXT_CHARS:
        return f"'speaker' and 'text' make {len(content)} characters; a memory holds at most {MAX_TEXT_CHARS}"
    if "\x00" in content:
        return "'speaker' or 'text' holds a NUL character"
    if len(str(row["speaker"])) > MAX_SPEAKER_CHARS:
        return f"'speaker' is longer than {MAX_SPEAKER_CHARS} characters"
    for name in ("session", "turn"):
        value = row.get(name)
        if isinstance(value, float) and not math.isfinite(value):
            return f"{name!r} is not a finite number"
        if isinstance(value, (dict, list)):
            return f"{name!r} is not a number or a string"
    kept = len(json.dumps(_metadata(row), separators=(",", ":"), ensure_ascii=False).encode())
    if kept > MAX_METADATA_BYTES:
        return (
            f"'memory_id', 'speaker', 'session' and 'turn' make {kept} bytes of metadata; "
            f"the limit is {MAX_METADATA_BYTES}"
        )
    if row.get("ts"):
        when = datetime.fromisoformat(row["ts"]).replace(tzinfo=UTC)  # as to_memory stores it
        if not EARLIEST <= when <= LATEST:
            return "'ts' is outside 1677-09-21T00:12:44Z .. 2262-04-11T23:47:16Z (64-bit nanoseconds)"
    return ""


def _query_problem(row: dict[str, Any]) -> str:
    question = row["question"]
    if not question.strip():
        return "'question' is empty"
    if len(question) > MAX_QUESTION_CHARS:
        return f"'question' is {len(question)} characters; a query holds at most {MAX_QUESTION_CHARS}"
    if "\x00" in question:
        return "'question' holds a NUL character"
    return ""


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


def server_name(dataset_id: str) -> str:
    """A dataset id as a name the server takes (visible ASCII without spaces, at most 64
    characters here, so that names built of two stay within the server's limits): itself,
    or else a digest of it."""
    if _SERVER_NAME.fullmatch(dataset_id):
        return dataset_id
    return "h-" + hashlib.sha256(dataset_id.encode()).hexdigest()[:40]


def _without_slash(name: str) -> str:
    return name if "/" not in name else "h-" + hashlib.sha256(name.encode()).hexdigest()[:40]


class Naming:
    """The server's names for a split's conversations and turns. A conversation is a project
    scope; a turn's external id is its conversation's name and its own (a memory_id need only
    be unique within its conversation, an external id is unique in a tenant). Against a
    shared server (`--server`) a tag makes one run's names its own, so that another run, of
    this split or another, neither replays nor mixes with it."""

    def __init__(self, tag: str = ""):
        self.tag = tag
        self._dataset_ids: dict[str, str] = {}  # external id -> dataset memory_id

    @staticmethod
    def for_shared_server() -> Naming:
        return Naming(uuid.uuid4().hex[:8])

    def conversation(self, conv_id: str) -> str:
        return server_name(conv_id) + (f"@{self.tag}" if self.tag else "")

    def scope(self, conv_id: str) -> common_pb2.Scope:
        return common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id=self.conversation(conv_id))

    def external_id(self, conv_id: str, memory_id: str) -> str:
        # Neither part holds the "/" that joins them: conversation "a" with turn "b/c" and
        # conversation "a/b" with turn "c" were both "a/b/c" (probe: ALREADY_EXISTS).
        name = f"{_without_slash(self.conversation(conv_id))}/{_without_slash(server_name(memory_id))}"
        self._dataset_ids[name] = memory_id
        return name

    def session_id(self, prefix: str, query_id: str) -> str:
        return server_name(f"{prefix}-{query_id}") + (f"@{self.tag}" if self.tag else "")

    def scopes(self, conv_ids: Iterable[str]) -> memory_pb2.MemoryFilter:
        """A filter on these conversations' scopes."""
        return memory_pb2.MemoryFilter(scopes=[self.scope(c) for c in sorted(set(conv_ids))])

    def request_id(self, *parts: str) -> str:
        """A request id for the parts (dataset ids among them): deterministic, so that a
        retried call takes effect once."""
        joined = "\x00".join([self.tag, *parts])
        return "locomo-" + hashlib.sha256(joined.encode()).hexdigest()[:40]

    def dataset_id(self, external_id: str) -> str | None:
        """The dataset memory_id of a hit; None for one that is no turn of this run."""
        return self._dataset_ids.get(external_id)

    def dataset_ids(self, external_ids: Sequence[str]) -> list[str]:
        """The dataset memory_ids of these hits; a hit that is no turn of this run (another
        client's memory on a shared server) is left out."""
        known = self._dataset_ids
        return [known[e] for e in external_ids if e in known]

    def to_memory(self, row: dict[str, Any]) -> memory_pb2.Memory:
        conv = row["conv_id"]
        m = memory_pb2.Memory(
            content=f"{row['speaker']}: {row['text']}",
            external_id=self.external_id(conv, row["memory_id"]),
            type=common_pb2.MEMORY_TYPE_EPISODIC,
            category="conversation",
            scope=self.scope(conv),
            source=common_pb2.Source(
                who=str(row["speaker"]),
                why="dialog turn",
                session_id=f"{self.conversation(conv)}:{server_name(str(row['session']))}",
            ),
        )
        if row.get("ts"):
            when = datetime.fromisoformat(row["ts"])
            # A time without a zone is taken as UTC; one with a zone keeps its wall-clock
            # time (the session's local day and hour, which questions ask about).
            m.event_time.FromDatetime(when.replace(tzinfo=UTC))
        m.metadata.update(_metadata(row))
        return m


def _metadata(row: dict[str, Any]) -> dict[str, Any]:
    """What a turn's memory keeps of it in metadata."""
    return {
        "memory_id": row["memory_id"],
        "speaker": row["speaker"],
        "session": row["session"],
        "turn": row.get("turn", 0),
    }


def in_session_order(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation's turns by (session, turn), numbers before other values, the file's
    order where those tie."""

    def position(value: Any) -> tuple[int, float, str]:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return (0, float(value), "")
        if isinstance(value, str) and value.strip().lstrip("-").replace(".", "", 1).isdigit():
            return (0, float(value), "")
        return (1, 0.0, str(value))

    return sorted(rows, key=lambda r: (position(r.get("session")), position(r.get("turn"))))


@dataclass
class EvalResult:
    metrics: dict[str, dict[str, float]]
    n_memories: int
    n_queries: int
    load_s: float
    searchable_s: float
    query_ms: list[float] = field(default_factory=list)
    disabled_stages: list[str] = field(default_factory=list)
    # Queries whose run line holds fewer than 10 ids (their conversation is smaller, or the
    # stages left on found no more).
    short_lines: int = 0

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
            "short_lines": self.short_lines,
            "metrics": self.metrics,
            "timings": self.timings(),
        }


def load_memories(
    client: MnemoClient,
    rows: Sequence[dict[str, Any]],
    naming: Naming,
    progress: Callable[[int], None] | None = None,
) -> tuple[float, float]:
    """Returns (seconds until all acknowledged, seconds until all searchable)."""
    started = time.perf_counter()
    by_conv: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_conv[r["conv_id"]].append(r)
    done = 0
    for conv_id, conv_rows in by_conv.items():
        ordered = in_session_order(conv_rows)
        for start in range(0, len(ordered), BATCH):
            chunk = ordered[start : start + BATCH]
            client.batch_create_memories(
                [naming.to_memory(r) for r in chunk],
                request_id=naming.request_id(conv_id, str(start)),
                timeout_s=120,
            )
            done += len(chunk)
            if progress:
                progress(done)
    acked = time.perf_counter() - started
    limit = started + INDEX_WAIT_S
    _wait(lambda: not client.status().pending_index_count, 0.05, limit, "searchable")
    searchable = time.perf_counter() - started
    # Then wait until every row is inside the search indices, so the measurement does not
    # depend on when the background optimizer happens to run.
    _wait(lambda: not client.status().search_index_lag_rows, 0.1, limit, "inside the search indices")
    return acked, searchable


def _wait(done: Callable[[], bool], every_s: float, until: float, what: str) -> None:
    while not done():
        if time.perf_counter() > until:
            # GetStatus says why (index_last_failure_reason); the server's log has the details.
            raise MnemoError(
                f"the loaded memories were not all {what} within {INDEX_WAIT_S:.0f} s of the load"
            )
        time.sleep(every_s)


def run_queries(
    client: MnemoClient,
    queries: Sequence[dict[str, Any]],
    naming: Naming,
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
        req.filter.scopes.append(naming.scope(q["conv_id"]))
        t0 = time.perf_counter()
        resp = client.call(client.memory.Recall, req, timeout_s=30)
        timings.append((time.perf_counter() - t0) * 1000.0)
        run[q["query_id"]] = naming.dataset_ids([h.memory.external_id for h in resp.hits])
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
    `scored_only` is off; DatasetError if it is not in the format, or holds a memory_id twice
    in a conversation or a query_id twice (one would stand for the other)."""
    memories = list(
        read_jsonl(
            data / "memories.jsonl",
            MEMORY_FIELDS,
            MEMORY_OPTIONAL,
            _all_of(
                _memory_problem,
                _once(
                    lambda r: (r["conv_id"], r["memory_id"]),
                    "memory_id {1!r} is already in conversation {0!r}",
                ),
            ),
        )
    )
    queries = list(
        read_jsonl(
            data / "queries.jsonl",
            QUERY_FIELDS,
            QUERY_OPTIONAL,
            _all_of(_query_problem, _once(lambda q: (q["query_id"],), "query_id {0!r} is already used")),
        )
    )
    return memories, [q for q in queries if q.get("gold_memory_ids") or not scored_only]


def _all_of(*checks: Check) -> Check:
    """The first problem any of the checks finds."""
    return lambda row: next((p for p in (c(row) for c in checks) if p), "")


def _once(key: Callable[[dict[str, Any]], tuple[str, ...]], says: str) -> Check:
    """A check that a row's key was in no row before it (`says` formats the key)."""
    seen: set[tuple[str, ...]] = set()

    def check(row: dict[str, Any]) -> str:
        k = key(row)
        if k in seen:
            return says.format(*k)
        seen.add(k)
        return ""

    return check


def evaluate_locomo(
    client: MnemoClient,
    memories: Sequence[dict[str, Any]],
    queries: Sequence[dict[str, Any]],
    out: Path,
    naming: Naming,
    *,
    top_k: int = 50,
    disabled_stages: Sequence[str] = (),
    stage_names: Sequence[str] = (),
    on_load: Callable[[int], None] | None = None,
    on_query: Callable[[int], None] | None = None,
) -> EvalResult:
    load_s, searchable_s = load_memories(client, memories, naming, on_load)
    run, timings = run_queries(
        client, queries, naming, top_k=top_k, disabled_stages=disabled_stages, progress=on_query
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
        short_lines=sum(1 for ids in run.values() if len(ids) < 10),
    )
