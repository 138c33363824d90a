"""request_id bookkeeping: the result of a write is recorded in the same transaction as the
write itself, so a retry after a crash or a lost response sees exactly one effect."""

from __future__ import annotations

import json
from typing import Any

import duckdb

from mnemo_server.errors import InvalidArgument
from mnemo_server.memory.model import IdempotencyKey
from mnemo_server.store.database import Cursor, WriteConflict, fetch_one
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
    """Record the write's result under its key, inside the write's transaction. The key joins
    `recorded` before the INSERT, so no lookup after this transaction commits can miss it."""
    if key is None:
        return
    recorded.add(tenant_id, key.request_id)
    try:
        cur.execute(
            "INSERT INTO idempotency VALUES (?, ?, ?, ?, ?, ?)",
            [tenant_id, key.request_id, key.method, key.fingerprint, json.dumps(result), now_ns],
        )
    except duckdb.ConstraintException:
        # lookup() found no record in this transaction's snapshot, so the key was committed
        # since by a write of another domain (the same request_id sent to two operations).
        raise WriteConflict(
            "request_id is being used by another request right now; nothing was written"
        ) from None


def purge(cur: Cursor, before_ns: int) -> None:
    cur.execute("DELETE FROM idempotency WHERE create_time_ns < ?", [before_ns])
