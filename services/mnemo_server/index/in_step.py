"""Which LanceDB tables start-up must check against DuckDB: none that an orderly shutdown left
in step and that nothing has written since.

Start-up checks each tenant's table before serving: its layout (LanceIndex.drop_outdated) and
its rows against DuckDB's (IndexWorker.reconcile(full=True): rows DuckDB no longer holds as
live, rows at another revision). That opens every table and reads every id, ~7 ms a tenant
however few of them are loaded (index.max_resident_*): 2,000 tenants of 5 memories were
serving after 17.3 s, and after 3.0 s once only the tables below were checked. Those checks
find something only after a crash, in a data directory put together from different moments (a
restored backup), or in a table another server version or configuration wrote.

So an orderly shutdown, once the index worker has stopped and the last LanceDB write is done,
seals the index. The seal holds:
- a token, written both in a file of the LanceDB directory and in DuckDB's store_meta: a
  LanceDB directory and a DuckDB file from different shutdowns do not match;
- the table layout this configuration writes (LanceIndex.layout): another one is checked;
- per table, a digest of its version manifests' names (LanceIndex.table_versions): every
  LanceDB commit adds one, so a table written or put back since differs.
The next start takes the seal, removing both halves before anything is written (a crash later
finds none), and checks only the tables that differ from it or are new. With no seal, or one that
does not match, every table is checked, as before. (A table that is gone is found either way:
IndexWorker.reconcile indexes again the rows DuckDB marks as indexed in a table that does not
exist.)
"""

from __future__ import annotations

import json
import logging
import secrets
from pathlib import Path

from mnemo_server.index.lance_index import LanceIndex
from mnemo_server.store.database import Database
from mnemo_server.store.durable import fsync_path, write_text_durably

log = logging.getLogger(__name__)

SEAL_FILE = "in_step.json"
META_SEAL = "index_seal"


def _seal_path(index: LanceIndex) -> Path:
    return index.path / SEAL_FILE


def seal(db: Database, index: LanceIndex) -> None:
    """Record that the index is in step with the store. Only once nothing writes either any
    more: the index worker stopped, the index closed. The file first, DuckDB's half last, so a
    crash in between leaves halves that do not match."""
    token = secrets.token_hex(16)
    body = {"token": token, "layout": index.layout(), "tables": index.table_versions()}
    write_text_durably(_seal_path(index), json.dumps(body))
    with db.transaction() as cur:
        db.set_meta(cur, META_SEAL, token)


def take_seal(db: Database, index: LanceIndex) -> frozenset[str] | None:
    """Consume the seal the last shutdown left, if any. Returns the tenants whose tables
    start-up must check, or None: every table."""
    path = _seal_path(index)
    token = db.get_meta(META_SEAL)
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        body = None
    except (OSError, ValueError):
        log.warning("index seal %s unreadable: every table is checked", path)
        body = None
    if token is not None:
        with db.transaction() as cur:
            db.delete_meta(cur, META_SEAL)
    if path.exists():
        path.unlink()
        fsync_path(path.parent)
    if token is None or body is None:
        return None
    if not isinstance(body, dict) or body.get("token") != token:
        log.info("index seal from another shutdown than the store's: every table is checked")
        return None
    if body.get("layout") != index.layout():
        log.info("index sealed with another table layout: every table is checked")
        return None
    sealed: dict[str, str] = body.get("tables") or {}
    return frozenset(t for t, digest in index.table_versions().items() if sealed.get(t) != digest)
