"""SQL for the memories table's index marks: which revision of each row LanceDB holds, and
with which model. The indexer reads them to find what is behind and writes them once a
batch is in LanceDB; the row cache is patched or dropped in step with each UPDATE."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mnemo_server.store.database import Cursor
from mnemo_server.store.memory_repo import COLUMNS, id_list, id_set
from mnemo_server.store.row_cache import Row, all_rows_changed, rows_changed, rows_patched

_COLUMN = {name: i for i, name in enumerate(COLUMNS)}
_REVISION, _DELETE_TIME = _COLUMN["revision"], _COLUMN["delete_time_ns"]
_EMBEDDING_MODEL, _INDEXED_REVISION = _COLUMN["embedding_model"], _COLUMN["indexed_revision"]
_INDEXED_MODEL = _COLUMN["indexed_model"]


@dataclass(frozen=True)
class IndexTask:
    tenant_id: str
    id: str
    revision: int
    deleted: bool


def needing_index(cur: Cursor, model: str, limit: int, after: tuple[str, str] = ("", "")) -> list[IndexTask]:
    """Rows whose LanceDB state is behind DuckDB: new, changed, re-modelled, or tombstoned
    but still indexed. Ordered by (tenant, id) for stable paging."""
    rows = cur.execute(
        "SELECT tenant_id, id, revision, delete_time_ns IS NOT NULL FROM memories "
        "WHERE (tenant_id > ? OR (tenant_id = ? AND id > ?)) AND ("
        " (delete_time_ns IS NULL AND (indexed_revision IS DISTINCT FROM revision "
        "                              OR indexed_model IS DISTINCT FROM ?))"
        " OR (delete_time_ns IS NOT NULL AND indexed_revision IS NOT NULL))"
        " ORDER BY tenant_id, id LIMIT ?",
        [after[0], after[0], after[1], model, limit],
    ).fetchall()
    return [IndexTask(t, i, r, bool(d)) for t, i, r, d in rows]


def mark_indexed(cur: Cursor, done: Sequence[tuple[str, str, int]], model: str) -> None:
    """done: (tenant, id, revision) now reflected in LanceDB. A row changed since keeps its
    stale marker and is picked up again."""
    # One UPDATE per (tenant, revision) with a literal id list: it uses the ART index on id,
    # where a join against the batch would scan the table while holding the write lock (past
    # memory_repo's bound a list costs more than the scan, and id_set makes it one).
    groups: dict[tuple[str, int], list[str]] = {}
    for t, i, r in done:
        groups.setdefault((t, r), []).append(i)
    for (tenant_id, revision), ids in groups.items():
        rows_patched(tenant_id, ids, _index_mark(revision, model))
        with id_set(cur, ids) as done_ids:
            cur.execute(
                f"UPDATE memories SET indexed_revision = revision, indexed_model = ?, embedding_model = ? "
                f"WHERE id IN ({done_ids}) AND tenant_id = ? AND revision = ? AND delete_time_ns IS NULL",
                [model, model, tenant_id, revision],
            )


def _index_mark(revision: int, model: str) -> Callable[[Row], Row]:
    """`mark_indexed`'s UPDATE applied to a cached row (row_cache: patched, not dropped)."""

    def apply(row: Row) -> Row:
        if row[_REVISION] != revision or row[_DELETE_TIME] is not None:
            return row
        new = list(row)
        new[_INDEXED_REVISION], new[_INDEXED_MODEL], new[_EMBEDDING_MODEL] = revision, model, model
        return tuple(new)

    return apply


def mark_unindexed(cur: Cursor, removed: Sequence[tuple[str, str]]) -> None:
    """Tombstoned rows whose LanceDB row is gone."""
    by_tenant: dict[str, list[str]] = {}
    for t, i in removed:
        by_tenant.setdefault(t, []).append(i)
    for tenant_id, ids in by_tenant.items():
        rows_changed(tenant_id, ids)
        with id_set(cur, ids) as removed_ids:
            cur.execute(
                "UPDATE memories SET indexed_revision = NULL, indexed_model = NULL "
                f"WHERE id IN ({removed_ids}) AND tenant_id = ? AND delete_time_ns IS NOT NULL",
                [tenant_id],
            )


def forget_index_marks(cur: Cursor, tenant_id: str, ids: Sequence[str]) -> None:
    """These rows are indexed again (LanceDB lost them or holds another revision)."""
    if ids:
        rows_changed(tenant_id, ids)
        with id_set(cur, ids) as forgotten:
            cur.execute(
                f"UPDATE memories SET indexed_revision = NULL WHERE id IN ({forgotten}) AND tenant_id = ?",
                [tenant_id],
            )


def live_index_marks(cur: Cursor, tenant_ids: Sequence[str]) -> dict[str, dict[str, tuple[int, int | None]]]:
    """Per tenant, each live row's id -> (revision, indexed revision)."""
    marks: dict[str, dict[str, tuple[int, int | None]]] = {t: {} for t in tenant_ids}
    if not tenant_ids:
        return marks
    rows = cur.execute(
        f"SELECT tenant_id, id, revision, indexed_revision FROM memories "
        f"WHERE tenant_id IN ({id_list(tenant_ids)}) AND delete_time_ns IS NULL"
    ).fetchall()
    for tenant_id, memory_id, revision, indexed_revision in rows:
        marks[tenant_id][memory_id] = (revision, indexed_revision)
    return marks


def tenants_with_index_marks(cur: Cursor) -> list[str]:
    """Tenants with a row marked as indexed (live or tombstoned)."""
    rows = cur.execute(
        "SELECT DISTINCT tenant_id FROM memories WHERE indexed_revision IS NOT NULL"
    ).fetchall()
    return [r[0] for r in rows]


def reset_index_marks(cur: Cursor, tenant_id: str | None = None) -> None:
    """Forget what LanceDB holds (for one tenant, or all): those rows are indexed again."""
    if tenant_id is None:
        all_rows_changed()
        cur.execute("UPDATE memories SET indexed_revision = NULL, indexed_model = NULL")
    else:
        rows_changed(tenant_id, None)
        cur.execute(
            "UPDATE memories SET indexed_revision = NULL, indexed_model = NULL WHERE tenant_id = ?",
            [tenant_id],
        )
