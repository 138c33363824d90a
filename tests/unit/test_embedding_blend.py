"""The embedding blend with the real bundled model: texts longer than the model reads are
cut before tokenising without changing their vectors, and a call stops at its deadline
within one step of work."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mnemo_server.errors import DeadlineExceeded
from mnemo_sidecar.deadlines import Deadline
from mnemo_sidecar.embedding_blend import MAX_TOKENS, EmbeddingBlend
from mnemo_sidecar.readable import readable_prefix
from mnemo_sidecar.text_key import text_key


def _long(seed: int, words: int = 2_400) -> str:
    return " ".join(f"memory{seed}x{i}, moved on Monday." for i in range(words // 4))


def test_a_long_text_gets_the_vector_of_the_whole_text(model_cache: Path) -> None:
    blend = EmbeddingBlend(model_cache)
    texts = [_long(1), "short memory", "tabs\tand\nlines " * 200]
    blend.score("when did she move?", texts, [0.5] * 3, Deadline.none())
    whole = blend._model().embed(texts)  # the same texts in one call run in the same batches
    for text, vector in zip(texts, whole, strict=True):
        np.testing.assert_array_equal(blend._vectors[text_key(text)], vector)
    assert len(readable_prefix(texts[0], MAX_TOKENS)) < len(texts[0]) // 5  # it was cut


def test_a_step_the_time_left_cannot_hold_is_refused_not_run(model_cache: Path) -> None:
    """One text the deadline had no time for was embedded all the same: the answer came
    20-85 ms after the caller's deadline (sidecar probe)."""
    blend = EmbeddingBlend(model_cache)
    blend.warm_up()
    started = time.perf_counter()
    blend.score("q", [_long(0)], [0.5], Deadline.none())  # the pace of a long text is known
    one_text_s = time.perf_counter() - started
    deadline_s = one_text_s / 4
    started = time.perf_counter()
    with pytest.raises(DeadlineExceeded) as err:
        blend.score("q", [_long(seed) for seed in range(1, 41)], [0.5] * 40, Deadline(deadline_s))
    took = time.perf_counter() - started
    assert err.value.reason == "SIDECAR_DEADLINE"
    assert len(blend._vectors) == 1  # none of the 40: a batch of 16 used to start regardless
    # Not a text's time past the deadline (slack for the short query's embedding on a busy
    # machine: refused up front, the candidates cost nothing).
    assert took < deadline_s + one_text_s / 2, (took, deadline_s, one_text_s)


def test_the_cache_keeps_vectors_not_texts(model_cache: Path) -> None:
    """Keyed by the text, it kept each text whole: ~80 KB for 20,000 four-byte characters
    beside a 1.5 KB vector, ~1.6 GB at its 20,000 entries."""
    blend = EmbeddingBlend(model_cache)
    texts = [f"{n} " + "\U0001f600" * 20_000 for n in range(20)]
    blend.score("q", texts, [0.5] * len(texts), Deadline.none())
    held = sum(sys.getsizeof(key) + vector.nbytes for key, vector in blend._vectors.items())
    assert len(blend._vectors) == 20 and held < 20 * 2_048
    again = blend.score("q", texts, [0.5] * len(texts), Deadline.none())  # from the cache
    assert len(blend._vectors) == 20 and again.shape == (20,)
