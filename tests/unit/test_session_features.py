"""StartSession's per-candidate features: names and values line up, and the query and
neighbour features read the right texts."""

from __future__ import annotations

import dataclasses
import random
import re

from mnemo_server.retrieval.query_analysis import STOP_WORDS, TermMatcher, content_terms
from mnemo_server.sessions.features import (
    _FOLD_TO_ASCII,
    BASE_FEATURES,
    DECISION_PATTERN,
    Candidate,
    compute_features,
    records_decision,
)
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


def test_term_matcher_finds_what_intersecting_content_terms_finds() -> None:
    """The features' query overlap scans each text for the query's terms instead of
    tokenizing it; over random texts it must find exactly what the intersection finds."""
    rng = random.Random(11)
    # Function words, stems shared by several words, words inside words, digits, and
    # letters whose lower case is not ASCII or is two characters.
    vocabulary = [
        *sorted(STOP_WORDS),
        *("painting", "painted", "paint", "pain", "repainted", "pa", "p", "Painting", "PAINTED"),
        *("abc", "abcd", "abcde", "abcdef", "xabcd", "2023", "12023", "x9"),
        *("theirs", "their", "rea", "really"),
        *("caf\u00e9", "na\u00efve", "stra\u00dfe", "\u0130stanbul", "dec\u0131ded", "\u212aelvin"),
    ]
    seps = [" ", "  ", ", ", ".", "-", "'", "?", "\n", "/", "_", "\u00e9"]

    def text() -> str:
        return "".join(rng.choice(vocabulary) + rng.choice(seps) for _ in range(rng.randint(0, 40)))

    checked = 0
    for _ in range(400):
        matcher = TermMatcher(content_terms(text()))
        for _ in range(10):
            t = text()
            assert matcher.found(t) == matcher.terms & content_terms(t), t
            checked += bool(matcher.terms & content_terms(t))
    assert checked > 1000  # most texts shared a term with their query: the case that matters
    # A long opening context: more terms than a scan is worth, the intersection answers.
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 8))) for _ in range(400)]
    long_query = TermMatcher(content_terms(" ".join(words)))
    assert len(long_query.terms) > 100
    for _ in range(50):
        t = " ".join(rng.sample(words, 30))
        assert long_query.found(t) == long_query.terms & content_terms(t) != frozenset()
    assert TermMatcher(frozenset()).found("painting and painted") == frozenset()


def test_records_decision_is_the_pattern_searched_case_insensitively() -> None:
    """records_decision lower-cases the text instead of searching with re.IGNORECASE; over
    every code point, what it makes of a character matches as re.IGNORECASE matches it."""
    reference = re.compile(DECISION_PATTERN, re.IGNORECASE)
    word = re.compile(r"\w")
    letter = re.compile(r"(?i)[a-z]")
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        c = chr(code)
        folded = c.translate(_FOLD_TO_ASCII).lower()
        assert len(folded) == 1, hex(code)  # no match shifts
        assert bool(word.match(folded)) == bool(word.match(c)), hex(code)  # same \b
        if letter.fullmatch(c) or folded.isascii():
            # what IGNORECASE takes for an ASCII character becomes it, and nothing else does
            assert bool(re.fullmatch(f"(?i){re.escape(folded)}", c)) == folded.isascii(), hex(code)
    rng = random.Random(3)
    phrases = ["decided", "Decision", "CHOSE", "switched to", "went  with", "prefers tea over", "adopted"]
    odd = ["\u0130", "\u0131", "\u017f", "\u212a", "\u00e9", "_", "\n", "x", " "]
    for _ in range(3000):
        p = rng.choice(phrases)
        p = "".join(ch.upper() if rng.random() < 0.3 else ch for ch in p)
        i = rng.randrange(len(p) + 1)
        if rng.random() < 0.5:
            p = p[:i] + rng.choice(odd) + p[i:]
        text = rng.choice(["", "We ", "x", "\u00e9"]) + p + rng.choice(["", ".", "s", " then"])
        text = text.replace("i", "\u0131", 1) if rng.random() < 0.1 else text
        assert records_decision(text) == (reference.search(text) is not None), repr(text)
