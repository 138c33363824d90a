"""request_id bookkeeping: the result of a write is recorded in the same transaction as the
write itself, so a retry after a crash or a lost response sees exactly one effect."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import duckdb

from mnemo_server.errors import InvalidArgument
from mnemo_server.memory.model import IdempotencyKey
from mnemo_server.store.database import Cursor, WriteConflict, fetch_one
from mnemo_server.store.memory_repo import insert_rows
from mnemo_server.store.stored_summary import RecordedRequests


def lookup(
    cur: Cursor, recorded: RecordedRequests, tenant_id: str, key: IdempotencyKey | None
) -> dict[str, Any] | None:
    """The recorded result for this key, None if the key is new (`recorded` says most new
    keys are without a query). The same key with another request is the caller's bug:
    INVALID_ARGUMENT."""
    if key is None or not recorded.may_hold(tenant_id, key.request_id):
        return None
    row = fetch_one(
        cur,
        "SELECT method, fingerprint, result FROM idempotency WHERE tenant_id = ? AND request_id = ?",
        [tenant_id, key.request_id],
    )
    if row is None:
        return None
    method, fingerprint, result = row
    if method != key.method or fingerprint != key.fingerprint:
        raise InvalidArgument(
            "request_id", "was already used with a different request", reason="REQUEST_ID_REUSED"
        )
    decoded: dict[str, Any] = json.loads(result)
    return decoded


def record(
    cur: Cursor,
    recorded: RecordedRequests,
    tenant_id: str,
    key: IdempotencyKey | None,
    result: dict[str, Any],
    now_ns: int,
) -> None:
    """Record the write's result under its key, inside the write's transaction."""
    record_many(cur, recorded, tenant_id, [(key, result)], now_ns)


def record_many(
    cur: Cursor,
    recorded: RecordedRequests,
    tenant_id: str,
    results: Sequence[tuple[IdempotencyKey | None, dict[str, Any]]],
    now_ns: int,
) -> None:
    """Record the results of a group of writes under their keys (unkeyed ones are not
    recorded) in one statement, inside the group's transaction: each statement under a write
    lock costs the holder a wait for the GIL. The keys join `recorded` before the INSERT, so
    no lookup after this transaction commits can miss them."""
    keyed = [(key, result) for key, result in results if key is not None]
    if not keyed:
        return
    for key, _ in keyed:
        recorded.add(tenant_id, key.request_id)
    rows: list[dict[str, Any]] = [
        {
            "tenant_id": tenant_id,
            "request_id": key.request_id,
            "method": key.method,
            "fingerprint": key.fingerprint,
            "result": json.dumps(result),
            "create_time_ns": now_ns,
        }
        for key, result in keyed
    ]
    try:
        insert_rows(cur, "idempotency", rows)
    except duckdb.ConstraintException:
        # lookup() found no record in this transaction's snapshot, so a key was committed
        # since by a write of another domain (the same request_id sent to two operations).
        raise WriteConflict(
            "request_id is being used by another request right now; nothing was written"
        ) from None


def rerecord(cur: Cursor, tenant_id: str, key: IdempotencyKey | None, result: dict[str, Any]) -> None:
    """Replace the result recorded under key (a write done over several transactions
    records its progress with each)."""
    if key is not None:
        cur.execute(
            "UPDATE idempotency SET result = ? WHERE tenant_id = ? AND request_id = ?",
            [json.dumps(result), tenant_id, key.request_id],
        )


def purge(cur: Cursor, before_ns: int) -> None:
    cur.execute("DELETE FROM idempotency WHERE create_time_ns < ?", [before_ns])
