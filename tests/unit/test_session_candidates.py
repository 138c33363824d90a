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


# Two candidates as the first layout ("MSC1", uncompressed, features candidate by candidate)
# packed them, kept as bytes: values written before compression must still read.
MSC1_TWO_CANDIDATES = bytes.fromhex(
    "4d5343310200000003000000000000000100000001000000000000000100000002000000020000000100000007"
    "000000080000000000003f0000803f00000080000080be0000c03f0000c03f000000000000003f000000c00000"
    "803f0000003f000000c003000000030000006d2d306d2d310600000006000000726563616c6c70696e6e6564"
)


def test_values_of_the_first_layout_still_read() -> None:
    first, second = session_candidates.unpack(MSC1_TWO_CANDIDATES)
    assert (first.memory_id, first.origin, first.injected_rank, first.tokens) == ("m-0", "recall", 1, 7)
    assert (second.memory_id, second.origin, second.predictor_rank, second.baseline_rank) == (
        "m-1",
        "pinned",
        1,
        2,
    )
    assert (first.baseline_score, second.predictor_score, second.final_score) == (0.5, -0.25, 1.5)
    assert first.features == [0.0, 0.5, -2.0] and second.features == [1.0, 0.5, -2.0]
    # And the same candidates packed now come back the same.
    assert session_candidates.unpack(session_candidates.pack([first, second])) == [first, second]


def test_packing_compresses_what_sessions_repeat() -> None:
    # Like StartSession's: one-hot types, flags and zeros beside a few real-valued scores.
    rows = [_row(i, [float(i % 2), 0.0, 1.0, 0.0, 0.0, 0.1 * i, *([0.0] * 30)]) for i in range(60)]
    raw = sum(4 * (5 + 3 + len(r.features)) + 8 + len(r.memory_id.encode()) + len(r.origin) for r in rows)
    packed = session_candidates.pack(rows)
    assert packed[:4] == b"MSC2" and len(packed) < raw / 3
    assert [b.features for b in session_candidates.unpack(packed)] == [
        [_f32(v) for v in r.features] for r in rows
    ]


def test_a_damaged_compressed_value_is_refused() -> None:
    packed = session_candidates.pack([_row(i, [1.0, 2.0]) for i in range(5)])
    for at in (14, len(packed) - 2):  # the deflate data, zlib's checksum at the end
        damaged = bytearray(packed)
        damaged[at] ^= 0xFF
        with pytest.raises(ValueError, match="do not decompress"):
            session_candidates.unpack(bytes(damaged))
