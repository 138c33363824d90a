"""StartSession's per-candidate features: names and values line up, and the query and
neighbour features read the right texts."""

from __future__ import annotations

import dataclasses

from mnemo_server.retrieval.query_analysis import content_terms
from mnemo_server.sessions.features import BASE_FEATURES, Candidate, compute_features
from tests.unit.stored import stored_memory

NOW = 10**18


def candidate(i: int, content: str, baseline: float, prev_id: str = "", next_id: str = "") -> Candidate:
    memory = dataclasses.replace(stored_memory(i, NOW), content=content)
    return Candidate(memory, {"recall"}, baseline_score=baseline, prev_id=prev_id, next_id=next_id)


def named(c: Candidate, names: list[str]) -> dict[str, float]:
    assert len(c.features) == len(names)
    return dict(zip(names, c.features, strict=True))


def test_content_terms_drop_function_words_and_stem() -> None:
    assert content_terms("When did she paint the sunrise? Painting sunrises!") == {"paint", "sunri"}
    assert content_terms("") == frozenset()


def test_names_are_unique_and_every_row_matches_them() -> None:
    pool = [candidate(1, "a", 1.0), candidate(2, "b", 0.5)]
    names = compute_features(pool, NOW, "anything")
    assert len(set(names)) == len(names) and names[: len(BASE_FEATURES)] == list(BASE_FEATURES)
    for c in pool:
        named(c, names)


def test_query_and_neighbour_features() -> None:
    question = candidate(1, "Mel: Which city did you visit in spring?", 0.8, next_id="m2")
    answer = candidate(2, "Ann: We visited Lisbon, the city was lovely", 0.4, prev_id="m1", next_id="m9")
    # m9 is outside the pool: its text comes from the index, its baseline is unknown (0).
    lone = candidate(3, "Ann: nothing relevant here", 0.2, prev_id="m8")  # m8: text unknown
    pool = [question, answer, lone]
    names = compute_features(pool, NOW, "Which city did Ann visit?", {"m9": "Mel: Did you like it?"})

    q, a, x = named(question, names), named(answer, names), named(lone, names)
    # Query terms: {"city", "ann", "visit"}; the question holds city + visit, the answer all three.
    assert q["has_question"] == 1.0 and a["has_question"] == 0.0
    assert q["query_overlap"] == 2 / 3
    assert a["query_overlap"] == 2 / 3  # "Ann:" is the speaker prefix, not the text
    assert (q["baseline_rel"], a["baseline_rel"]) == (1.0, 0.5)
    assert (a["prev_has_question"], a["prev_query_overlap"], a["prev_baseline_rel"]) == (1.0, 2 / 3, 1.0)
    assert (a["next_has_question"], a["next_baseline_rel"]) == (1.0, 0.0)
    assert (q["next_has_question"], q["next_baseline_rel"]) == (0.0, 0.5)
    assert (q["prev_has_question"], q["prev_baseline_rel"]) == (0.0, 0.0)
    assert (x["prev_has_question"], x["prev_query_overlap"], x["prev_baseline_rel"]) == (0.0, 0.0, 0.0)
    assert x["query_overlap"] == 0.0


def test_no_query_gives_zero_overlap() -> None:
    pool = [candidate(1, "Which city?", 1.0)]
    names = compute_features(pool, NOW)
    assert named(pool[0], names)["query_overlap"] == 0.0
    assert named(pool[0], names)["has_question"] == 1.0
