"""SQL for the memories table and its audit history. Functions take a cursor so callers
decide the transaction; nothing here calls a model or the network."""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from mnemo_server.memory.model import (
    HistoryEntry,
    Memory,
    MemoryFilter,
    MemoryType,
    Scope,
    ScopeKind,
    Source,
    TimeRange,
)
from mnemo_server.retrieval.query_analysis import speaker_of
from mnemo_server.store import recent_ids
from mnemo_server.store.database import Cursor, deferring, fetch_one
from mnemo_server.store.hash_filter import ContentHashFilter
from mnemo_server.store.recent_ids import RecentIds
from mnemo_server.store.row_cache import (
    Row,
    RowCache,
    rows_changed,
    rows_written,
)
from mnemo_server.store.sql_literals import insert_text
from mnemo_server.store.stored_summary import StoredSummary

# Column order shared by SELECTs, the row decoder and rows in the row cache.
COLUMNS = (
    "tenant_id",
    "id",
    "seq",
    "external_id",
    "scope_kind",
    "scope_id",
    "type",
    "category",
    "content",
    "content_hash",
    "importance",
    "confidence",
    "pinned",
    "source_who",
    "source_why",
    "source_run_id",
    "source_session_id",
    "metadata",
    "event_time_ns",
    "create_time_ns",
    "update_time_ns",
    "delete_time_ns",
    "supersedes_id",
    "superseded_by_id",
    "revision",
    "embedding_model",
    "indexed_revision",
    "indexed_model",
    "access_count",
)
SELECT_COLUMNS = ", ".join(COLUMNS)
_ACCESS_COUNT = COLUMNS.index("access_count")
# Columns with few distinct values across a tenant's rows (numbered by their combination in
# the row cache); scope ids, metadata and run ids can be one per row and stay in each row.
_SHARED_COLUMNS: tuple[str, ...] = ("tenant_id", "scope_kind", "type", "category", "source_who")
_SHARED_COLUMNS += ("source_why", "embedding_model", "indexed_model")


def new_row_cache(max_rows: int) -> RowCache:
    """A cache of `memories` rows as this module reads them (see `read_many`)."""
    return RowCache(max_rows, COLUMNS.index("id"), frozenset(COLUMNS.index(c) for c in _SHARED_COLUMNS))


def arrow_view(cur: Cursor, name: str, rows: list[dict[str, Any]]) -> AbstractContextManager[None]:
    """Expose Python rows to SQL as a named relation for one statement (fast bulk writes:
    DuckDB's executemany costs ~1 ms a row, an Arrow scan microseconds)."""
    return _registered(cur, name, pa.Table.from_pylist(rows))


@contextmanager
def _registered(cur: Cursor, name: str, table: pa.Table) -> Iterator[None]:
    """table, named `name` to SQL on this cursor for the block."""
    cur.register(name, table)
    try:
        yield
    finally:
        cur.unregister(name)


# Up to this many rows a parameterised VALUES list is cheaper than registering an Arrow table;
# beyond it Arrow wins by far, as a VALUES list costs more than linearly in its size. Inside a
# transaction at 100k memories, VALUES against Arrow (ms): memories (30 columns) 1 row 1.3 / 2.5,
# 5 rows 2.3 / 2.5, 10 rows 3.7 / 3.0, 50 rows 23.6 / 3.5; session_memories (15 columns) 1 row
# 0.8 / 1.9, 5 rows 2.0 / 2.6, 10 rows 3.1 / 1.9, 50 rows 7.5 / 1.9. (It was 50 until that was
# measured: a StartSession's candidates and every batch of creates took the slow way, under
# the write lock.)
_VALUES_MAX_ROWS = 5


def insert_rows(cur: Cursor, table: str, rows: list[dict[str, Any]]) -> None:
    """Insert dicts (all with the same keys) in one statement; a few rows in a transaction
    that defers writes go with its next statement (TransactionCursor.defer)."""
    cols = list(rows[0])
    names = ", ".join(cols)
    if len(rows) <= _VALUES_MAX_ROWS:
        tx = deferring(cur)
        if tx is not None and (text := insert_text(table, cols, rows)) is not None:
            tx.defer(text)
            return
        one = "(" + ", ".join("?" * len(cols)) + ")"
        cur.execute(
            f"INSERT INTO {table} ({names}) VALUES {', '.join([one] * len(rows))}",
            [r[c] for r in rows for c in cols],
        )
        return
    with arrow_view(cur, f"new_{table}", rows):
        cur.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM new_{table}")


# Enum lookups by value through a dict: calling the enum class is ~1 us each, and Recall,
# StartSession and listings decode thousands of rows a second.
_SCOPE_KINDS = {k.value: k for k in ScopeKind}
_TYPES = {t.value: t for t in MemoryType}


def _decode(row: Sequence[Any]) -> Memory:
    (
        tenant_id,
        mid,
        seq,
        external_id,
        scope_kind,
        scope_id,
        mtype,
        category,
        content,
        content_hash,
        importance,
        confidence,
        pinned,
        who,
        why,
        run_id,
        session_id,
        metadata,
        event_ns,
        create_ns,
        update_ns,
        delete_ns,
        supersedes_id,
        superseded_by_id,
        revision,
        embedding_model,
        indexed_revision,
        indexed_model,
        access_count,
    ) = row
    return Memory(
        id=mid,
        tenant_id=tenant_id,
        seq=seq,
        external_id=external_id or "",
        scope=Scope(_SCOPE_KINDS[scope_kind], scope_id),
        type=_TYPES[mtype],
        category=category,
        content=content,
        content_hash=content_hash,
        importance=float(importance),
        confidence=float(confidence),
        pinned=bool(pinned),
        source=Source(who, why, run_id, session_id),
        metadata={} if metadata == "{}" else json.loads(metadata),
        event_time_ns=event_ns,
        create_time_ns=create_ns,
        update_time_ns=update_ns,
        delete_time_ns=delete_ns,
        supersedes_id=supersedes_id,
        superseded_by_id=superseded_by_id,
        revision=revision,
        embedding_model=embedding_model,
        indexed=(indexed_revision == revision and indexed_model == embedding_model),
        access_count=access_count,
    )


def _row_values(m: Memory, normalized: str) -> dict[str, Any]:
    return {
        "tenant_id": m.tenant_id,
        "id": m.id,
        "seq": m.seq,
        "external_id": m.external_id or None,
        "scope_kind": m.scope.kind.value,
        "scope_id": m.scope.id,
        "type": m.type.value,
        "category": m.category,
        "content": m.content,
        "normalized_content": normalized,
        "content_hash": m.content_hash,
        "importance": m.importance,
        "confidence": m.confidence,
        "pinned": m.pinned,
        "source_who": m.source.who,
        "source_why": m.source.why,
        "source_run_id": m.source.run_id,
        "source_session_id": m.source.session_id,
        "metadata": json.dumps(m.metadata, separators=(",", ":"), ensure_ascii=False, sort_keys=True),
        "event_time_ns": m.event_time_ns,
        "create_time_ns": m.create_time_ns,
        "update_time_ns": m.update_time_ns,
        "delete_time_ns": m.delete_time_ns,
        "supersedes_id": m.supersedes_id,
        "superseded_by_id": m.superseded_by_id,
        "revision": m.revision,
        "embedding_model": m.embedding_model,
        "indexed_revision": None,
        "indexed_model": None,
        "speaker": speaker_of(m.content),
    }


# Inserts of up to this many rows (creates, a group of them) go into the row cache as
# written: the index worker reads each new row, and clients and StartSession's recent
# candidates read new rows first. Larger inserts (imports, batch creates, a bulk load) go in
# only while the cache has room for them: evicting for them would push out the rows read
# most. A server that has just loaded its memories then holds them, as one restarted on the
# same data does after its warm-up (the index worker's reads of the new rows hit too).
CACHED_AT_INSERT = 16


def insert_many(cur: Cursor, rows: Sequence[tuple[Memory, str]], stored: StoredSummary) -> None:
    """Insert (memory, normalized_content) pairs in one statement; they join the `stored`
    summary before COMMIT, so no later duplicate check or pinned read can miss them."""
    if rows:
        stored.inserting(m for m, _ in rows)
        recent_ids.rows_added(m for m, _ in rows)
        values = [_row_values(m, normalized) for m, normalized in rows]
        insert_rows(cur, "memories", values)
        by_tenant: dict[str, list[Row]] = {}
        for row in map(_stored_row, values):
            by_tenant.setdefault(row[0], []).append(row)
        for tenant_id, tenant_rows in by_tenant.items():
            rows_written(tenant_id, tenant_rows, only_into_room=len(rows) > CACHED_AT_INSERT)


# Columns DuckDB stores as FLOAT: what it reads back is the nearest float32.
_FLOAT32_COLUMNS = frozenset({"importance", "confidence"})


def _stored_row(values: dict[str, Any]) -> Row:
    """A new row as SELECT_COLUMNS reads it back, made from its insert values. Reading it
    back with RETURNING cost ~0.45 ms of a create's 1.4 ms insert, inside the write lock;
    the row cache's tests compare these rows with DuckDB's."""
    stored = {**values, "access_count": 0}  # the column's default
    for column in _FLOAT32_COLUMNS:
        stored[column] = float(struct.unpack("f", struct.pack("f", stored[column]))[0])
    return tuple(stored[c] for c in COLUMNS)


def get_row(cur: Cursor, tenant_id: str, memory_id: str) -> list[Any] | None:
    """A memory's stored row as SELECT_COLUMNS reads it, as a list of JSON values (an
    idempotency record keeps it; decode_row makes the memory of it again)."""
    row = fetch_one(
        cur, f"SELECT {SELECT_COLUMNS} FROM memories WHERE id = ? AND tenant_id = ?", [memory_id, tenant_id]
    )
    return None if row is None else list(row)


def decode_row(row: Sequence[Any]) -> Memory:
    """The memory of a row get_row gave."""
    return _decode(row)


def get(cur: Cursor, tenant_id: str, memory_id: str) -> Memory | None:
    row = get_row(cur, tenant_id, memory_id)
    return None if row is None else _decode(row)


def get_by_external_id(cur: Cursor, tenant_id: str, external_id: str) -> Memory | None:
    row = fetch_one(
        cur,
        f"SELECT {SELECT_COLUMNS} FROM memories WHERE external_id = ? AND tenant_id = ? "
        "AND delete_time_ns IS NULL",
        [external_id, tenant_id],
    )
    return None if row is None else _decode(row)


def id_list(ids: Sequence[str]) -> str:
    """A literal IN list: DuckDB uses the ART index on id for it (for = ANY(?) it scans)."""
    return ", ".join("'" + i.replace("'", "''") + "'" for i in ids)


# Up to this many ids a literal IN list is cheaper; beyond it, the ids as an Arrow relation
# (`IN (SELECT id FROM view)`, a semi-join). A literal list costs ~16 us an id and more than
# linearly past a few thousand, while the semi-join costs a scan of the table: inside a
# transaction on a 77k-memory store, UPDATE by IN list / by semi-join (ms) 200 ids 5.1 / 5.6,
# 1,000 15.9 / 5.3, 5,000 80.8 / 5.9, 76,882 2,289 / 19.6; SELECT 1,000 23.9 / 6.0, 5,000
# 82.7 / 9.5. Purging a tenant's 77k memories held the memories write lock 2.3 s, every
# tenant's writes waiting behind it. The scan grows with the store, the list with the ids,
# so the bound sits where the list costs ~16 ms, a scan of a few hundred thousand rows.
_LITERAL_IDS_MAX = 1_000
_id_views = itertools.count()


@contextmanager
def id_set(cur: Cursor, ids: Sequence[str]) -> Iterator[str]:
    """SQL for `IN (...)` matching these ids (or hashes, external ids): a literal list, or a
    query of them registered as an Arrow relation for the block's statements."""
    if len(ids) <= _LITERAL_IDS_MAX:
        yield id_list(ids)
        return
    name = f"wanted_ids_{next(_id_views)}"
    # One column built at once: from_pylist's dict a row took 37 ms for 77k ids, this 2.5.
    with _registered(cur, name, pa.table({"id": pa.array(list(ids), pa.string())})):
        yield f"SELECT id FROM {name}"


def _rows_by_id(cur: Cursor, tenant_id: str, ids: Sequence[str]) -> list[Row]:
    if not ids:
        return []
    with id_set(cur, ids) as wanted:
        return cur.execute(
            f"SELECT {SELECT_COLUMNS} FROM memories WHERE id IN ({wanted}) AND tenant_id = ?", [tenant_id]
        ).fetchall()


def get_many(cur: Cursor, tenant_id: str, ids: Sequence[str]) -> dict[str, Memory]:
    return {r[1]: _decode(r) for r in _rows_by_id(cur, tenant_id, ids)}


def read_many(
    cur: Cursor, cache: RowCache, tenant_id: str, ids: Sequence[str], *, fill: bool = True
) -> dict[str, Memory]:
    """`get_many` through the row cache. Only for reads outside a write transaction (a
    transaction's own uncommitted changes are not in the cache). `fill`: rows not cached
    are cached once read (not for reads of rows few others will read)."""
    if not cache.enabled:
        return get_many(cur, tenant_id, ids)
    found, missing = cache.lookup(tenant_id, ids)
    if missing:
        since = cache.generation()  # before the read: see row_cache on racing writes
        fetched = _rows_by_id(cur, tenant_id, missing)
        if fill:
            cache.fill(tenant_id, fetched, since)
        found.extend(fetched)
    return {r[1]: _decode(r) for r in found}


def preload(cur: Cursor, cache: RowCache, limit: int, batch: int = 2048) -> int:
    """Fill the cache with the newest `limit` live rows of all tenants (at start-up: a read
    of a few rows not cached costs ~2-3 ms of CPU at 100k rows, and a freshly started server
    would otherwise miss on every first read of a row, ~30 % of its reads in its first minute
    under the bench's mix).
    Streamed in batches, oldest first, so the newest are the last to be evicted. Rows that a
    write changes meanwhile are not filled (the generation taken before the read). Returns
    the rows filled or skipped."""
    if not cache.enabled or limit <= 0:
        return 0
    since = cache.generation()
    # The oldest seq to read, then the rows in table order (insertion order, so by seq): an
    # ORDER BY over whole rows sorted ~100 MB at 100k rows, which DuckDB's allocator then kept.
    first = fetch_one(
        cur,
        "SELECT min(seq) FROM "
        "(SELECT seq FROM memories WHERE delete_time_ns IS NULL ORDER BY seq DESC LIMIT ?)",
        [limit],
    )
    if first is None or first[0] is None:
        return 0
    result = cur.execute(
        f"SELECT {SELECT_COLUMNS} FROM memories WHERE delete_time_ns IS NULL AND seq >= ?", [first[0]]
    )
    read = 0
    while rows := result.fetchmany(batch):
        read += len(rows)
        by_tenant: dict[str, list[Row]] = {}
        for r in rows:
            by_tenant.setdefault(r[0], []).append(r)
        for tenant_id, tenant_rows in by_tenant.items():
            cache.fill(tenant_id, tenant_rows, since)
    return read


def find_live_duplicates(
    cur: Cursor, stored_hashes: ContentHashFilter, tenant_id: str, hashes: Sequence[str]
) -> dict[tuple[str, str], Memory]:
    """Live memories with any of these content hashes, keyed by (scope key, hash). Hashes
    the filter has never seen stored are not looked up (most creates: no query at all)."""
    hashes = [h for h in hashes if stored_hashes.may_contain(h)]
    if not hashes:
        return {}
    out: dict[tuple[str, str], Memory] = {}
    for r in _live_rows_with(cur, tenant_id, "content_hash", hashes):
        m = _decode(r)
        out.setdefault((m.scope.key, m.content_hash), m)
    return out


def live_by_external_ids(cur: Cursor, tenant_id: str, external_ids: Sequence[str]) -> dict[str, Memory]:
    """external_id -> the live memory that holds it."""
    if not external_ids:
        return {}
    return {r[3]: _decode(r) for r in _live_rows_with(cur, tenant_id, "external_id", external_ids)}


def _live_rows_with(cur: Cursor, tenant_id: str, column: str, values: Sequence[str]) -> list[Row]:
    """The tenant's live rows whose `column` holds one of values."""
    with id_set(cur, sorted(set(values))) as wanted:
        rows: list[Row] = cur.execute(
            f"SELECT {SELECT_COLUMNS} FROM memories WHERE {column} IN ({wanted}) "
            "AND tenant_id = ? AND delete_time_ns IS NULL",
            [tenant_id],
        ).fetchall()
    return rows


@dataclass
class _Where:
    clauses: list[str]
    params: list[Any]

    def add(self, clause: str, *params: Any) -> None:
        self.clauses.append(clause)
        self.params.extend(params)

    def sql(self) -> str:
        return " AND ".join(self.clauses) if self.clauses else "TRUE"


def _range(where: _Where, column: str, tr: TimeRange) -> None:
    if tr.start_ns is not None:
        where.add(f"{column} >= ?", tr.start_ns)
    if tr.end_ns is not None:
        where.add(f"{column} < ?", tr.end_ns)


def _filter_where(tenant_id: str, f: MemoryFilter, *, include_deleted: bool) -> _Where:
    where = _Where(["tenant_id = ?"], [tenant_id])
    if not include_deleted:
        where.add("delete_time_ns IS NULL")
    if f.scopes:
        # A row-value IN is pushed into the scan; matching a concatenated key was ~10x slower
        # (every row built a string) and made StartSession's "recent" query ~30 ms at 100k.
        pairs = ", ".join("(?, ?)" for _ in f.scopes)
        values = [v for s in f.scopes for v in (s.kind.value, s.id)]
        where.add(f"(scope_kind, scope_id) IN ({pairs})", *values)
    if f.types:
        where.add("type = ANY(?)", [t.value for t in f.types])
    if f.categories:
        where.add("category = ANY(?)", list(f.categories))
    _range(where, "create_time_ns", f.create_time)
    _range(where, "event_time_ns", f.event_time)
    if f.pinned_only:
        where.add("pinned")
    if f.source_session_ids:
        where.add("source_session_id = ANY(?)", list(f.source_session_ids))
    return where


def list_page(
    cur: Cursor,
    tenant_id: str,
    f: MemoryFilter,
    *,
    include_deleted: bool,
    before_seq: int | None,
    limit: int,
    cache: RowCache | None = None,
) -> list[Memory]:
    """Newest first (by insertion sequence), strictly older than before_seq. With a row
    cache (reads outside a transaction only) the ids come first and the rows from the cache
    where it has them; if a row changed in between so that it left the page, the page is
    read again from DuckDB alone (a short page would end a caller's paging early)."""
    where = _filter_where(tenant_id, f, include_deleted=include_deleted)
    if before_seq is not None:
        where.add("seq < ?", before_seq)
    order, params = f"WHERE {where.sql()} ORDER BY seq DESC LIMIT ?", [*where.params, limit]
    if cache is not None and cache.enabled:
        ids = [r[0] for r in cur.execute(f"SELECT id FROM memories {order}", params).fetchall()]
        by_id = read_many(cur, cache, tenant_id, ids)
        page = [by_id.get(i) for i in ids]
        if all(m is not None and f.matches(m) and (include_deleted or not m.deleted) for m in page):
            return [m for m in page if m is not None]
    rows = cur.execute(f"SELECT {SELECT_COLUMNS} FROM memories {order}", params).fetchall()
    return [_decode(r) for r in rows]


def newest_in_scopes(
    cur: Cursor,
    recent: RecentIds,
    stored: StoredSummary,
    cache: RowCache,
    tenant_id: str,
    scopes: Sequence[Scope],
    limit: int,
) -> list[Memory]:
    """`list_page`'s first page of live rows for a filter of scopes alone (StartSession's
    recent candidates, ListMemories' first page), answered from the in-memory lists of
    `recent` where they reach; scopes that never held a row are skipped. Reads outside a
    write transaction only."""
    f = MemoryFilter(scopes=tuple(scopes))
    if recent.enabled and limit <= recent.depth:
        keys = [k for k in (recent_ids.scope_key(tenant_id, s) for s in scopes) if stored.scopes.may_hold(k)]
        for attempt in range(2):
            ids, missing = recent.newest(keys, limit)
            if not missing:
                by_id = read_many(cur, cache, tenant_id, ids) if ids else {}
                page = [by_id.get(i) for i in ids]
                if all(m is not None and not m.deleted and f.matches(m) for m in page):
                    recent.count(answered=attempt == 0)
                    return [m for m in page if m is not None]
                break  # changed since the lists were read: DuckDB decides
            since = recent.generation(tenant_id)
            for key in missing:
                rows = cur.execute(
                    "SELECT seq, id FROM memories WHERE tenant_id = ? AND scope_kind = ? AND scope_id = ? "
                    "AND delete_time_ns IS NULL ORDER BY seq DESC LIMIT ?",
                    [*key, recent.depth],
                ).fetchall()
                recent.fill(key, [(int(seq), i) for seq, i in rows], since)
        recent.count(answered=False)
    return list_page(cur, tenant_id, f, include_deleted=False, before_seq=None, limit=limit, cache=cache)


def scan(
    cur: Cursor,
    tenant_id: str,
    f: MemoryFilter,
    *,
    include_deleted: bool,
    after_seq: int,
    through_seq: int,
    limit: int,
) -> tuple[list[Memory], int]:
    """Oldest first, numbered after after_seq and up to through_seq (exports); and the
    number of the last one looked at, for the next batch to start after. The batch's ids are
    ordered first and its rows read by id: sorting whole rows took DuckDB ~128 MiB a batch of
    60 KB memories, and four exports at once passed its memory limit (probe)."""
    where = _filter_where(tenant_id, f, include_deleted=include_deleted)
    where.add("seq > ?", after_seq)
    where.add("seq <= ?", through_seq)
    keys = cur.execute(
        f"SELECT id, seq FROM memories WHERE {where.sql()} ORDER BY seq LIMIT ?",
        [*where.params, limit],
    ).fetchall()
    if not keys:
        return [], after_seq
    found = get_many(cur, tenant_id, [k[0] for k in keys])
    # A row deleted or purged between the two reads is left out as the filter says.
    rows = [m for i, _ in keys if (m := found.get(i)) is not None and (include_deleted or not m.deleted)]
    return rows, int(keys[-1][1])


_LARGEST_SEQ = "SELECT coalesce(max(seq), 0) FROM memories WHERE tenant_id = ?"


def count_through(cur: Cursor, tenant_id: str, f: MemoryFilter, *, include_deleted: bool) -> tuple[int, int]:
    """(memories matching f; the tenant's largest sequence number), read in one statement
    so both describe the same snapshot."""
    return _count_and_largest(cur, tenant_id, _filter_where(tenant_id, f, include_deleted=include_deleted))


def _live_through(tenant_id: str, f: MemoryFilter, through_seq: int | None) -> _Where:
    where = _filter_where(tenant_id, f, include_deleted=False)
    if through_seq is not None:
        where.add("seq <= ?", through_seq)
    return where


def count_live_through(
    cur: Cursor, tenant_id: str, f: MemoryFilter, through_seq: int | None
) -> tuple[int, int]:
    """(live memories matching f, numbered up to through_seq when given; the tenant's
    largest sequence number), read in one statement so both describe the same snapshot."""
    return _count_and_largest(cur, tenant_id, _live_through(tenant_id, f, through_seq))


def _count_and_largest(cur: Cursor, tenant_id: str, where: _Where) -> tuple[int, int]:
    row = fetch_one(
        cur,
        f"SELECT (SELECT count(*) FROM memories WHERE {where.sql()}), ({_LARGEST_SEQ})",
        [*where.params, tenant_id],
    )
    return (int(row[0]), int(row[1])) if row else (0, 0)


def live_ids_matching(
    cur: Cursor, tenant_id: str, f: MemoryFilter, *, through_seq: int | None = None, limit: int | None = None
) -> list[str]:
    """Ids of the live memories matching f; with through_seq, only those stored by then;
    with limit, the first that many in insertion order."""
    where = _live_through(tenant_id, f, through_seq)
    sql = f"SELECT id FROM memories WHERE {where.sql()}"
    if limit is not None:
        sql, where.params = f"{sql} ORDER BY seq LIMIT ?", [*where.params, limit]
    return [r[0] for r in cur.execute(sql, where.params).fetchall()]


def largest_seq(cur: Cursor, tenant_id: str) -> int:
    """The tenant's largest insertion sequence number (0: none stored)."""
    row = fetch_one(cur, _LARGEST_SEQ, [tenant_id])
    return int(row[0]) if row else 0


def count_live_in(cur: Cursor, tenant_id: str, scope: Scope, mtype: MemoryType) -> int:
    row = fetch_one(
        cur,
        "SELECT count(*) FROM memories WHERE tenant_id = ? AND scope_kind = ? AND scope_id = ? "
        "AND type = ? AND delete_time_ns IS NULL",
        [tenant_id, scope.kind.value, scope.id, mtype.value],
    )
    return int(row[0]) if row else 0


def oldest_unpinned(cur: Cursor, tenant_id: str, scope: Scope, mtype: MemoryType, n: int) -> list[str]:
    rows = cur.execute(
        "SELECT id FROM memories WHERE tenant_id = ? AND scope_kind = ? AND scope_id = ? AND type = ? "
        "AND delete_time_ns IS NULL AND NOT pinned ORDER BY create_time_ns, seq LIMIT ?",
        [tenant_id, scope.kind.value, scope.id, mtype.value, n],
    ).fetchall()
    return [r[0] for r in rows]


def tombstoned(m: Memory, now_ns: int) -> Memory:
    """A live memory as `tombstone` leaves its row."""
    return replace(m, delete_time_ns=now_ns, update_time_ns=now_ns, revision=m.revision + 1)


def tombstone(cur: Cursor, tenant_id: str, ids: Sequence[str], now_ns: int) -> None:
    if ids:
        rows_changed(tenant_id, ids)
        recent_ids.rows_gone(tenant_id, ids)
        with id_set(cur, ids) as doomed:
            cur.execute(
                "UPDATE memories SET delete_time_ns = ?, update_time_ns = ?, revision = revision + 1 "
                f"WHERE id IN ({doomed}) AND tenant_id = ? AND delete_time_ns IS NULL",
                [now_ns, now_ns, tenant_id],
            )


UPDATABLE_COLUMNS = frozenset(
    {
        "speaker",
        "importance",
        "confidence",
        "pinned",
        "category",
        "metadata",
        "event_time_ns",
        "content",
        "normalized_content",
        "content_hash",
        "embedding_model",
        "superseded_by_id",
        "delete_time_ns",
    }
)


def update_columns(
    cur: Cursor,
    stored: StoredSummary,
    tenant_id: str,
    memory_id: str,
    changes: dict[str, Any],
    now_ns: int,
) -> None:
    bad = set(changes) - UPDATABLE_COLUMNS
    if bad:
        raise ValueError(f"not updatable: {sorted(bad)}")
    stored.updating(tenant_id, changes)
    values = dict(changes)
    if "metadata" in values:
        values["metadata"] = json.dumps(
            values["metadata"], separators=(",", ":"), ensure_ascii=False, sort_keys=True
        )
    sets = ", ".join(f"{c} = ?" for c in values)
    rows_changed(tenant_id, [memory_id])
    if "delete_time_ns" in changes:
        if changes["delete_time_ns"] is None:
            recent_ids.rows_revived(tenant_id)
        else:
            recent_ids.rows_gone(tenant_id, [memory_id])
    cur.execute(
        f"UPDATE memories SET {sets}, update_time_ns = ?, revision = revision + 1 "
        "WHERE id = ? AND tenant_id = ?",
        [*values.values(), now_ns, memory_id, tenant_id],
    )


def record_history(
    cur: Cursor, entries: Iterable[tuple[str, str, str, str, str, dict[str, Any]]], now_ns: int
) -> None:
    """entries: (tenant_id, memory_id, action, actor, reason, details)."""
    values = [
        {
            "tenant_id": t,
            "memory_id": m,
            "action": a,
            "actor": actor,
            "reason": reason,
            "details": json.dumps(details, separators=(",", ":"), sort_keys=True),
            "time_ns": now_ns,
        }
        for t, m, a, actor, reason, details in entries
    ]
    if values:
        insert_rows(cur, "memory_history", values)


def history(
    cur: Cursor, tenant_id: str, memory_id: str, *, from_ns: int = 0, skip: int = 0, limit: int = 1000
) -> list[HistoryEntry]:
    """A memory's audit history, oldest first: `limit` entries from time `from_ns` on, past the
    first `skip` of those at exactly `from_ns` (a page's position: entries carry no id, and
    retention removes the oldest, so an offset from the start would move). Entries of one
    instant are ordered by their content."""
    # The memory's entries are read by themselves first: over the table, DuckDB plans the
    # ORDER BY ... LIMIT as a top-N of a full scan and leaves the id's index unused (3.8
    # against 0.9 ms at 100k entries).
    rows = cur.execute(
        "WITH entries AS MATERIALIZED (SELECT action, actor, reason, details, time_ns "
        "FROM memory_history WHERE tenant_id = ? AND memory_id = ? AND time_ns >= ?) "
        "SELECT * FROM entries ORDER BY time_ns, action, actor, reason, details LIMIT ? OFFSET ?",
        [tenant_id, memory_id, from_ns, limit, skip],
    ).fetchall()
    return [HistoryEntry(a, actor, r, json.loads(d), t) for a, actor, r, d, t in rows]


def has_history(cur: Cursor, tenant_id: str, memory_id: str) -> bool:
    sql = "SELECT 1 FROM memory_history WHERE tenant_id = ? AND memory_id = ? LIMIT 1"
    return fetch_one(cur, sql, [tenant_id, memory_id]) is not None


# --- recall signals ------------------------------------------------------------------


def speaker_counts(cur: Cursor, tenant_id: str) -> dict[str, int]:
    """Live memories per speaker over the whole tenant."""
    rows = cur.execute(
        "SELECT speaker, count(*) FROM memories WHERE tenant_id = ? AND delete_time_ns IS NULL "
        "AND speaker <> '' GROUP BY speaker",
        [tenant_id],
    ).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def speaker_counts_by_scope(
    cur: Cursor, tenant_id: str, scopes: Sequence[Scope]
) -> dict[Scope, dict[str, int]]:
    """Live memories per speaker in each of these scopes (every one keyed, empty if none)."""
    where = _filter_where(tenant_id, MemoryFilter(scopes=tuple(scopes)), include_deleted=False)
    out: dict[Scope, dict[str, int]] = {s: {} for s in scopes}
    for kind, scope_id, speaker, n in cur.execute(
        f"SELECT scope_kind, scope_id, speaker, count(*) FROM memories WHERE {where.sql()} "
        "AND speaker <> '' GROUP BY scope_kind, scope_id, speaker",
        where.params,
    ).fetchall():
        out[Scope(_SCOPE_KINDS[kind], scope_id)][speaker] = int(n)
    return out


def session_neighbours(cur: Cursor, tenant_id: str, ids: Sequence[str]) -> dict[str, tuple[str, str]]:
    """id -> (previous id, next id) among live memories of the same scope and source session,
    in insertion order ("" where there is none), for the given ids and their neighbours.
    Memories without a source session have none."""
    if not ids:
        return {}
    with id_set(cur, ids) as listed:
        rows = cur.execute(
            "WITH wanted AS (SELECT DISTINCT scope_kind, scope_id, source_session_id FROM memories "
            f"  WHERE id IN ({listed}) AND tenant_id = ? AND source_session_id <> ''), "
            "ordered AS (SELECT m.id, lag(m.id) OVER w AS prev_id, lead(m.id) OVER w AS next_id "
            "  FROM memories m JOIN wanted USING (scope_kind, scope_id, source_session_id) "
            "  WHERE m.tenant_id = ? AND m.delete_time_ns IS NULL "
            "  WINDOW w AS (PARTITION BY m.scope_kind, m.scope_id, m.source_session_id ORDER BY m.seq)) "
            f"SELECT id, prev_id, next_id FROM ordered WHERE id IN ({listed}) OR prev_id IN ({listed}) "
            f"OR next_id IN ({listed})",
            [tenant_id, tenant_id],
        ).fetchall()
    return {r[0]: (r[1] or "", r[2] or "") for r in rows}


def access_added(n: int) -> Callable[[Row], Row]:
    """`session_repo.add_accesses`' UPDATE applied to a cached row (its last access time is
    not among the columns read)."""

    def apply(row: Row) -> Row:
        new = list(row)
        new[_ACCESS_COUNT] += n
        return tuple(new)

    return apply


# --- status and retention ----------------------------------------------------------------


def tenant_stats(cur: Cursor, tenant_id: str, model: str) -> dict[str, Any]:
    behind = (
        "delete_time_ns IS NULL AND (indexed_revision IS DISTINCT FROM revision "
        "OR indexed_model IS DISTINCT FROM ?)"
    )
    row = fetch_one(
        cur,
        "SELECT count(*) FILTER (WHERE delete_time_ns IS NULL),"
        " count(*) FILTER (WHERE delete_time_ns IS NOT NULL),"
        f" count(*) FILTER (WHERE {behind}), min(update_time_ns) FILTER (WHERE {behind})"
        " FROM memories WHERE tenant_id = ?",
        [model, model, tenant_id],
    )
    by_type = dict(
        cur.execute(
            "SELECT type, count(*) FROM memories WHERE tenant_id = ? AND delete_time_ns IS NULL "
            "GROUP BY type",
            [tenant_id],
        ).fetchall()
    )
    live, deleted, pending, oldest = row if row else (0, 0, 0, None)
    return {
        "live": live,
        "deleted": deleted,
        "pending": pending,
        "oldest_pending_ns": oldest,
        "by_type": by_type,
    }


def delete_rows(cur: Cursor, tenant_id: str, ids: Sequence[str]) -> None:
    """Remove rows outright (an import replacing tombstoned memories of the same ids)."""
    if ids:
        rows_changed(tenant_id, ids)
        recent_ids.rows_gone(tenant_id, ids)
        with id_set(cur, ids) as doomed:
            cur.execute(f"DELETE FROM memories WHERE id IN ({doomed}) AND tenant_id = ?", [tenant_id])


def purge_tombstones(cur: Cursor, before_ns: int, limit: int) -> list[tuple[str, str]]:
    """Hard-delete tombstones older than before_ns whose index row is already gone."""
    rows = cur.execute(
        "SELECT tenant_id, id FROM memories WHERE delete_time_ns < ? AND indexed_revision IS NULL "
        "ORDER BY delete_time_ns LIMIT ?",
        [before_ns, limit],
    ).fetchall()
    if rows:
        by_tenant: dict[str, list[str]] = {}
        for t, i in rows:
            by_tenant.setdefault(t, []).append(i)
        for t, ids in by_tenant.items():
            rows_changed(t, ids)
            recent_ids.rows_gone(t, ids)  # tombstones are listed nowhere; kept exact regardless
        with arrow_view(cur, "doomed", [{"tenant_id": t, "id": i} for t, i in rows]):
            cur.execute(
                "DELETE FROM memories USING doomed WHERE memories.id = doomed.id "
                "AND memories.tenant_id = doomed.tenant_id"
            )
    return [(t, i) for t, i in rows]


def purge_history(cur: Cursor, before_ns: int) -> None:
    cur.execute("DELETE FROM memory_history WHERE time_ns < ?", [before_ns])
