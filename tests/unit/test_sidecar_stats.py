"""GetModelStatus's per-RPC figures: a call whose caller's deadline passed is counted in
deadline_exceeded and never among the latencies of answered calls, however it ended."""

from __future__ import annotations

import pytest

from mnemo_server.errors import Cancelled, DeadlineExceeded, ResourceExhausted
from mnemo_sidecar.api.stats import LatencyStats
from mnemo_sidecar.deadlines import Deadline


def test_a_check_after_the_deadline_says_so_though_the_caller_has_gone_too() -> None:
    # grpc no longer calls a context active once its deadline passed.
    with pytest.raises(DeadlineExceeded):
        Deadline(-1.0, alive=lambda: False).check("scoring")
    with pytest.raises(Cancelled):
        Deadline(30.0, alive=lambda: False).check("scoring")


def test_calls_past_their_callers_deadline_are_deadline_exceeded_however_they_ended() -> None:
    stats = LatencyStats()
    passed = Deadline(-1.0, alive=lambda: False)  # the deadline passed and the caller left

    with stats.track("Score", passed):
        pass  # an answer nobody waits for any more
    with pytest.raises(Cancelled), stats.track("Score", passed):
        raise Cancelled("found the caller gone")
    with pytest.raises(ValueError), stats.track("Score", passed):
        raise ValueError("an error after the deadline")
    with pytest.raises(DeadlineExceeded), stats.track("Score"):
        raise DeadlineExceeded("the deadline passed during ranking")
    with pytest.raises(ResourceExhausted), stats.track("Score", passed):
        raise ResourceExhausted("shed")
    # The caller left before its deadline: neither a miss nor an answer's time.
    with pytest.raises(Cancelled), stats.track("Score", Deadline(30.0, alive=lambda: False)):
        raise Cancelled("the caller cancelled")
    with pytest.raises(Cancelled), stats.track("Score"):
        raise Cancelled("the caller cancelled")
    with stats.track("Score", Deadline(30.0, alive=lambda: True)):
        pass  # answered in time

    s = stats.snapshot()["Score"]
    assert (s.calls, s.deadline_exceeded, s.shed, len(s.latencies_ms)) == (8, 4, 1, 1)
