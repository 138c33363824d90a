"""The per-call trace behind the slow-call log: stages in order, nothing outside a call."""

from __future__ import annotations

import time

from mnemo_server.call_trace import CallTrace, mark, traced


def test_mark_outside_a_traced_call_records_nothing() -> None:
    mark("stage")  # no trace open: must not raise, must not leak into the next trace
    with traced() as trace:
        pass
    assert trace.marks == []


def test_stages_are_the_gaps_between_marks_in_order() -> None:
    with traced() as trace:
        time.sleep(0.02)
        mark("first")
        mark("second")
        time.sleep(0.01)
        mark("first")
    stages = trace.stages_ms()
    assert [name for name, _ in stages] == ["first", "second", "first"]
    assert stages[0][1] >= 19.0
    assert stages[1][1] < stages[0][1]
    assert stages[2][1] >= 9.0
    assert abs(sum(ms for _, ms in stages) - (trace.marks[-1][1] - trace.started) * 1000.0) < 1e-6


def test_summary_names_each_stage_and_what_came_after_the_last_mark() -> None:
    trace = CallTrace()
    trace.mark("gate")
    time.sleep(0.01)
    text = trace.summary()
    assert text.startswith("gate ")
    rest = float(text.split("rest ")[1].removesuffix(" ms"))
    assert rest >= 9.0
    assert CallTrace().summary().startswith("rest ")


def test_a_long_calls_summary_gives_each_stage_once_with_its_count_total_and_longest() -> None:
    """A purge of 600 memories in batches of one logged its 1,800 stages on one line."""
    trace = CallTrace(started=0.0)
    at = 0.0
    for i in range(600):
        for stage, ms in (
            ("before_transaction", 0.1),
            ("write_lock_wait", 0.0),
            ("transaction", 5.0 + i % 7),
        ):
            at += ms / 1000.0
            trace.marks.append((stage, at))
    text = trace.summary()
    parts = text.split(", ")
    assert [p.split(" ")[0] for p in parts] == [
        "before_transaction",
        "write_lock_wait",
        "transaction",
        "rest",
    ]
    assert parts[2] == f"transaction {sum(5.0 + i % 7 for i in range(600)):.1f} (600x up to 11.0)"
    assert parts[0] == "before_transaction 60.0 (600x up to 0.1)"
    assert len(text) < 200


def test_nested_traces_restore_the_outer_one() -> None:
    with traced() as outer:
        with traced() as inner:
            mark("inner")
        mark("outer")
    assert [n for n, _ in inner.marks] == ["inner"]
    assert [n for n, _ in outer.marks] == ["outer"]
