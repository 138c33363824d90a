"""Tenants and API keys.

A key reads ``mnemo_<id>.<secret>``: the id is public (listing, revocation), only a SHA-256
of the secret is stored. Secrets are 256 random bits, so a fast hash is the right tool (no
password stretching needed) and verification is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from mnemo_server.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied, Unauthenticated
from mnemo_server.memory.model import IdempotencyKey, now_ns
from mnemo_server.memory.paging import decode_token, encode_token, query_fingerprint
from mnemo_server.store import idempotency_repo, tenant_repo
from mnemo_server.store.database import Database
from mnemo_server.store.tenant_repo import ApiKeyRow, TenantRow

TENANT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_KEY_RE = re.compile(r"^mnemo_([0-9a-f]{16})\.([A-Za-z0-9_-]{20,100})$")
ADMIN_TENANT = "_admin"


def _is_id(position: object) -> bool:
    return isinstance(position, str)


def _hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant's key, the admin key, or the local (auth-less) mode."""

    tenant_id: str
    is_admin: bool = False
    key_id: str = ""


class TenantService:
    def __init__(self, db: Database, clock: Callable[[], int] = now_ns):
        self.db = db
        self.clock = clock
        self._verified: dict[str, tuple[str, str]] = {}  # full token -> (key id, tenant id)
        self._cache_lock = threading.Lock()
        # Revocations so far: a key read as valid is cached only if none happened since the
        # read, or a check that read the row just before a revocation committed would put
        # the revoked key back into the cache after the revocation cleared it.
        self._revocations = 0
        # Told the id of each key revoked, once it no longer authenticates.
        self._revocation_listeners: list[Callable[[str], None]] = []

    def on_revocation(self, listener: Callable[[str], None]) -> None:
        self._revocation_listeners.append(listener)

    # --- tenants ---------------------------------------------------------------------

    def create_tenant(
        self, tenant_id: str, display_name: str, key: IdempotencyKey | None = None
    ) -> TenantRow:
        if not TENANT_ID_RE.fullmatch(tenant_id):
            raise InvalidArgument(
                "tenant.id", "must be 1-64 characters of [a-z0-9_-], starting with a letter or digit"
            )
        _check_label(display_name, "tenant.display_name", 200)
        with self.db.transaction() as cur:
            now = self.clock()  # under the write lock: times follow the order of the writes
            if idempotency_repo.lookup(cur, self.db.stored.requests, ADMIN_TENANT, key) is None:
                if tenant_repo.get_tenant(cur, tenant_id) is not None:
                    raise AlreadyExists(f"tenant {tenant_id!r} already exists", reason="TENANT_EXISTS")
                tenant_repo.insert_tenant(cur, TenantRow(tenant_id, display_name or tenant_id, now))
                idempotency_repo.record(
                    cur, self.db.stored.requests, ADMIN_TENANT, key, {"id": tenant_id}, now
                )
        return self.get_tenant(tenant_id)

    def ensure_tenant(self, tenant_id: str) -> None:
        """Create the tenant if missing (the local, auth-less mode's single tenant)."""
        if tenant_repo.get_tenant(self.db.reader(), tenant_id) is None:
            self.create_tenant(tenant_id, tenant_id)

    def get_tenant(self, tenant_id: str) -> TenantRow:
        row = tenant_repo.get_tenant(self.db.reader(), tenant_id)
        if row is None:
            raise NotFound("tenant", tenant_id)
        return row

    def list_tenants(self, page_size: int, page_token: str) -> tuple[list[TenantRow], str]:
        """`page_size` as the API's validator returned it (1 to the configured maximum)."""
        fp = query_fingerprint("tenants")
        after: str = decode_token(page_token, fp, _is_id) or ""
        rows = tenant_repo.list_tenants(self.db.reader(), after, page_size + 1)
        return rows[:page_size], encode_token(rows[page_size - 1].id, fp) if len(rows) > page_size else ""

    # --- keys ------------------------------------------------------------------------

    def create_key(
        self,
        tenant_id: str,
        description: str,
        key: IdempotencyKey | None = None,
    ) -> tuple[ApiKeyRow, str]:
        """Returns the key and its full token. A retried request (same request_id) cannot
        return the secret again (it is not stored): it fails with ALREADY_EXISTS naming the key."""
        _check_label(description, "description", 500)
        self.get_tenant(tenant_id)
        key_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        with self.db.transaction() as cur:
            now = self.clock()  # under the write lock: times follow the order of the writes
            replay = idempotency_repo.lookup(cur, self.db.stored.requests, ADMIN_TENANT, key)
            if replay is not None:
                raise AlreadyExists(
                    f"request already created API key {replay['id']}; its secret is shown only once",
                    reason="API_KEY_ALREADY_ISSUED",
                    metadata={"api_key_id": replay["id"]},
                )
            row = ApiKeyRow(key_id, tenant_id, _hash_secret(secret), description, now, None)
            tenant_repo.insert_key(cur, row)
            idempotency_repo.record(cur, self.db.stored.requests, ADMIN_TENANT, key, {"id": key_id}, now)
        return row, f"mnemo_{key_id}.{secret}"

    def list_keys(self, tenant_id: str, page_size: int, page_token: str) -> tuple[list[ApiKeyRow], str]:
        self.get_tenant(tenant_id)
        fp = query_fingerprint("keys", tenant_id)
        after: str = decode_token(page_token, fp, _is_id) or ""
        rows = tenant_repo.list_keys(self.db.reader(), tenant_id, after, page_size + 1)
        return rows[:page_size], encode_token(rows[page_size - 1].id, fp) if len(rows) > page_size else ""

    def revoke_key(self, key_id: str) -> ApiKeyRow:
        with self.db.transaction() as cur:
            if tenant_repo.get_key(cur, key_id) is None:
                raise NotFound("api_key", key_id)
            tenant_repo.revoke_key(cur, key_id, self.clock())
        with self._cache_lock:
            self._revocations += 1
            self._verified = {t: v for t, v in self._verified.items() if v[0] != key_id}
        for listener in self._revocation_listeners:
            listener(key_id)
        row = tenant_repo.get_key(self.db.reader(), key_id)
        assert row is not None
        return row

    # --- authentication ----------------------------------------------------------------

    def authenticate(self, token: str, admin_key: str) -> Principal:
        if not token:
            raise Unauthenticated(
                "missing credentials: send 'authorization: Bearer <api key>'", reason="MISSING_CREDENTIALS"
            )
        if admin_key and hmac.compare_digest(token.encode(), admin_key.encode()):
            return Principal(tenant_id=ADMIN_TENANT, is_admin=True)
        with self._cache_lock:
            cached = self._verified.get(token)
            revocations = self._revocations
        if cached is not None:
            return Principal(tenant_id=cached[1], key_id=cached[0])
        match = _KEY_RE.fullmatch(token)
        if not match:
            raise Unauthenticated("malformed API key", reason="INVALID_API_KEY")
        row = tenant_repo.get_key(self.db.reader(), match.group(1))
        if row is None or not hmac.compare_digest(row.secret_hash, _hash_secret(match.group(2))):
            raise Unauthenticated("unknown API key", reason="INVALID_API_KEY")
        if row.revoke_time_ns is not None:
            raise Unauthenticated("API key revoked", reason="API_KEY_REVOKED")
        with self._cache_lock:
            if self._revocations == revocations:
                if len(self._verified) > 10_000:
                    self._verified.clear()
                self._verified[token] = (row.id, row.tenant_id)
        return Principal(tenant_id=row.tenant_id, key_id=row.id)


# Bidirectional embeddings, overrides and isolates: in a one-line label shown in listings
# and logs they reorder what follows them ("Trojan Source"), so a name can pass for another.
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _check_label(value: str, field: str, max_chars: int) -> None:
    """A one-line free-text label shown back to people (a tenant's display name, an API key's
    description): bounded, and without control characters (NUL, line breaks, escapes that a
    terminal runs) or bidirectional controls, which the admin probe found accepted."""
    if len(value) > max_chars:
        raise InvalidArgument(field, f"longer than {max_chars:,} characters")
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL characters")
    for ch in value:
        if unicodedata.category(ch) == "Cc" or ch in _BIDI_CONTROLS:
            raise InvalidArgument(
                field, f"must not contain control or bidirectional-control characters (U+{ord(ch):04X})"
            )


def require_admin(principal: Principal) -> None:
    if not principal.is_admin:
        raise PermissionDenied("this call needs the server's admin key", reason="ADMIN_ONLY")


def require_tenant(principal: Principal) -> str:
    if principal.tenant_id == ADMIN_TENANT:
        raise PermissionDenied(
            "the admin key manages tenants; use a tenant's API key for data calls",
            reason="TENANT_KEY_REQUIRED",
        )
    return principal.tenant_id
