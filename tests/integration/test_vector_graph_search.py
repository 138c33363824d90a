"""Unfiltered vector searches are answered by the in-process graph, which follows every write
and delete at once (before its feeder has moved them in) and is rebuilt from the table at
warm-up after a restart. Real DuckDB, LanceDB and embedding model."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from mnemo_server.app import Core
from mnemo_server.index.lance_index import LanceIndex
from mnemo_server.memory.model import MemoryDraft, MemoryFilter
from tests.conftest import make_config


def _top(core: Core, text: str, k: int = 5) -> list[tuple[str, float]]:
    vector = core.recall.embedder.embed_one(text)
    return [(h.id, h.score) for h in core.index.vector_search("t", vector, k, MemoryFilter())]


def _drained(core: Core) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while core.index.stats("t")["graph_queued"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return core.index.stats("t")


def test_the_graph_answers_follows_writes_and_is_rebuilt_after_a_restart(
    tmp_path: Path, model_cache: Path
) -> None:
    cfg = make_config(tmp_path / "data", model_cache)
    texts = [
        f"memo {i}: the {c} team moved the {p} review to friday"
        for i, (c, p) in enumerate(
            (c, p) for c in ("data", "infra", "mobile", "search", "billing", "design") for p in range(8)
        )
    ]
    core = Core(cfg)
    try:
        core.tenants.ensure_tenant("t")
        core.indexer.start()
        created = core.memories.batch_create("t", [MemoryDraft(t) for t in texts], wait_for_index=False)
        assert core.indexer.wait_idle(60)
        ids = {r.memory.content: r.memory.id for r in created}
        assert _drained(core)["graph_rows"] == len(texts)

        top = _top(core, texts[17])
        assert top[0][0] == ids[texts[17]] and top[0][1] > 0.99

        # Written and deleted: searched from the graph's queue before the feeder moves them.
        added = core.memories.batch_create(
            "t", [MemoryDraft("the kitchen fridge is cleaned on mondays")], wait_for_index=False
        )
        core.memories.delete("t", ids[texts[17]])
        assert core.indexer.wait_idle(60)
        assert _top(core, "the kitchen fridge is cleaned on mondays")[0][0] == added[0].memory.id
        assert ids[texts[17]] not in dict(_top(core, texts[17], 20))
        stats = _drained(core)
        assert stats["graph_rows"] == len(texts)  # one in, one out
        core.indexer.stop()
    finally:
        core.close()

    core = Core(cfg)
    # LanceDB's own exact search of the same table, with no in-memory index: the reference.
    lance_only = LanceIndex(
        core.paths.lance,
        core.embedder.dimension,
        dataclasses.replace(cfg.index, vector_graph=False, exact_scope_search_max_rows=0),
    )
    try:
        assert core.index.stats("t")["graph_rows"] is None  # not built before warm-up
        vector = core.recall.embedder.embed_one(texts[5])
        lance_top = [(h.id, h.score) for h in lance_only.vector_search("t", vector, 5, MemoryFilter())]
        core.warm_up()
        assert core.index.stats("t")["graph_rows"] == len(texts)
        graph_top = _top(core, texts[5])
        assert graph_top[0][0] == lance_top[0][0] == ids[texts[5]]
        assert {i for i, _ in graph_top} == {i for i, _ in lance_top}
        assert ids[texts[17]] not in dict(_top(core, texts[17], 20))
    finally:
        lance_only.close()
        core.close()
