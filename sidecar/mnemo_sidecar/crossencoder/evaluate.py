"""Ranking metrics on held-out rerank rows: where does the positive land among
positive + negatives? MRR@10 and NDCG@10 per source, over all rows (micro) and as the mean
of the sources (macro, so the big templated source does not decide the verdict alone).

Any model is evaluated through a ``PairScorer`` — a function from (query, passage) pairs to
scores — so the fine-tuned cross-encoder (torch or ONNX), another reranker, or a bi-encoder
baseline are compared on exactly the same rows."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from mnemo_sidecar.crossencoder.data import RerankRow

Scores = npt.NDArray[np.float32]
PairScorer = Callable[[Sequence[tuple[str, str]]], Scores]

CUTOFF = 10


@dataclass(frozen=True)
class RankingMetrics:
    mrr_at_10: float
    ndcg_at_10: float
    accuracy_at_1: float
    queries: int


@dataclass(frozen=True)
class EvaluationReport:
    overall: RankingMetrics  # mean over rows
    macro: RankingMetrics  # mean over sources
    per_source: dict[str, RankingMetrics]

    def to_dict(self) -> dict[str, Any]:
        return {
            "overall": asdict(self.overall),
            "macro": asdict(self.macro),
            "per_source": {s: asdict(m) for s, m in self.per_source.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvaluationReport:
        return cls(
            overall=RankingMetrics(**data["overall"]),
            macro=RankingMetrics(**data["macro"]),
            per_source={s: RankingMetrics(**m) for s, m in data["per_source"].items()},
        )


def rank_of_positive(positive: float, negatives: Sequence[float] | npt.NDArray[np.float32]) -> int:
    """1-based rank of the positive. Ties count against it: a model that scores everything
    alike (an untrained head, a collapsed model) must not look good."""
    return 1 + int(np.count_nonzero(np.asarray(negatives) >= positive))


def _metrics(ranks: Sequence[int]) -> RankingMetrics:
    if not ranks:
        return RankingMetrics(0.0, 0.0, 0.0, 0)
    n = len(ranks)
    mrr = sum(1.0 / r for r in ranks if r <= CUTOFF) / n
    # One relevant item: the ideal DCG is 1, so NDCG@10 = 1 / log2(rank + 1) within the cutoff.
    ndcg = sum(1.0 / math.log2(r + 1) for r in ranks if r <= CUTOFF) / n
    acc = sum(1 for r in ranks if r == 1) / n
    return RankingMetrics(round(mrr, 4), round(ndcg, 4), round(acc, 4), n)


def _macro(per_source: dict[str, RankingMetrics]) -> RankingMetrics:
    if not per_source:
        return RankingMetrics(0.0, 0.0, 0.0, 0)
    ms = list(per_source.values())
    k = len(ms)
    return RankingMetrics(
        round(sum(m.mrr_at_10 for m in ms) / k, 4),
        round(sum(m.ndcg_at_10 for m in ms) / k, 4),
        round(sum(m.accuracy_at_1 for m in ms) / k, 4),
        sum(m.queries for m in ms),
    )


def evaluate(rows: Sequence[RerankRow], scorer: PairScorer) -> EvaluationReport:
    """Score every row's positive and negatives in one scorer call (so the scorer can batch
    across rows) and rank the positive. Rows without negatives carry no signal and are skipped."""
    usable = [r for r in rows if r.negatives]
    pairs: list[tuple[str, str]] = []
    for r in usable:
        pairs.append((r.query, r.positive))
        pairs.extend((r.query, n) for n in r.negatives)
    scores = np.asarray(scorer(pairs), dtype=np.float32) if pairs else np.zeros(0, dtype=np.float32)
    if scores.shape != (len(pairs),):
        raise ValueError(f"the scorer returned {scores.shape} scores for {len(pairs)} pairs")
    ranks_by_source: dict[str, list[int]] = defaultdict(list)
    at = 0
    for r in usable:
        block = scores[at : at + 1 + len(r.negatives)]
        at += len(block)
        ranks_by_source[r.source].append(rank_of_positive(float(block[0]), block[1:]))
    per_source = {s: _metrics(ranks) for s, ranks in sorted(ranks_by_source.items())}
    every = [rank for ranks in ranks_by_source.values() for rank in ranks]
    return EvaluationReport(overall=_metrics(every), macro=_macro(per_source), per_source=per_source)


def compare(before: EvaluationReport, after: EvaluationReport) -> dict[str, dict[str, float]]:
    """after − before for MRR@10 and NDCG@10, per source plus "overall" and "macro"."""
    names = {"overall": (before.overall, after.overall), "macro": (before.macro, after.macro)}
    for source in sorted(set(before.per_source) & set(after.per_source)):
        names[source] = (before.per_source[source], after.per_source[source])
    return {
        name: {
            "mrr_at_10": round(b_after.mrr_at_10 - b_before.mrr_at_10, 4),
            "ndcg_at_10": round(b_after.ndcg_at_10 - b_before.ndcg_at_10, 4),
        }
        for name, (b_before, b_after) in names.items()
    }


def bi_encoder_scorer(model_dir: Path, *, batch_size: int = 64) -> PairScorer:
    """Cosine similarity of a sentence-transformers model's embeddings — the baseline a
    cross-encoder must beat (an untrained cross-encoder head is no baseline at all).
    Each distinct text is embedded once."""
    from sentence_transformers import SentenceTransformer

    from mnemo_sidecar.crossencoder.finetune import quiet_transformers

    with quiet_transformers():
        model = SentenceTransformer(str(model_dir), device="cpu")

    def score(pairs: Sequence[tuple[str, str]]) -> Scores:
        texts = sorted({t for pair in pairs for t in pair})
        vectors = model.encode(
            texts,
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        index = {t: i for i, t in enumerate(texts)}
        q = vectors[[index[a] for a, _ in pairs]]
        p = vectors[[index[b] for _, b in pairs]]
        out: Scores = np.einsum("ij,ij->i", q, p).astype(np.float32)
        return out

    return score
