"""The index worker embeds a short batch on the query session (one thread) and a long one
on its own (two threads): both give the same vectors, and each batch goes to the session its
length calls for. Real DuckDB, LanceDB and embedding model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mnemo_server.app import Core
from mnemo_server.embed.embedder import Embedder, Vectors
from mnemo_server.memory.model import MemoryDraft
from tests.conftest import make_config


class Counted:
    """A real embedder that counts the texts it was given per call."""

    def __init__(self, inner: Embedder):
        self.inner = inner
        self.model_id = inner.model_id
        self.dimension = inner.dimension
        self.calls: list[int] = []

    def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls.append(len(texts))
        return self.inner.embed(texts)


def test_short_batches_go_to_the_query_session_and_long_ones_to_the_index_s(
    tmp_path: Path, model_cache: Path
) -> None:
    core = Core(make_config(tmp_path / "data", model_cache))
    try:
        core.tenants.ensure_tenant("t")
        assert core.indexer.small_batches is not None
        small, limit = core.indexer.small_batches
        assert limit == 4 and small is core.embedder
        text = "the staging cluster was drained before the upgrade"
        np.testing.assert_allclose(small.embed([text]), core.indexer.embedder.embed([text]), atol=1e-5)

        counted_small, counted_large = Counted(small), Counted(core.indexer.embedder)
        core.indexer.small_batches = (counted_small, limit)
        core.indexer.embedder = counted_large
        core.memories.batch_create("t", [MemoryDraft(f"bulk note {i} about the deploy") for i in range(20)])
        core.indexer.start()
        assert core.indexer.wait_idle(60)
        core.memories.create("t", MemoryDraft(text), wait_for_index=True, wait_timeout_s=30)
        core.indexer.stop()
        assert counted_large.calls and min(counted_large.calls) > limit
        assert counted_small.calls and max(counted_small.calls) <= limit
        assert sum(counted_large.calls) + sum(counted_small.calls) == 21
        assert core.index.count("t") == 21
    finally:
        core.close()
