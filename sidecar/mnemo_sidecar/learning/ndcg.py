"""NDCG@10 with graded gains from session feedback (negative relevance counts as 0)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def ndcg_at(ranked_ids: Sequence[str], relevance: Mapping[str, float], k: int = 10) -> float | None:
    """None when nothing in the session was relevant (the session says nothing about order)."""
    gains = sorted((max(0.0, r) for r in relevance.values()), reverse=True)
    ideal = sum(g / math.log2(i + 2) for i, g in enumerate(gains[:k]))
    if ideal <= 0:
        return None
    dcg = sum(max(0.0, relevance.get(mid, 0.0)) / math.log2(i + 2) for i, mid in enumerate(ranked_ids[:k]))
    return dcg / ideal


def order_by(scores: Mapping[str, float]) -> list[str]:
    """Ids best first; ties keep insertion order (the caller's order)."""
    return [mid for mid, _ in sorted(scores.items(), key=lambda kv: -kv[1])]
