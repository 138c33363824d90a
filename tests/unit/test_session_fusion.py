"""How StartSession fuses the model's order with the baseline's by the health weight."""

from __future__ import annotations

import pytest

from mnemo_server.errors import FailedPrecondition
from mnemo_server.retrieval.scoring import reciprocal_ranks
from mnemo_server.sessions.service import ScoreFusion


def order(scores: list[float]) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: -scores[i])


def fuse(predictor: list[float], baseline: list[float], weight: float, rank_k: float) -> list[float]:
    return ScoreFusion(rank_k).scores(predictor, baseline, weight)


def test_reciprocal_ranks_rank_the_best_first_and_ties_by_position() -> None:
    assert reciprocal_ranks([0.2, 0.9, 0.5], 10) == pytest.approx([1 / 13, 1 / 11, 1 / 12])
    assert reciprocal_ranks([1.0, 1.0], 1) == [1 / 2, 1 / 3]
    assert reciprocal_ranks([], 10) == []


# The model is sure of its first pick (an outlying score) and orders the rest one way; the
# baseline orders them the other way.
MODEL = [10.0, 0.2, 0.1, 0.0]
BASELINE = [0.1, 0.7, 0.8, 0.9]


def test_by_rank_a_weight_above_half_keeps_the_models_whole_order() -> None:
    assert order(fuse(MODEL, BASELINE, 0.7, 10)) == [0, 1, 2, 3]
    assert order(fuse(MODEL, BASELINE, 1.0, 10)) == [0, 1, 2, 3]
    assert order(fuse(MODEL, BASELINE, 0.0, 10)) == [3, 2, 1, 0]


def test_by_min_max_scores_an_outlier_squeezes_the_models_order_of_the_rest() -> None:
    # Scaled, the model's 0.2 / 0.1 / 0.0 are 0.02 / 0.01 / 0: the baseline decides them.
    assert order(fuse(MODEL, BASELINE, 0.7, 0)) == [0, 3, 2, 1]
    assert order(fuse(MODEL, BASELINE, 1.0, 0)) == [0, 1, 2, 3]


def test_a_negative_k_is_refused_at_start_up() -> None:
    with pytest.raises(FailedPrecondition) as err:
        ScoreFusion(-1)
    assert err.value.reason == "BAD_CONFIG" and "ranking.fusion_rank_k" in str(err.value)
