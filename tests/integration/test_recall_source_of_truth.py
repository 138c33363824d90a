"""Recall reads its hits from DuckDB, not from the derived index: a memory deleted while the
index still holds it is never shown, and the next candidates fill its place. Real DuckDB,
LanceDB and embedding model; the index worker is simply not running, so LanceDB lags."""

from __future__ import annotations

from pathlib import Path

from mnemo_server.app import Core
from mnemo_server.memory.model import MemoryDraft
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
