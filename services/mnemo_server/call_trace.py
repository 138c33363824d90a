"""Where one call's time went, for the slow-call log.

A call that takes seconds under load (a Recall stuck in a native search, a wait in the
compute gate) is otherwise visible only as a client's DEADLINE_EXCEEDED: nothing on the
server says which part stalled. The interceptor opens a trace per call; the domain marks the
end of each stage with `mark(name)` (a no-op outside a traced call, so domains stay plain and
their tests need no gRPC); a call slower than `server.slow_call_ms` is logged with its stages.
A mark costs a clock read and a list append, cheap enough to stay on for every call.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

# Past this many stages the log line names each stage once, with its count, total and
# longest: a purge of 600 memories in batches of one logged 1,800 stages on one line, and
# a purge of millions, or a long import, would log a line that grows with the call.
_LISTED_STAGES = 24


@dataclass
class CallTrace:
    started: float = field(default_factory=time.perf_counter)
    marks: list[tuple[str, float]] = field(default_factory=list)
    # "ok", or the error's reason (a domain error) or class name (anything else).
    outcome: str = "ok"

    def mark(self, stage: str) -> None:
        self.marks.append((stage, time.perf_counter()))

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000.0

    def stages_ms(self) -> list[tuple[str, float]]:
        """Each stage's length: from the mark before it (or the start) to its own mark.
        A stage marked twice (a loop) appears twice, in order."""
        out: list[tuple[str, float]] = []
        last = self.started
        for stage, at in self.marks:
            out.append((stage, (at - last) * 1000.0))
            last = at
        return out

    def summary(self) -> str:
        """'gate 0.1, embedding 1.3, …, rest 0.4 ms': the stages, then what came after
        the last mark. A long call's: 'transaction 3512.4 (600x up to 139.5), …'."""
        stages = self.stages_ms()
        if len(stages) <= _LISTED_STAGES:
            parts = [f"{stage} {ms:.1f}" for stage, ms in stages]
        else:
            grouped: dict[str, list[float]] = {}  # in the order stages first ended
            for stage, ms in stages:
                grouped.setdefault(stage, []).append(ms)
            parts = [
                f"{stage} {sum(times):.1f} ({len(times)}x up to {max(times):.1f})"
                for stage, times in grouped.items()
            ]
        last = self.marks[-1][1] if self.marks else self.started
        parts.append(f"rest {(time.perf_counter() - last) * 1000.0:.1f}")
        return ", ".join(parts) + " ms"


_TRACE: contextvars.ContextVar[CallTrace | None] = contextvars.ContextVar("mnemo_call_trace", default=None)


def mark(stage: str) -> None:
    """End the current call's stage `stage` (nothing when no call is traced)."""
    trace = _TRACE.get()
    if trace is not None:
        trace.mark(stage)


@contextmanager
def traced() -> Iterator[CallTrace]:
    trace = CallTrace()
    token = _TRACE.set(trace)
    try:
        yield trace
    finally:
        _TRACE.reset(token)
