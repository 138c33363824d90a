"""Start-up checks only the index tables an orderly shutdown's seal does not vouch for
(index/in_step.py). Real DuckDB, LanceDB and embedding model, through Core: each case writes,
shuts down, changes the data directory as a crash, a restore or a stray write would, and
starts again."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from mnemo_server.app import Core
from mnemo_server.config import Config
from mnemo_server.index import in_step
from mnemo_server.index.lance_index import IndexRow, LanceIndex
from mnemo_server.memory.model import MemoryDraft
from mnemo_server.retrieval.recall import RecallQuery
from tests.conftest import make_config

TOPICS = {
    "a": ["the quarterly budget review moved to friday", "alice waters the office plants"],
    "b": ["the staging database is rebuilt every monday", "bob prefers tea over coffee"],
}


def _write(core: Core, tenant: str, texts: list[str]) -> list[str]:
    core.tenants.ensure_tenant(tenant)
    created = core.memories.batch_create(tenant, [MemoryDraft(t) for t in texts], wait_for_index=False)
    return [r.memory.id for r in created]


def _settle(core: Core) -> None:
    core.indexer.start()
    assert core.indexer.wait_idle(60)


def _top_hit(core: Core, tenant: str, text: str) -> str:
    return core.recall.recall(tenant, RecallQuery(text, top_k=3)).hits[0].memory.content


def _indexed_and_closed(cfg: Config) -> dict[str, list[str]]:
    core = _started(cfg)
    try:
        ids = {t: _write(core, t, texts) for t, texts in TOPICS.items()}
        _settle(core)
    finally:
        core.close()
    return ids


def _started(cfg: Config) -> Core:
    """As the server starts: the index checked, then the index worker running."""
    core = Core(cfg)
    core.check_index_at_start()
    _settle(core)
    return core


def test_after_an_orderly_shutdown_start_up_opens_no_table(tmp_path: Path, model_cache: Path) -> None:
    cfg = make_config(tmp_path / "data", model_cache)
    _indexed_and_closed(cfg)
    core = Core(cfg)
    try:
        assert core.tables_to_check == frozenset()
        core.check_index_at_start()
        assert core.index.residency().tenants == 0  # nothing opened
        _settle(core)
        for tenant, texts in TOPICS.items():
            assert _top_hit(core, tenant, texts[0]) == texts[0]
    finally:
        core.close()
    # The seal is taken by the start that reads it: a crash from then on finds none.
    core = Core(cfg)
    try:
        assert core.tables_to_check == frozenset()  # the orderly close above sealed again
        assert in_step.take_seal(core.db, core.index) is None
    finally:
        core.close()


def test_a_start_that_ends_without_an_orderly_shutdown_leaves_every_table_to_check(
    tmp_path: Path, model_cache: Path
) -> None:
    cfg = make_config(tmp_path / "data", model_cache)
    _indexed_and_closed(cfg)
    crashed = Core(cfg)
    assert crashed.tables_to_check == frozenset()
    # Ended as a kill -9 ends it: nothing of close() runs.
    crashed.indexer.stop()
    crashed.index.close()
    crashed.db.close()
    for embedder in (crashed.embedder, crashed.index_embedder, crashed.query_embedder):
        embedder.close()
    core = Core(cfg)
    try:
        assert core.tables_to_check is None
    finally:
        core.close()


def test_a_table_written_after_the_shutdown_is_checked_and_put_right(
    tmp_path: Path, model_cache: Path
) -> None:
    """A row the store does not hold appears in one table, a row it marks as indexed
    disappears from another: both tables are checked, the others are not."""
    cfg = make_config(tmp_path / "data", model_cache)
    ids = _indexed_and_closed(cfg)
    stray = LanceIndex(tmp_path / "data" / "lance", 384, cfg.index)
    vector = np.full(384, 384**-0.5, dtype=np.float32)
    stray.upsert("a", [IndexRow("ghost", "", "semantic", "", "", False, 1, 1, 1, "a ghost row", vector)])
    stray.delete("b", [ids["b"][1]])
    stray.close()

    core = Core(cfg)
    try:
        assert core.tables_to_check == {"a", "b"}
        core.check_index_at_start()
        assert "ghost" not in core.index.revisions("a")
        _settle(core)
        assert set(core.index.revisions("b")) == set(ids["b"])
        assert _top_hit(core, "b", TOPICS["b"][1]) == TOPICS["b"][1]
    finally:
        core.close()


def test_an_index_put_back_from_an_earlier_shutdown_is_checked_in_full(
    tmp_path: Path, model_cache: Path
) -> None:
    """A LanceDB directory and a DuckDB file from different orderly shutdowns: their seals do
    not match, so every table is checked and what the older index lacks is indexed again."""
    cfg = make_config(tmp_path / "data", model_cache)
    _indexed_and_closed(cfg)
    lance = tmp_path / "data" / "lance"
    shutil.copytree(lance, tmp_path / "lance-then")
    later = "the new office opens in march near the river"
    core = _started(cfg)
    try:
        _write(core, "a", [later])
        _settle(core)
    finally:
        core.close()
    shutil.rmtree(lance)
    shutil.copytree(tmp_path / "lance-then", lance)

    core = Core(cfg)
    try:
        assert core.tables_to_check is None
    finally:
        core.close()  # before its check: an orderly close of an unchecked index seals nothing
    core = _started(cfg)
    try:
        assert core.tables_to_check is None
        assert _top_hit(core, "a", later) == later
    finally:
        core.close()  # checked: sealed
    core = Core(cfg)
    try:
        assert core.tables_to_check == frozenset()
    finally:
        core.close()


def test_a_table_gone_since_the_shutdown_is_indexed_again(tmp_path: Path, model_cache: Path) -> None:
    cfg = make_config(tmp_path / "data", model_cache)
    _indexed_and_closed(cfg)
    shutil.rmtree(tmp_path / "data" / "lance" / "t_b.lance")
    core = _started(cfg)
    try:
        assert core.index.count("b") == len(TOPICS["b"])
        assert _top_hit(core, "b", TOPICS["b"][0]) == TOPICS["b"][0]
    finally:
        core.close()


def test_a_seal_made_under_another_layout_checks_every_table(tmp_path: Path, model_cache: Path) -> None:
    _indexed_and_closed(make_config(tmp_path / "data", model_cache))
    # Without the vector graph, tables carry LanceDB's ANN index: another layout.
    core = Core(make_config(tmp_path / "data", model_cache, index={"vector_graph": False}))
    try:
        assert core.tables_to_check is None
    finally:
        core.close()


def test_a_table_emptied_since_the_shutdown_is_indexed_again(tmp_path: Path, model_cache: Path) -> None:
    """An empty table used to be passed over by the check: the rows DuckDB marks as indexed
    in it stayed unsearchable."""
    cfg = make_config(tmp_path / "data", model_cache)
    ids = _indexed_and_closed(cfg)
    stray = LanceIndex(tmp_path / "data" / "lance", 384, cfg.index)
    stray.delete("b", ids["b"])
    assert stray.count("b") == 0
    stray.close()
    core = _started(cfg)
    try:
        assert core.tables_to_check == {"b"}
        assert core.index.count("b") == len(TOPICS["b"])
        assert _top_hit(core, "b", TOPICS["b"][0]) == TOPICS["b"][0]
    finally:
        core.close()
