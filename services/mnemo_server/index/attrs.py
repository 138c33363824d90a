"""Hit attributes: what Recall's signals read about each candidate and what filters other
than scopes test, and the per-tenant cache of them that spares the searches a read of
those columns from the Lance file (~2 ms per leg at 100k rows)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import pyarrow as pa

from mnemo_server.memory.model import MemoryFilter


class Attrs(NamedTuple):
    """What Recall's signals read, carried in the index so ranking needs no extra lookup
    (DuckDB still has the last word on every hit that is returned). A tuple, so the cache
    can keep its fields as a plain tuple (see AttrsCache)."""

    text: str
    scope: str
    session: str
    event_time_ns: int
    importance: float
    seq: int
    type: str
    category: str
    pinned: bool
    create_time_ns: int

    def passes(self, f: MemoryFilter) -> bool:
        """The filter on these attributes, as lance_index.filter_sql puts it to LanceDB."""
        return (
            (not f.scopes or any(s.key == self.scope for s in f.scopes))
            and (not f.types or any(t.value == self.type for t in f.types))
            and (not f.categories or self.category in f.categories)
            and (not f.source_session_ids or self.session in f.source_session_ids)
            and (not f.pinned_only or self.pinned)
            and f.create_time.contains(self.create_time_ns)
            and f.event_time.contains(self.event_time_ns)
        )


ATTR_COLUMNS = ["text", "scope", "session", "event_time_ns", "importance", "seq"]
ATTR_COLUMNS += ["type", "category", "pinned", "create_time_ns"]


def read_attrs(table: pa.Table) -> list[tuple[str, Attrs]]:
    """(id, Attrs) of each row of a table read with the "id" column and ATTR_COLUMNS."""
    ids = table.column("id").to_pylist()
    columns = {c: table.column(c).to_pylist() for c in ATTR_COLUMNS}
    # Scopes, sessions, types and categories repeat across many rows: one string object each.
    for c in ("scope", "session", "type", "category"):
        columns[c] = [sys.intern(x) for x in columns[c]]
    rows = zip(*(columns[c] for c in ATTR_COLUMNS), strict=True)
    return [(i, Attrs(*row)) for i, row in zip(ids, rows, strict=True)]


_new = tuple.__new__  # makes an Attrs of a cached entry (AttrsCache.lookup says why)


class AttrsCache:
    """id -> Attrs of one tenant's indexed rows, kept by the index's own writes (~0.5 KB an
    entry). Plain dict operations: safe to read from many threads while one writes.

    Entries are plain tuples, made Attrs again when looked up (~0.3 us each). Python's
    collector stops tracking a plain tuple of strings and numbers, not an instance of a
    class (a NamedTuple's or a dataclass's): with one Attrs object per indexed row, a
    server that had loaded 100k memories since it started walked 100k more objects in
    every full collection, and those collections, each a stop of every thread, had grown
    from ~10 to ~60 ms (its warm-up heap is frozen out of the collector's reach, but not
    what it indexes afterwards)."""

    def __init__(self, max_rows: int):
        self.max_rows = max_rows
        self._by_id: dict[str, tuple[object, ...]] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def remember(self, entries: Iterable[tuple[str, Attrs]], *, overwrite: bool) -> None:
        """Writes overwrite; reads only fill gaps (a read from an older snapshot racing a
        write must not put the older text back). Past the cap, only known ids change."""
        room = self.max_rows - len(self._by_id)
        for mid, a in entries:
            if mid in self._by_id:
                if overwrite:
                    self._by_id[mid] = tuple(a)
            elif room > 0:
                self._by_id[mid] = tuple(a)
                room -= 1

    def forget(self, ids: Iterable[str]) -> None:
        for mid in ids:
            self._by_id.pop(mid, None)

    def lookup(self, ids: Sequence[str]) -> tuple[dict[str, Attrs], list[str]]:
        """(the cached ones, the ids not cached)."""
        # tuple.__new__ is what Attrs._make calls, less its Python frame (~25 % of this
        # call, which was ~6 % of the server's GIL time under the bench mix); an entry is
        # always a whole Attrs, so _make's length check has nothing to find.
        found = {i: _new(Attrs, a) for i in ids if (a := self._by_id.get(i)) is not None}
        return found, [i for i in ids if i not in found]
