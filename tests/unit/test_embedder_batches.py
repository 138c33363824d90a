"""The ONNX embedder's micro-batches: grouped by length, run side by side, vectors in order."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mnemo_server.config import EmbeddingConfig
from mnemo_server.embed.batching import MAX_PADDING, length_buckets
from mnemo_server.embed.embedder import OnnxEmbedder
from mnemo_server.embed.factory import build_embedder
from mnemo_server.evaluation.synth import memory_text


def _padded_cells(lengths: list[int], group: list[int]) -> int:
    return max(lengths[i] for i in group) * len(group)


def test_buckets_cover_every_index_once_within_the_padding_and_size_bounds() -> None:
    rng = random.Random(3)
    lengths = [rng.randint(3, 120) for _ in range(500)]
    groups = length_buckets(lengths, 16, MAX_PADDING)
    assert sorted(i for g in groups for i in g) == list(range(500))
    for g in groups:
        assert 1 <= len(g) <= 16
        if len(g) > 1:
            assert _padded_cells(lengths, g) <= (1 + MAX_PADDING) * sum(lengths[i] for i in g)
    # Shortest first, and groups do not interleave.
    tops = [max(lengths[i] for i in g) for g in groups]
    bottoms = [min(lengths[i] for i in g) for g in groups]
    assert tops == sorted(tops) and all(b >= t for t, b in zip(tops, bottoms[1:], strict=False))


def test_equal_lengths_fill_whole_batches_and_a_lone_long_text_stays_alone() -> None:
    assert [len(g) for g in length_buckets([40] * 40, 16, MAX_PADDING)] == [16, 16, 8]
    groups = length_buckets([10, 10, 10, 200], 16, MAX_PADDING)
    assert groups == [[0, 1, 2], [3]]
    assert length_buckets([], 16, MAX_PADDING) == []
    # No padding allowed: only equal lengths share a batch.
    assert length_buckets([5, 6, 5, 6], 16, 0.0) == [[0, 2], [1, 3]]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ONNX export for the module's embedders."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def embedder(models: Path) -> Iterator[OnnxEmbedder]:
    built = build_embedder(EmbeddingConfig(), models, threads=1, concurrent_runs=2)
    assert isinstance(built, OnnxEmbedder)
    yield built
    built.close()


def test_a_mixed_batch_gives_each_text_its_own_vector_in_order(embedder: OnnxEmbedder) -> None:
    rng = random.Random(5)
    texts = [memory_text(rng, n) for n in range(40)]
    texts[7] = "deploy"  # far shorter and far longer texts than the rest, in their own batches
    texts[19] = " ".join(texts[:6])
    together = embedder.embed(texts)
    alone = np.stack([embedder.embed([t])[0] for t in texts])
    assert together.shape == (40, embedder.dimension) and together.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, rtol=1e-5)
    # int8 activations are quantised per run, so a batch's company moves a vector a little;
    # a text's vector is still far nearer its own than any other's.
    same = (together * alone).sum(axis=1)
    assert same.min() > 0.97
    nearest = (together @ alone.T).argmax(axis=1)
    assert list(nearest) == list(range(40))


def test_the_index_worker_embeds_a_memory_exactly_as_it_would_the_same_text_as_a_query(models: Path) -> None:
    cfg = EmbeddingConfig()
    index = build_embedder(
        cfg,
        models,
        threads=cfg.index_intra_op_threads,
        batch_size=cfg.index_batch_size,
        concurrent_runs=cfg.index_concurrent_runs,
    )
    query = build_embedder(cfg, models)
    try:
        rng = random.Random(9)
        texts = [memory_text(rng, n) for n in range(24)]
        together = index.embed(texts)
        # Same vector whatever shared the call: the companions do not move it.
        assert np.array_equal(together[5], index.embed([texts[5]])[0])
        assert np.array_equal(together, np.stack([query.embed([t])[0] for t in texts]))
    finally:
        index.close()
        query.close()
