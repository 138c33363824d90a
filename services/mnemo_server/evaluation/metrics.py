"""Retrieval metrics with exactly the definitions of shared/eval/locomo/score.py:
binary relevance; Recall@k = |gold ∩ top-k| / |gold|; MRR@10; NDCG@10 with IDCG over
min(|gold|, 10) hits; duplicate ids collapsed to their first occurrence; macro averages
overall and per category ("<category_name> (<category>)")."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

CUTOFF = 10
KS = (1, 5, 10)
METRIC_NAMES = [*(f"Recall@{k}" for k in KS), "MRR@10", "NDCG@10"]


@dataclass(frozen=True)
class Judged:
    query_id: str
    category: str
    gold: frozenset[str]


def dedupe(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def score_one(gold: frozenset[str], ranked: Sequence[str]) -> dict[str, float]:
    m = {f"Recall@{k}": len(gold.intersection(ranked[:k])) / len(gold) for k in KS}
    rr = 0.0
    for i, mid in enumerate(ranked[:CUTOFF], 1):
        if mid in gold:
            rr = 1.0 / i
            break
    m["MRR@10"] = rr
    dcg = sum(1.0 / math.log2(i + 1) for i, mid in enumerate(ranked[:CUTOFF], 1) if mid in gold)
    idcg = sum(1.0 / math.log2(i + 1) for i in range(1, min(len(gold), CUTOFF) + 1))
    m["NDCG@10"] = dcg / idcg
    return m


def category_label(q: Mapping[str, object]) -> str:
    if "category_name" in q:
        return f"{q.get('category_name')} ({q.get('category')})"
    return str(q.get("category", "all"))


def evaluate(queries: Sequence[Judged], run: Mapping[str, Sequence[str]]) -> dict[str, dict[str, float]]:
    """{"overall" | category: {"n": count, metric: mean}} rounded like score.py (4 places)."""
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, int] = defaultdict(int)
    for q in queries:
        m = score_one(q.gold, dedupe(run.get(q.query_id, [])))
        for group in ("overall", q.category):
            counts[group] += 1
            for name in METRIC_NAMES:
                sums[group][name] += m[name]
    groups = ["overall", *sorted(g for g in counts if g != "overall")]
    return {
        g: {"n": counts[g], **{n: round(sums[g][n] / counts[g], 4) for n in METRIC_NAMES}} for g in groups
    }
