"""The embedding blend with the real bundled model: texts longer than the model reads are
cut before tokenising without changing their vectors, and a call stops at its deadline
within one step of work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mnemo_server.errors import DeadlineExceeded
from mnemo_sidecar.deadlines import Deadline
from mnemo_sidecar.embedding_blend import MAX_TOKENS, EmbeddingBlend
from mnemo_sidecar.readable import readable_prefix


def _long(seed: int, words: int = 2_400) -> str:
    return " ".join(f"memory{seed}x{i}, moved on Monday." for i in range(words // 4))


def test_a_long_text_gets_the_vector_of_the_whole_text(model_cache: Path) -> None:
    blend = EmbeddingBlend(model_cache)
    texts = [_long(1), "short memory", "tabs\tand\nlines " * 200]
    blend.score("when did she move?", texts, [0.5] * 3, Deadline.none())
    whole = blend._model().embed(texts)  # the same texts in one call run in the same batches
    for text, vector in zip(texts, whole, strict=True):
        np.testing.assert_array_equal(blend._vectors[text], vector)
    assert len(readable_prefix(texts[0], MAX_TOKENS)) < len(texts[0]) // 5  # it was cut


def test_a_call_past_its_deadline_stops_after_one_step(model_cache: Path) -> None:
    blend = EmbeddingBlend(model_cache)
    blend.warm_up()
    blend.score("q", [_long(0)], [0.5], Deadline.none())  # the pace of a long text is known
    with pytest.raises(DeadlineExceeded):
        blend.score("q", [_long(seed) for seed in range(1, 41)], [0.5] * 40, Deadline(0.005))
    assert len(blend._vectors) <= 2  # a batch of 16 used to start whatever the time left
