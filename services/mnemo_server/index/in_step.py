"""Which LanceDB tables start-up must check against DuckDB, and how: none that an orderly
shutdown left in step and that nothing has written since.

Start-up checks tenants' tables two ways:
- their layout (LanceIndex.drop_outdated): a table another server version or configuration
  wrote is rebuilt. A table that does not read would fail searches, so this is done before
  serving. It opens each table: ~3 ms a tenant.
- their rows against DuckDB's (IndexWorker.check_rows: rows DuckDB no longer holds as live,
  rows at another revision). That reads every id, ~1.4 ms a tenant, and runs on the index
  worker once serving: meanwhile Recall already drops any hit DuckDB does not hold as live,
  and a row the check finds missing is as one still waiting to be indexed.
Those checks find something only after a crash, in a data directory put together from
different moments (a restored backup), or in a table another server version or configuration
wrote. 2,000 tenants of 5 memories were serving after 17.3 s when every table was checked
before serving, after 3.0 s once only the tables below were.

So an orderly shutdown, once the index worker has stopped and the last LanceDB write is done,
seals the index. The seal holds:
- a token, written both in a file of the LanceDB directory and in DuckDB's store_meta: a
  LanceDB directory and a DuckDB file from different shutdowns do not match;
- the table layout this configuration writes (LanceIndex.layout): another one is checked;
- per table, a digest of its version manifests' names (LanceIndex.table_versions): every
  LanceDB commit adds one, so a table written or put back since differs.
The next start takes the seal, removing both halves before anything is written (a crash later
finds none), and checks only the tables that differ from it or are new. With a seal whose
halves do not match, every table's rows are checked, and the layout of those that differ.

Once start-up has checked the layout, the same file says so while the server runs ("every
table here has this layout": tables this server writes have it). A start after a crash finds
that record: it checks every table's rows, but no table's layout, and serves ~3x sooner. With
no file at all, or another layout, every table is checked both ways. (A table that is gone is
found either way: IndexWorker.check_rows indexes again the rows DuckDB marks as indexed in a
table that does not exist.)
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnemo_server.index.lance_index import LanceIndex
from mnemo_server.store.database import Database
from mnemo_server.store.durable import fsync_path, write_text_durably

log = logging.getLogger(__name__)

SEAL_FILE = "in_step.json"
META_SEAL = "index_seal"


@dataclass(frozen=True)
class StartCheck:
    """The tables start-up must check, by tenant; None: every table."""

    layout: frozenset[str] | None
    rows: frozenset[str] | None

    @property
    def needed(self) -> bool:
        return self.layout != frozenset() or self.rows != frozenset()


EVERY_TABLE = StartCheck(layout=None, rows=None)


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


def record_layout(index: LanceIndex) -> None:
    """Record, while serving, that every table has this configuration's layout: once
    start-up has checked it (or rebuilt the tables). No token: it says nothing of the rows."""
    write_text_durably(_seal_path(index), json.dumps({"layout": index.layout()}))


def take_seal(db: Database, index: LanceIndex) -> StartCheck:
    """Consume the seal the last shutdown left, if any (or the layout record of a server that
    ended without one), and say which tables start-up must check."""
    path = _seal_path(index)
    token = db.get_meta(META_SEAL)
    body: Any
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
    if not isinstance(body, dict):
        return EVERY_TABLE
    if body.get("layout") != index.layout():
        log.info("index last written with another table layout: every table is checked")
        return EVERY_TABLE
    if "tables" not in body:
        log.info("the last server ended without an orderly shutdown: every table's rows are checked")
        return StartCheck(layout=frozenset(), rows=None)
    sealed: dict[str, str] = body.get("tables") or {}
    changed = frozenset(t for t, digest in index.table_versions().items() if sealed.get(t) != digest)
    if token is None or body.get("token") != token:
        log.info("index sealed at another shutdown than the store's: every table's rows are checked")
        return StartCheck(layout=changed, rows=None)
    return StartCheck(layout=changed, rows=changed)
