"""Hit attributes: what Recall's signals read about each candidate, and the per-tenant
cache of them that spares the searches a read of those columns from the Lance file
(~2 ms per leg at 100k rows)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True, slots=True)
class Attrs:
    """What Recall's signals read, carried in the index so ranking needs no extra lookup
    (DuckDB still has the last word on every hit that is returned)."""

    text: str
    scope: str
    session: str
    event_time_ns: int
    importance: float
    seq: int


ATTR_COLUMNS = ["text", "scope", "session", "event_time_ns", "importance", "seq"]


def read_attrs(table: pa.Table) -> list[tuple[str, Attrs]]:
    """(id, Attrs) of each row of a table read with the "id" column and ATTR_COLUMNS."""
    ids = table.column("id").to_pylist()
    text, scope, session, event_time_ns, importance, seq = (table.column(c).to_pylist() for c in ATTR_COLUMNS)
    # Scopes and sessions repeat across many rows: one string object each.
    scope = [sys.intern(x) for x in scope]
    session = [sys.intern(x) for x in session]
    rows = zip(text, scope, session, event_time_ns, importance, seq, strict=True)
    return [(i, Attrs(*row)) for i, row in zip(ids, rows, strict=True)]


class AttrsCache:
    """id -> Attrs of one tenant's indexed rows, kept by the index's own writes (~0.5 KB an
    entry). Plain dict operations: safe to read from many threads while one writes."""

    def __init__(self, max_rows: int):
        self.max_rows = max_rows
        self._by_id: dict[str, Attrs] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def remember(self, entries: Iterable[tuple[str, Attrs]], *, overwrite: bool) -> None:
        """Writes overwrite; reads only fill gaps (a read from an older snapshot racing a
        write must not put the older text back). Past the cap, only known ids change."""
        room = self.max_rows - len(self._by_id)
        for mid, a in entries:
            if mid in self._by_id:
                if overwrite:
                    self._by_id[mid] = a
            elif room > 0:
                self._by_id[mid] = a
                room -= 1

    def forget(self, ids: Iterable[str]) -> None:
        for mid in ids:
            self._by_id.pop(mid, None)

    def lookup(self, ids: Sequence[str]) -> tuple[dict[str, Attrs], list[str]]:
        """(the cached ones, the ids not cached)."""
        found = {i: a for i in ids if (a := self._by_id.get(i)) is not None}
        return found, [i for i in ids if i not in found]
