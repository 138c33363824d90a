"""session_candidates: a session's candidates packed into one value come back as they went
in (float32 for scores and features), and a value that is not such a packing is refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mnemo_server.store import session_candidates
from mnemo_server.store.session_candidates import SessionMemoryRow


def _row(i: int, features: list[float]) -> SessionMemoryRow:
    return SessionMemoryRow(
        memory_id=f"mém-{i}-{'x' * i}",
        candidate_ord=i,
        injected_rank=i % 3,
        origin=("recall", "recent+recall", "pinned")[i % 3],
        baseline_score=0.1 * i,
        baseline_rank=i + 1,
        predictor_score=-0.5 * i,
        predictor_rank=60 - i,
        final_score=1.0 / (i + 1),
        tokens=17 * i,
        features=features,
    )


def _f32(x: float) -> float:
    return float(np.float32(x))


def test_candidates_come_back_as_they_went_in() -> None:
    rows = [_row(i, [0.25 * i, -3.0, 1e-3 * i, float(i)]) for i in range(60)]
    back = session_candidates.unpack(session_candidates.pack(rows))
    assert [b.memory_id for b in back] == [r.memory_id for r in rows]
    assert [b.origin for b in back] == [r.origin for r in rows]
    for b, r in zip(back, rows, strict=True):
        assert (b.candidate_ord, b.injected_rank, b.baseline_rank, b.predictor_rank, b.tokens) == (
            r.candidate_ord,
            r.injected_rank,
            r.baseline_rank,
            r.predictor_rank,
            r.tokens,
        )
        assert (b.baseline_score, b.predictor_score, b.final_score) == tuple(
            _f32(v) for v in (r.baseline_score, r.predictor_score, r.final_score)
        )
        assert b.features == [_f32(v) for v in r.features]
        assert b.relevance is None and b.relevance_source == ""


def test_no_candidates_no_features_and_missing_features_pack_too() -> None:
    assert session_candidates.unpack(session_candidates.pack([])) == []
    assert session_candidates.unpack(None) == []
    bare = session_candidates.unpack(session_candidates.pack([_row(1, []), _row(2, [])]))
    assert [b.features for b in bare] == [[], []]
    (nan,) = session_candidates.unpack(session_candidates.pack([_row(0, [math.nan, 1.0])]))
    assert math.isnan(nan.features[0]) and nan.features[1] == 1.0  # NaN marks a missing feature


def test_candidates_of_one_session_share_their_features() -> None:
    with pytest.raises(ValueError, match="same features"):
        session_candidates.pack([_row(0, [1.0]), _row(1, [1.0, 2.0])])


@pytest.mark.parametrize("cut", [0, 3, 12, 40, -1])
def test_a_value_that_is_not_a_whole_packing_is_refused(cut: int) -> None:
    packed = session_candidates.pack([_row(i, [1.0, 2.0]) for i in range(5)])
    with pytest.raises(ValueError):
        session_candidates.unpack(packed[:cut])
    with pytest.raises(ValueError, match="trailing"):
        session_candidates.unpack(packed + b"\0")
    with pytest.raises(ValueError, match="magic"):
        session_candidates.unpack(b"JSON" + packed[4:])
