"""The query-embedding cache: a query is embedded on a worker while the caller goes on, with
the same vector it gets inline, once, and errors reach the caller."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from mnemo_server.config import EmbeddingConfig
from mnemo_server.embed.embedder import CachedQueryEmbedder, Embedder, Vectors
from mnemo_server.embed.factory import build_embedder


class Recording:
    """The real embedder, noting which thread embedded which texts."""

    def __init__(self, inner: Embedder, fail_on: str = ""):
        self.inner = inner
        self.model_id, self.dimension = inner.model_id, inner.dimension
        self.calls: list[tuple[str, list[str]]] = []
        self.fail_on = fail_on

    def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls.append((threading.current_thread().name, list(texts)))
        if self.fail_on in texts:
            raise RuntimeError(f"cannot embed {self.fail_on!r}")
        return self.inner.embed(texts)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def onnx(model_cache: Path) -> Iterator[Embedder]:
    built = build_embedder(EmbeddingConfig(), model_cache)
    yield built
    built.close()


def test_a_query_is_embedded_on_a_worker_with_the_vector_it_gets_inline(onnx: Embedder) -> None:
    recording = Recording(onnx)
    queries = CachedQueryEmbedder(recording, capacity=8, workers=2)
    inline = CachedQueryEmbedder(onnx, capacity=8)
    try:
        text = "who owns the billing service"
        vector_soon = queries.embed_soon(text)
        vector = vector_soon()
        assert recording.calls[0][0].startswith("mnemo-query-embed")
        assert np.array_equal(vector, inline.embed_one(text))
        assert vector_soon() is vector
        # Cached now: neither call embeds it again.
        assert queries.embed_soon(text)() is vector
        assert queries.embed_one(text) is vector
        assert len(recording.calls) == 1
    finally:
        queries.close()
        inline.close()


def test_without_workers_the_caller_embeds_before_embed_soon_returns(onnx: Embedder) -> None:
    recording = Recording(onnx)
    queries = CachedQueryEmbedder(recording, capacity=8)
    vector_soon = queries.embed_soon("why was the deploy rolled back")
    assert recording.calls == [(threading.current_thread().name, ["why was the deploy rolled back"])]
    assert vector_soon().shape == (onnx.dimension,)


def test_an_embedding_error_reaches_the_caller_and_is_not_cached(onnx: Embedder) -> None:
    recording = Recording(onnx, fail_on="bad query")
    queries = CachedQueryEmbedder(recording, capacity=8, workers=1)
    try:
        vector_soon = queries.embed_soon("bad query")
        with pytest.raises(RuntimeError, match="cannot embed"):
            vector_soon()
        recording.fail_on = ""
        assert queries.embed_soon("bad query")().shape == (onnx.dimension,)
        assert len(recording.calls) == 2
    finally:
        queries.close()
    with pytest.raises(RuntimeError):  # closed: no worker takes a new query
        queries.embed_soon("a query after close")
