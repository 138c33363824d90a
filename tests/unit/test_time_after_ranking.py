"""The time StartSession keeps back from the sidecar's budget for its own later work."""

from __future__ import annotations

import pytest

from mnemo_server.sessions.time_after_ranking import TimeAfterRanking


def test_the_prior_until_enough_calls_then_the_recent_95th_percentile() -> None:
    t = TimeAfterRanking(samples=100, prior_s=0.010, min_samples=16)
    for _ in range(15):
        t.add(0.001)
    assert t.high_s() == 0.010  # too few measured: the prior stands
    for _ in range(9):
        t.add(0.001)
    assert t.high_s() == pytest.approx(0.001)
    # A slow spell: once past 5 % of the window it sets the figure.
    for _ in range(8):
        t.add(0.050)
    assert t.high_s() == pytest.approx(0.050)
    # The window forgets it as quick calls come again.
    for _ in range(96):
        t.add(0.002)
    assert t.high_s() == pytest.approx(0.002)
