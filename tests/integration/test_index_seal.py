"""Start-up checks only the index tables an orderly shutdown's seal does not vouch for, and
after a crash every table's rows but not their layout (index/in_step.py). Real DuckDB, LanceDB
and embedding model, through Core: each case writes, shuts down, changes the data directory as
a crash, a restore or a stray write would, and starts again."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from mnemo_server.app import Core
from mnemo_server.config import Config
from mnemo_server.errors import Unavailable
from mnemo_server.index import in_step, indexer
from mnemo_server.index.in_step import EVERY_TABLE, StartCheck
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


def _start_check(cfg: Config) -> StartCheck:
    """What a start would check, by a Core opened and closed without checking anything: its
    close seals again only an index that needed no check."""
    core = Core(cfg)
    try:
        return core.start_check
    finally:
        core.close()


def test_after_an_orderly_shutdown_start_up_opens_no_table(tmp_path: Path, model_cache: Path) -> None:
    cfg = make_config(tmp_path / "data", model_cache)
    _indexed_and_closed(cfg)
    core = Core(cfg)
    try:
        assert core.start_check == StartCheck(layout=frozenset(), rows=frozenset())
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
        assert core.start_check == StartCheck(layout=frozenset(), rows=frozenset())  # sealed again
        assert in_step.take_seal(core.db, core.index) == EVERY_TABLE
    finally:
        core.close()


def _killed(core: Core) -> None:
    """End it as a kill -9 does: nothing of close() runs."""
    core.indexer.stop()
    core.index.close()
    core.db.close()
    for embedder in (core.embedder, core.index_embedder, core.query_embedder):
        embedder.close()


def _ghost_row(cfg: Config, data: Path, tenant: str) -> None:
    """A row LanceDB holds and the store does not, as a crash between a delete's commit and
    its removal from the index leaves behind (or a stray writer)."""
    stray = LanceIndex(data / "lance", 384, cfg.index)
    vector = np.full(384, 384**-0.5, dtype=np.float32)
    stray.upsert(tenant, [IndexRow("ghost", "", "semantic", "", "", False, 1, 1, 1, "a ghost row", vector)])
    stray.close()


def test_a_start_that_ends_before_its_check_leaves_every_table_to_check(
    tmp_path: Path, model_cache: Path
) -> None:
    cfg = make_config(tmp_path / "data", model_cache)
    _indexed_and_closed(cfg)
    crashed = Core(cfg)
    assert crashed.start_check == StartCheck(layout=frozenset(), rows=frozenset())
    _killed(crashed)
    assert _start_check(cfg) == EVERY_TABLE


@pytest.mark.parametrize("slice_s", [indexer._CHECK_SLICE_S, 0.0], ids=["one slice", "a slice a table"])
def test_after_a_crash_every_tables_rows_are_checked_once_serving_and_no_layout(
    tmp_path: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch, slice_s: float
) -> None:
    """A server that checked the index at start-up and then crashed: the next start opens no
    table before serving; the index worker then compares every table's rows with the store's,
    and an orderly close after that seals the index again. With no time for a second table
    in a slice, each table is a slice of its own."""
    monkeypatch.setattr(indexer, "_CHECK_SLICE_S", slice_s)
    cfg = make_config(tmp_path / "data", model_cache)
    ids = _indexed_and_closed(cfg)
    later = "the new office opens in march near the river"
    crashed = _started(cfg)
    _write(crashed, "b", [later])
    _settle(crashed)
    _killed(crashed)
    _ghost_row(cfg, tmp_path / "data", "a")
    _ghost_row(cfg, tmp_path / "data", "b")

    core = Core(cfg)
    try:
        assert core.start_check == StartCheck(layout=frozenset(), rows=None)
        core.check_index_at_start()
        assert core.index.residency().tenants == 0  # no table opened before serving
        assert core.indexer.stats.tables_to_check == 2 and not core.index_in_step
        _settle(core)
        assert core.indexer.stats.tables_to_check == 0 and core.index_in_step
        assert set(core.index.revisions("a")) == set(ids["a"])  # the ghost row removed
        assert "ghost" not in core.index.revisions("b")
        assert _top_hit(core, "b", "when does the new office open") == later
    finally:
        core.close()
    assert _start_check(cfg) == StartCheck(layout=frozenset(), rows=frozenset())


def test_a_close_before_the_rows_check_is_done_seals_nothing(tmp_path: Path, model_cache: Path) -> None:
    cfg = make_config(tmp_path / "data", model_cache)
    _indexed_and_closed(cfg)
    crashed = _started(cfg)
    _killed(crashed)
    core = Core(cfg)
    try:
        core.check_index_at_start()  # the index worker never runs: no table is compared
        assert not core.index_in_step
    finally:
        core.close()
    core = _started(cfg)
    try:
        assert core.start_check == StartCheck(layout=frozenset(), rows=None)
    finally:
        core.close()


def test_a_close_with_index_work_left_seals_nothing_and_the_next_start_removes_the_deleted_row(
    tmp_path: Path, model_cache: Path
) -> None:
    """The index worker stops with a delete still queued (crash probe: under create and
    delete load a SIGTERM left 21 deleted memories in the index, for good: the seal vouched
    for the tables, so no later start compared their rows). Such a close seals nothing; the
    next start compares the tables' rows with the store's and removes the deleted one."""
    cfg = make_config(tmp_path / "data", model_cache)
    ids = _indexed_and_closed(cfg)
    core = _started(cfg)
    try:
        core.indexer.stop()  # the worker ends first, as it may at close under load
        doomed = ids["a"][0]
        core.memories.delete("a", doomed)  # committed; its removal from the index queued
        assert core.indexer.pending() == 1 and doomed in core.index.revisions("a")
    finally:
        core.close()
    core = _started(cfg)  # the rows check runs on the worker once serving
    try:
        assert core.start_check.rows is None  # every table, as after a crash
        assert doomed not in core.index.revisions("a") and core.index_in_step
    finally:
        core.close()
    assert _start_check(cfg) == StartCheck(layout=frozenset(), rows=frozenset())  # sealed again


def test_a_crash_under_another_layout_checks_every_table(tmp_path: Path, model_cache: Path) -> None:
    cfg = make_config(tmp_path / "data", model_cache)
    _indexed_and_closed(cfg)
    _killed(_started(cfg))
    # Without the vector graph, tables carry LanceDB's ANN index: another layout.
    assert _start_check(make_config(tmp_path / "data", model_cache, index={"vector_graph": False})) == (
        EVERY_TABLE
    )


def test_a_table_written_after_the_shutdown_is_checked_and_put_right(
    tmp_path: Path, model_cache: Path
) -> None:
    """A row the store does not hold appears in one table, a row it marks as indexed
    disappears from another: both tables are checked, the others are not."""
    cfg = make_config(tmp_path / "data", model_cache)
    ids = _indexed_and_closed(cfg)
    _ghost_row(cfg, tmp_path / "data", "a")
    stray = LanceIndex(tmp_path / "data" / "lance", 384, cfg.index)
    stray.delete("b", [ids["b"][1]])
    stray.close()

    core = Core(cfg)
    try:
        assert core.start_check == StartCheck(layout=frozenset({"a", "b"}), rows=frozenset({"a", "b"}))
        core.check_index_at_start()
        assert core.indexer.stats.tables_to_check == 2
        _settle(core)
        assert "ghost" not in core.index.revisions("a")
        assert set(core.index.revisions("b")) == set(ids["b"])
        assert _top_hit(core, "b", TOPICS["b"][1]) == TOPICS["b"][1]
    finally:
        core.close()


def test_an_index_put_back_from_an_earlier_shutdown_is_checked_in_full(
    tmp_path: Path, model_cache: Path
) -> None:
    """A LanceDB directory and a DuckDB file from different orderly shutdowns: their seals do
    not match, so every table's rows are checked and what the older index lacks is indexed
    again (the tables are as that older seal says: their layout is not checked)."""
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

    # Closed before its check: an orderly close of an unchecked index seals nothing.
    assert _start_check(cfg) == StartCheck(layout=frozenset(), rows=None)
    core = _started(cfg)
    try:
        assert core.start_check == EVERY_TABLE
        assert _top_hit(core, "a", later) == later
    finally:
        core.close()  # checked: sealed
    assert _start_check(cfg) == StartCheck(layout=frozenset(), rows=frozenset())


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
    assert _start_check(make_config(tmp_path / "data", model_cache, index={"vector_graph": False})) == (
        EVERY_TABLE
    )


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
        assert core.start_check == StartCheck(layout=frozenset({"b"}), rows=frozenset({"b"}))
        assert core.index.count("b") == len(TOPICS["b"])
        assert _top_hit(core, "b", TOPICS["b"][0]) == TOPICS["b"][0]
    finally:
        core.close()


def test_a_table_that_does_not_read_holds_back_no_other_in_the_check(
    tmp_path: Path, model_cache: Path
) -> None:
    """After a crash, one tenant's table whose data files are gone fails its comparison: the
    other tables are still compared and put right, the failed one is tried again and counted,
    and the index is not sealed while it stays unchecked."""
    cfg = make_config(tmp_path / "data", model_cache)
    _indexed_and_closed(cfg)
    _killed(_started(cfg))
    _ghost_row(cfg, tmp_path / "data", "a")
    for data_file in (tmp_path / "data" / "lance" / "t_b.lance" / "data").iterdir():
        data_file.unlink()

    core = Core(cfg)
    try:
        core.check_index_at_start()
        core.indexer.start()
        deadline = time.monotonic() + 60
        while "ghost" in core.index.revisions("a") or core.indexer.stats.failed_batches < 2:
            assert time.monotonic() < deadline, "the check never put table a right or retried b"
            time.sleep(0.05)
        assert core.indexer.stats.tables_to_check == 1 and not core.index_in_step
    finally:
        core.close()
    assert _start_check(cfg) == StartCheck(layout=frozenset(), rows=None)  # not sealed


def _truncate_data_files(table: Path) -> None:
    for data_file in (table / "data").iterdir():
        data_file.write_bytes(data_file.read_bytes()[:100])


def _zero_newest_manifest(table: Path) -> None:
    manifests = sorted(p for p in (table / "_versions").iterdir() if p.suffix == ".manifest")
    manifests[0].write_bytes(b"\0" * 10)  # their names count down: the first is the newest


@pytest.mark.parametrize(
    ("damage", "sealed"),
    [(_truncate_data_files, True), (_zero_newest_manifest, True), (_zero_newest_manifest, False)],
    ids=["data files truncated", "newest manifest zeroed", "newest manifest zeroed, no seal"],
)
def test_a_damaged_table_is_dropped_at_start_up_and_its_tenant_indexed_again(
    tmp_path: Path,
    model_cache: Path,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[Path], None],
    sealed: bool,
) -> None:
    """A table whose files do not read (a disk error, a partial copy) crashed start-up with a
    traceback: in warm-up, its first full read, or in the layout check of a directory with no
    seal. It is derived from DuckDB: dropped, and its tenant's memories indexed again; the
    other tenant's table is kept."""
    cfg = make_config(tmp_path / "data", model_cache)
    _indexed_and_closed(cfg)
    damage(tmp_path / "data" / "lance" / "t_b.lance")
    if not sealed:
        (tmp_path / "data" / "lance" / in_step.SEAL_FILE).unlink()
    core = Core(cfg)
    try:
        with caplog.at_level(logging.INFO, logger="mnemo_server"):
            core.check_index_at_start()
            core.warm_up()
        assert "index table of tenant b does not read" in caplog.text
        assert "re-indexing tenant b" in caplog.text and "re-indexing tenant a" not in caplog.text
        _settle(core)
        assert core.index.count("b") == len(TOPICS["b"])
        for tenant, texts in TOPICS.items():
            assert _top_hit(core, tenant, texts[1]) == texts[1]
    finally:
        core.close()


def test_a_damaged_table_warm_up_did_not_load_is_dropped_at_its_first_search_and_indexed_again(
    tmp_path: Path, model_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Warm-up loads only the resident tenants (here one, b, the newest); a's damaged table
    is first read by its first search's background load, which failed at every search after
    (UNAVAILABLE, INDEX_LOADING, until a restart). It is dropped there and a indexed again."""
    cfg = make_config(tmp_path / "data", model_cache, index={"max_resident_tenants": 1, "load_wait_s": 0.5})
    _indexed_and_closed(cfg)
    _truncate_data_files(tmp_path / "data" / "lance" / "t_a.lance")
    core = Core(cfg)
    try:
        with caplog.at_level(logging.INFO, logger="mnemo_server"):
            core.check_index_at_start()
            core.warm_up()
            assert "re-indexing tenant" not in caplog.text  # a's files were not read yet
            core.indexer.start()
            deadline = time.monotonic() + 60
            while True:
                try:
                    hits = core.recall.recall("a", RecallQuery(TOPICS["a"][1], top_k=3)).hits
                    if hits and hits[0].memory.content == TOPICS["a"][1]:
                        break
                except Unavailable:
                    pass  # its load, or its indexing again, under way
                assert time.monotonic() < deadline, "tenant a's searches never recovered"
                time.sleep(0.1)
        assert (
            "index table of tenant a does not read" in caplog.text and "re-indexing tenant a" in caplog.text
        )
        assert core.indexer.wait_idle(60) and core.index.count("a") == len(TOPICS["a"])
        assert _top_hit(core, "b", TOPICS["b"][1]) == TOPICS["b"][1]
    finally:
        core.close()
