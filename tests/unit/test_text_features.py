"""The columns the ranker derives from the query and the candidate texts, and that a ranker
learns from them what the server's features do not carry."""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from mnemo_sidecar.config import RankerConfig
from mnemo_sidecar.learning.model import Candidate, FeedbackCandidate, FeedbackSession
from mnemo_sidecar.learning.pair_store import split_heldout
from mnemo_sidecar.learning.trainer import baseline_ndcg, ranker_ndcg
from mnemo_sidecar.ranker.model import session_matrix, train_ranker
from mnemo_sidecar.ranker.text_features import (
    TEXT_FEATURES,
    _DerivedCache,
    memory_markers,
    question_kinds,
    text_feature_matrix,
)


def kinds_asked(query: str) -> set[str]:
    return {name for name, v in question_kinds(query).items() if v}


def test_question_kinds_name_what_is_asked_most_specific_first() -> None:
    assert kinds_asked("How many turtles does Nate have?") == {"txt_q_how_many"}
    assert kinds_asked("How did she feel about it?") == {"txt_q_how"}
    assert kinds_asked("When did Maria go to the beach?") == {"txt_q_when"}
    assert kinds_asked("Did John adopt a dog?") == {"txt_q_yes_no"}
    assert kinds_asked("Where and with whom did they travel?") == {"txt_q_where", "txt_q_who"}
    assert kinds_asked("Would Ann likely enjoy jazz?") == {"txt_q_would", "txt_q_likely", "txt_q_yes_no"}
    assert kinds_asked("tell me about the garden") == set()


def test_memory_markers_read_times_counts_places_and_names_but_not_the_speaker() -> None:
    time_, number, place, capitalised, quoted, words_log = memory_markers(
        "Maria: We moved to Paris last spring. It was lovely."
    )
    # "Maria" speaks, "We" and "It" open sentences: only "Paris" is a name.
    assert (time_, number, place, capitalised, quoted) == (1.0, 0.0, 1.0, 1.0, 0.0)
    assert words_log == np.log1p(9)
    assert memory_markers("I have 3 turtles.")[:3] == (0.0, 1.0, 0.0)
    assert memory_markers("We met on a Friday in May.")[0] == 1.0
    # "may" the verb is no month; a plain sentence has no marker.
    assert memory_markers("I may try it, and you may like it.")[:5] == (0.0, 0.0, 0.0, 0.0, 0.0)
    assert memory_markers('John: I loved reading "Dune" so much.')[4] == 1.0
    assert memory_markers("Nate: I talked to Joanna and Tim and Ann and Max and Lee and Bo")[3] == 5.0


def test_text_feature_matrix_crosses_the_question_with_each_text() -> None:
    texts = ["Ann: We went to the beach last month.", "Ann: The beach is nice.", ""]
    x = text_feature_matrix("When did Ann go to the beach?", texts)
    col = {name: x[:, i] for i, name in enumerate(TEXT_FEATURES)}
    assert x.shape == (3, len(TEXT_FEATURES)) and x.dtype == np.float32
    assert col["txt_q_when"].tolist() == [1.0, 1.0, 1.0]
    assert col["txt_when_time"].tolist() == [1.0, 0.0, 0.0]
    # Of the query's 6 word pairs, "to the" and "the beach" are in the first text.
    assert np.allclose(col["txt_bigram_overlap"], [2 / 6, 1 / 6, 0.0])
    assert col["txt_count_number"].tolist() == [0.0, 0.0, 0.0]
    assert text_feature_matrix("When?", []).shape == (0, len(TEXT_FEATURES))


def test_session_matrix_derives_the_text_columns_a_model_asks_for() -> None:
    cands = tuple(
        FeedbackCandidate(Candidate(f"m{i}", text, 0.5, (0.5, 9.0)), 0.0, 0)
        for i, text in enumerate(["We met in 2019.", "Nothing here."])
    )
    # A server that sent a column of the same name does not override the derived one.
    s = FeedbackSession("s", "When did we meet?", ("baseline_score", "txt_m_time"), cands)
    got = session_matrix(s, ("txt_when_time", "baseline_score", "txt_m_time"), None)
    np.testing.assert_array_equal(got, np.asarray([[1.0, 0.5, 1.0], [0.0, 0.5, 0.0]], dtype=np.float32))
    # A model without text columns gets the server's values only.
    np.testing.assert_array_equal(
        session_matrix(s, ("baseline_score",), None), np.asarray([[0.5], [0.5]], dtype=np.float32)
    )


FILLERS = [
    "I like green tea.",
    "That sounds fun!",
    "Thanks for asking.",
    "My cat sleeps a lot.",
    "Good luck!",
]
TIMED = [
    "We went there last week.",
    "It happened yesterday.",
    "That was in 2021.",
    "I started two years ago.",
]


def when_session(i: int, rng: random.Random, n: int = 12) -> FeedbackSession:
    """A "when" question whose one relevant memory is the only one saying when; the
    server's features are noise and the baseline ignores the texts."""
    relevant = rng.randrange(n)
    cands = []
    for j in range(n):
        text = rng.choice(TIMED) if j == relevant else rng.choice(FILLERS)
        base = rng.random()
        features = (float(np.float32(base)), float(np.float32(rng.random())))
        cands.append(FeedbackCandidate(Candidate(f"m{i}-{j}", text, base, features), float(j == relevant), 0))
    ranked = sorted(cands, key=lambda c: -c.candidate.baseline_score)
    cands = [replace(c, baseline_rank=ranked.index(c) + 1) for c in cands]
    return FeedbackSession(f"s{i}", f"When did event {i} happen?", ("baseline_score", "noise"), tuple(cands))


def test_a_ranker_learns_from_the_text_columns_what_the_servers_features_lack(tmp_path: Path) -> None:
    rng = random.Random(3)
    train, held = split_heldout([when_session(i, rng) for i in range(80)], 0.25, 5)
    cfg = RankerConfig(n_estimators=60, min_child_samples=5)
    with_text, _ = train_ranker(train, None, cfg, tmp_path / "t", "v1")
    without, _ = train_ranker(train, None, replace(cfg, text_features=False), tmp_path / "p", "v2")
    assert ranker_ndcg(with_text, held, None) > 0.95
    assert ranker_ndcg(without, held, None) < baseline_ndcg(held) + 0.2 < 0.8


def test_the_derived_cache_is_bounded_in_bytes_and_keeps_no_text() -> None:
    """An lru_cache keyed by each text and holding its words kept ~200 KB for a text of
    20,000 characters, ~0.8 GB at its 4,096 entries (sidecar probe)."""
    texts = [" ".join(f"w{n}x{i}" for i in range(3_000)) for n in range(10)]  # ~20 KB each
    one = sys.getsizeof(frozenset(range(2_999))) + 32 * 2_999  # a text's bigrams, held
    cache = _DerivedCache(entries=100, max_bytes=2 * one + 1_000)
    for text in texts:
        markers, bigrams = cache.get(text)
        assert len(bigrams) == 2_999 and markers == memory_markers(text)
    assert len(cache) == 2  # older ones went
    assert all(isinstance(key, bytes) and len(key) == 16 for key in cache._items)  # no text held
    # One too large for the whole budget is derived, not kept.
    assert cache.get(" ".join(f"z{i}" for i in range(9_000)))[1] and len(cache) == 0
    # Short texts are kept by the entry bound, and answered the same from the cache.
    small = _DerivedCache(entries=3, max_bytes=1 << 20)
    for n in range(5):
        small.get(f"Caroline moved to Paris in {2000 + n}")
    assert len(small) == 3
    assert small.get("Caroline moved to Paris in 2004") == small.get("Caroline moved to Paris in 2004")
