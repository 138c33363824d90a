"""A revoked API key stops working at once, even when a check of it read the key row just
before the revocation committed (found by probing: such a check put the key back into the
verified cache after the revocation had cleared it, and it worked until a restart)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnemo_server.errors import Unauthenticated
from mnemo_server.store import tenant_repo
from mnemo_server.store.database import Database
from mnemo_server.tenancy.tenants import TenantService


def test_a_check_that_read_the_key_before_its_revocation_does_not_cache_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenants = TenantService(Database(tmp_path / "d.duckdb"))
    tenants.create_tenant("acme", "Acme")
    row, token = tenants.create_key("acme", "agent")
    read_key = tenant_repo.get_key

    def read_then_revoke(cur: object, key_id: str) -> object:
        found = read_key(cur, key_id)  # type: ignore[arg-type]
        monkeypatch.setattr(tenant_repo, "get_key", read_key)
        tenants.revoke_key(key_id)  # commits between the check's read and its caching
        return found

    monkeypatch.setattr(tenant_repo, "get_key", read_then_revoke)
    assert tenants.authenticate(token, admin_key="").tenant_id == "acme"  # it read the key live
    with pytest.raises(Unauthenticated) as err:
        tenants.authenticate(token, admin_key="")
    assert err.value.reason == "API_KEY_REVOKED"
    assert tenant_repo.get_key(tenants.db.reader(), row.id).revoke_time_ns is not None  # type: ignore[union-attr]
