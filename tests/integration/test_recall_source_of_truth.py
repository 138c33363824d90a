"""Recall reads its hits from DuckDB, not from the derived index: a memory deleted while the
index still holds it is never shown, and the next candidates fill its place. Real DuckDB,
LanceDB and embedding model; the index worker is simply not running, so LanceDB lags."""

from __future__ import annotations

from pathlib import Path

from mnemo_server.app import Core
from mnemo_server.memory.model import MemoryDraft
from mnemo_server.memory.service import MemoryPatch
from mnemo_server.retrieval.recall import RecallQuery
from tests.conftest import make_config


def test_memories_deleted_behind_the_index_are_skipped_and_replaced(
    tmp_path: Path, model_cache: Path
) -> None:
    core = Core(make_config(tmp_path / "data", model_cache))
    try:
        core.tenants.ensure_tenant("t")
        drafts = [
            MemoryDraft(f"the deploy checklist step {i} mentions the staging cluster") for i in range(30)
        ]
        drafts += [MemoryDraft(f"an unrelated note about lunch option {i}") for i in range(10)]
        created = core.memories.batch_create("t", drafts, wait_for_index=False)
        core.indexer.start()
        assert core.indexer.wait_idle(60)
        core.indexer.stop()

        query = RecallQuery("deploy checklist staging cluster", top_k=10)
        before = [h.memory.id for h in core.recall.recall("t", query).hits]
        assert len(before) == 10
        gone = set(before[:6])  # most of the head, so more than the first read must be fetched
        for memory_id in gone:
            core.memories.delete("t", memory_id)
        assert core.index.count("t") == 40  # the index still holds them

        after = [h.memory.id for h in core.recall.recall("t", query).hits]
        assert len(after) == 10
        assert not gone & set(after)
        assert after[:4] == before[6:]
        live = {r.memory.id for r in created} - gone
        assert set(after) <= live
    finally:
        core.close()


def test_a_memory_whose_content_changed_behind_the_index_is_not_found_by_its_old_words(
    tmp_path: Path, model_cache: Path
) -> None:
    """Its hit was found by the old text and scored on it, and came back holding the new
    text, without the words it was found by, marked PENDING. A change of something else
    (importance) keeps it found while the index catches up."""
    core = Core(make_config(tmp_path / "data", model_cache))
    try:
        core.tenants.ensure_tenant("t")
        made = core.memories.batch_create(
            "t",
            [
                MemoryDraft("the marmots on the ridge were counted in june"),
                MemoryDraft("the heron nest by the river was empty"),
                MemoryDraft("the beavers rebuilt their dam in the creek"),
            ],
        )
        marmots, heron = made[0].memory.id, made[1].memory.id
        core.indexer.start()
        assert core.indexer.wait_idle(60)
        core.indexer.stop()

        core.memories.update(
            "t", marmots, MemoryPatch(content="the otters in the bay were counted in july"), ["content"]
        )
        core.memories.update("t", heron, MemoryPatch(importance=0.9), ["importance"])
        found = {
            h.memory.id: h.memory for h in core.recall.recall("t", RecallQuery("marmots ridge", top_k=3)).hits
        }
        assert marmots not in found
        assert all("marmots" not in m.content for m in found.values())
        assert heron in {
            h.memory.id for h in core.recall.recall("t", RecallQuery("heron nest river", top_k=3)).hits
        }

        core.indexer.start()
        assert core.indexer.wait_idle(60)
        hits = core.recall.recall("t", RecallQuery("otters bay", top_k=1)).hits
        assert [h.memory.id for h in hits] == [marmots] and hits[0].memory.content.startswith("the otters")
    finally:
        core.close()


def test_rows_a_restart_finds_outside_the_indices_are_folded_in_without_a_write(
    tmp_path: Path, model_cache: Path
) -> None:
    """Rows written after the last optimize: a restarted server searches them flat in LanceDB
    until an optimize, and only a write used to schedule one. Warm-up schedules it now.
    (Without the vector graph: with it there is no ANN index, nor rows outside it.)"""
    cfg = make_config(tmp_path / "data", model_cache, index={"ann_min_rows": 64, "vector_graph": False})

    def write(core: Core, n: int, start: int) -> None:
        drafts = [
            MemoryDraft(f"note {i} on the release train, topic {i % 7}") for i in range(start, start + n)
        ]
        core.memories.batch_create("t", drafts, wait_for_index=False)
        assert core.indexer.wait_idle(60)

    core = Core(cfg)
    try:
        core.tenants.ensure_tenant("t")
        core.indexer.start()
        write(core, 80, 0)
        assert core.optimize_dirty(force=True) == ["t"]
        assert core.index.rows_to_fold("t") == 0
        write(core, 12, 80)
        core.indexer.stop()
    finally:
        core.close()

    core = Core(cfg)
    try:
        assert core.index.stats("t")["pending_rows"] is None  # LanceDB scans the 12 flat
        assert core.index.rows_to_fold("t") == 12
        core.warm_up()
        assert core.indexer.maintenance.dirty() == {"t": 12}
        assert core.optimize_dirty(force=True) == ["t"]
        assert core.index.stats("t")["pending_rows"] == 0  # searched from memory from now on
        assert core.index.rows_to_fold("t") == 0
    finally:
        core.close()

    core = Core(cfg)
    try:
        core.warm_up()
        assert core.indexer.maintenance.dirty() == {}  # nothing left outside: nothing scheduled
    finally:
        core.close()


def test_a_tenant_whose_optimize_fails_is_retried_and_spares_the_others(
    tmp_path: Path, model_cache: Path
) -> None:
    """One tenant's maintenance failing (here its LanceDB data files are gone) neither stops
    the other tenants' nor loses its own rows waiting to be folded in."""
    core = Core(make_config(tmp_path / "data", model_cache, index={"ann_min_rows": 64}))
    try:
        core.indexer.start()
        for tenant_id in ("a", "b"):
            core.tenants.ensure_tenant(tenant_id)
            drafts = [MemoryDraft(f"{tenant_id} note {i} on the release train") for i in range(70)]
            core.memories.batch_create(tenant_id, drafts, wait_for_index=False)
        assert core.indexer.wait_idle(60)
        core.indexer.stop()
        assert core.indexer.maintenance.dirty() == {"a": 70, "b": 70}
        for data_file in (tmp_path / "data").glob("**/t_a.lance/data/*"):
            data_file.unlink()

        assert core.optimize_dirty(force=True) == ["b"]
        assert core.indexer.maintenance.dirty() == {"a": 70}  # handed back, not forgotten
        assert core.index.rows_to_fold("b") == 0
        assert core.optimize_dirty() == []  # not again at once
    finally:
        core.close()
