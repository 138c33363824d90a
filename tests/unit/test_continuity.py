"""Continuity from a transcript: evidence that a memory was used, not that it was recalled."""

from __future__ import annotations

import pytest

from mnemo_server.retrieval.query_analysis import content_words
from mnemo_server.sessions.continuity import overlap_relevance

CONTEXT = "how do releases work here?"
QUOTED = "Release 4.2 was rolled back because of a slow migration"
NOT_QUOTED = "Always tag releases with the ticket number"


def test_words_shared_with_the_opening_context_are_no_evidence_of_use() -> None:
    """A transcript holds the question, and every recalled memory shares its words: the
    memory it did not quote scored 0.4 for "releases" alone."""
    transcript = content_words(f"{CONTEXT} We looked at this: {QUOTED}.")
    asked = frozenset(content_words(CONTEXT))
    assert overlap_relevance(NOT_QUOTED, transcript) == pytest.approx(0.4)  # without the context
    assert overlap_relevance(NOT_QUOTED, transcript, asked) == 0.0
    assert overlap_relevance(QUOTED, transcript, asked) == 1.0
    # Half of its words beyond the question's in the transcript: fully used, as before.
    assert overlap_relevance(NOT_QUOTED, content_words("we always tag them"), asked) == pytest.approx(1.0)
    assert overlap_relevance("releases", transcript, asked) == 0.0  # nothing beyond the question
