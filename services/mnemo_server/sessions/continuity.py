"""Continuity scoring at session end: how much each injected memory was used. Explicit
feedback wins; otherwise lexical overlap with the transcript; otherwise unused (0)."""

from __future__ import annotations

from mnemo_server.retrieval.query_analysis import content_words


def overlap_relevance(
    memory_text: str, transcript_tokens: set[str], context_tokens: frozenset[str] | set[str] = frozenset()
) -> float:
    """Share of the memory's content words that appear in the transcript, stretched so that
    half of them present counts as fully used. Words it shares with the session's opening
    context are left out: they are why it was recalled, and a transcript holds the question,
    so they scored every injected memory as partly used (probe: memories the transcript did
    not quote averaged 0.39, the question alone giving 0.24)."""
    words = content_words(memory_text) - context_tokens
    if not words:
        return 0.0
    share = len(words & transcript_tokens) / len(words)
    return min(1.0, 2.0 * share)
