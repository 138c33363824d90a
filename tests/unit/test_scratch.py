"""Arrays kept for reuse: the same array comes back when large enough, at most `kept` stay."""

from __future__ import annotations

import numpy as np

from mnemo_server.index.scratch import ScratchArrays


def test_a_kept_array_large_enough_is_reused_and_others_are_new() -> None:
    pool = ScratchArrays(np.float32, kept=2)
    first = pool.take(100, 8)
    assert first.shape == (100, 8) and first.dtype == np.float32 and not first.any()
    first[:] = 5.0
    pool.give_back(first)
    again = pool.take(50, 8)
    assert again is first  # contents as left: callers keep what they need
    assert again[0, 0] == 5.0
    assert pool.take(50, 8) is not first  # taken: a new one meanwhile
    pool.give_back(again)
    assert pool.take(50, 4) is not first  # another shape: not this one, and it is dropped
    assert pool.held_bytes() == 0
    pool.give_back(first)
    bigger = pool.take(200, 8)
    assert bigger is not first and bigger.shape == (200, 8)  # too small: dropped
    assert pool.held_bytes() == 0


def test_no_more_than_kept_arrays_stay() -> None:
    pool = ScratchArrays(np.float64, kept=2)
    arrays = [pool.take(1000) for _ in range(3)]
    for a in arrays:
        pool.give_back(a)
    assert pool.held_bytes() == 2 * 1000 * 8
    taken = {id(pool.take(10)) for _ in range(3)}
    assert len(taken & {id(a) for a in arrays}) == 2
