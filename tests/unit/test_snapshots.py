"""Domain objects kept in idempotency records round-trip through JSON unchanged."""

from __future__ import annotations

import json

from mnemo_server.learning.model import CandidateState, LearningCandidate, LearningKind, Origin
from mnemo_server.memory.model import Scope, ScopeKind, Source
from mnemo_server.store import snapshots


def test_a_candidate_with_nested_types_enums_a_tuple_and_an_unset_time_round_trips() -> None:
    candidate = LearningCandidate(
        id="c1",
        tenant_id="t",
        scope=Scope(ScopeKind.PROJECT, "p"),
        kind=LearningKind.PROCEDURE,
        content="1. pull\n2. release",
        confidence=0.25,
        source=Source(who="agent", run_id="r1"),
        evidence_refs=("run:1", "run:2"),
        origin=Origin.API,
        state=CandidateState.PENDING,
        create_time_ns=1_700_000_000_000_000_001,
    )
    back = snapshots.load(LearningCandidate, json.loads(json.dumps(snapshots.dump(candidate))))
    assert back == candidate
    assert back.review_time_ns is None and isinstance(back.scope.kind, ScopeKind)
