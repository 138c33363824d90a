"""SQL for tenants and API keys."""

from __future__ import annotations

from dataclasses import dataclass

from mnemo_server.store.database import Cursor, fetch_one


@dataclass(frozen=True)
class TenantRow:
    id: str
    display_name: str
    create_time_ns: int


@dataclass(frozen=True)
class ApiKeyRow:
    id: str
    tenant_id: str
    secret_hash: str
    description: str
    create_time_ns: int
    revoke_time_ns: int | None


def insert_tenant(cur: Cursor, t: TenantRow) -> None:
    cur.execute("INSERT INTO tenants VALUES (?, ?, ?)", [t.id, t.display_name, t.create_time_ns])


def get_tenant(cur: Cursor, tenant_id: str) -> TenantRow | None:
    row = fetch_one(cur, "SELECT id, display_name, create_time_ns FROM tenants WHERE id = ?", [tenant_id])
    return None if row is None else TenantRow(*row)


def list_tenants(cur: Cursor, after_id: str, limit: int) -> list[TenantRow]:
    rows = cur.execute(
        "SELECT id, display_name, create_time_ns FROM tenants WHERE id > ? ORDER BY id LIMIT ?",
        [after_id, limit],
    ).fetchall()
    return [TenantRow(*r) for r in rows]


def insert_key(cur: Cursor, k: ApiKeyRow) -> None:
    cur.execute(
        "INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, ?)",
        [k.id, k.tenant_id, k.secret_hash, k.description, k.create_time_ns, k.revoke_time_ns],
    )


_KEY_COLUMNS = "id, tenant_id, secret_hash, description, create_time_ns, revoke_time_ns"


def get_key(cur: Cursor, key_id: str) -> ApiKeyRow | None:
    row = fetch_one(cur, f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ?", [key_id])
    return None if row is None else ApiKeyRow(*row)


def list_keys(cur: Cursor, tenant_id: str, after_id: str, limit: int) -> list[ApiKeyRow]:
    rows = cur.execute(
        f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE tenant_id = ? AND id > ? ORDER BY id LIMIT ?",
        [tenant_id, after_id, limit],
    ).fetchall()
    return [ApiKeyRow(*r) for r in rows]


def revoke_key(cur: Cursor, key_id: str, now_ns: int) -> None:
    cur.execute(
        "UPDATE api_keys SET revoke_time_ns = ? WHERE id = ? AND revoke_time_ns IS NULL", [now_ns, key_id]
    )
