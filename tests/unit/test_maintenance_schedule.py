"""When LanceDB maintenance runs: compaction every few writes, optimize when writes settle or
pile up, and never more often than its share of the time allows. A fake clock, no sleeps."""

from __future__ import annotations

from mnemo_server.config import IndexConfig
from mnemo_server.index.maintenance import RETRY_AFTER_FAILURE_S, MaintenanceSchedule


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


CFG = IndexConfig(
    compact_after_writes=3,
    optimize_quiet_s=1.0,
    optimize_max_lag_rows=100,
    optimize_max_interval_s=60.0,
    optimize_time_share=0.05,
)


def test_compaction_every_few_writes_and_optimize_once_writes_settle() -> None:
    clock = Clock()
    s = MaintenanceSchedule(CFG, clock)
    assert s.take().optimize == [] and s.take().compact == []
    for _ in range(3):
        s.wrote("a", 1)
        clock.now += 0.2
    work = s.take()
    assert (work.compact, work.optimize) == (["a"], [])
    assert s.take().compact == []  # counted again from zero
    clock.now += 1.0
    assert s.take().optimize == ["a"]
    assert s.dirty() == {}


def test_many_rows_waiting_trigger_an_optimize_although_writes_go_on() -> None:
    clock = Clock()
    s = MaintenanceSchedule(CFG, clock)
    s.wrote("t", 99)
    assert s.take().optimize == []
    s.wrote("t", 1)
    assert s.take().optimize == ["t"]


def test_steady_trickle_is_optimized_after_the_longest_wait() -> None:
    clock = Clock()
    s = MaintenanceSchedule(IndexConfig(optimize_quiet_s=1.0, optimize_max_lag_rows=10_000), clock)
    waited = 0.0
    while not s.take().optimize:
        s.wrote("t", 1)
        clock.now += 0.5
        waited += 0.5
    assert waited == IndexConfig().optimize_max_interval_s


def test_an_expensive_optimize_holds_the_next_one_back_in_proportion() -> None:
    clock = Clock()
    s = MaintenanceSchedule(CFG, clock)
    s.wrote("t", 1)
    clock.now += 1.0
    assert s.take().optimize == ["t"]
    s.optimized("t", 2.0)  # took 2 s: at a 5 % share the next waits 38 s
    s.wrote("t", 1)
    clock.now += 5.0
    assert s.take().optimize == []
    assert s.dirty() == {"t": 1}
    clock.now += 33.1
    assert s.take().optimize == ["t"]
    s.optimized("t", 2.0)
    s.wrote("t", 1)
    s.wrote("other", 1)
    clock.now += 1.0
    assert s.take().optimize == ["other"]  # the hold is per tenant
    assert s.take(force=True).optimize == ["t"]  # shutdown does not wait
    s.optimized("t", 2.0)
    s.wrote("t", 99)
    clock.now += 1.0
    assert s.take().optimize == []
    s.wrote("t", 1)  # a backlog of max_lag_rows outweighs the hold (without the extras)
    work = s.take()
    assert work.optimize == ["t"] and work.backlog_only == {"t"}


def test_some_rows_waiting_trigger_an_optimize_when_the_share_allows() -> None:
    clock = Clock()
    s = MaintenanceSchedule(IndexConfig(optimize_lag_rows=50, optimize_time_share=0.5), clock)
    s.wrote("t", 49)
    assert s.take().optimize == []
    s.wrote("t", 1)
    assert s.take().optimize == ["t"]
    s.optimized("t", 3.0)  # at a 50 % share the next waits 3 s
    s.wrote("t", 50)
    clock.now += 2.9
    assert s.take().optimize == []
    clock.now += 0.2
    work = s.take()
    assert work.optimize == ["t"] and not work.backlog_only


def test_a_failed_optimize_hands_its_rows_back_and_is_retried_later() -> None:
    """A tenant taken for an optimize that then failed is not forgotten until its next write
    (a tenant only read would keep its rows outside the indices), nor retried every tick."""
    clock = Clock()
    s = MaintenanceSchedule(CFG, clock)
    s.wrote("a", 150)  # past optimize_max_lag_rows: taken whatever the time share
    s.wrote("b", 5)
    clock.now += 1.0
    work = s.take()
    assert sorted(work.optimize) == ["a", "b"] and work.rows == {"a": 150, "b": 5}
    s.failed("a", work.rows["a"])
    s.optimized("b", 0.01)
    s.wrote("a", 2)  # written again meanwhile: counted with the rows handed back
    assert s.dirty() == {"a": 152}
    clock.now += RETRY_AFTER_FAILURE_S - 1.0
    assert s.take().optimize == []  # backlog or not, it waits for the retry
    assert s.take(force=True).optimize == ["a"]  # unless forced
    s.failed("a", 152)
    clock.now += RETRY_AFTER_FAILURE_S
    assert s.take().optimize == ["a"]
    s.failed("a", 152)  # failed again: held again
    assert s.take().optimize == []
    assert s.take(force=True).optimize == ["a"]
    s.optimized("a", 0.01)  # a success ends the hold
    s.wrote("a", 150)
    assert s.take().optimize == ["a"]
