"""LearningService over gRPC against a real server: the candidate → publish → supersede →
revoke flow, every validation error, idempotent retries, paging and tenant isolation."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import grpc
import pytest

from mnemo.v1 import common_pb2
from mnemo.v1 import learning_service_pb2 as pb
from mnemo.v1 import learning_service_pb2_grpc as pb_grpc
from mnemo_server.store import learning_repo
from tests.conftest import ADMIN_KEY, LiveServer, TenantClient, bearer, error_info

WORKSPACE = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_WORKSPACE)


class Learnings:
    """The LearningService stub bound to one tenant's key."""

    def __init__(self, client: TenantClient):
        self.stub = pb_grpc.LearningServiceStub(client.channel)
        self.md = client.md

    def __getattr__(self, name: str) -> Callable[[Any], Any]:
        method = getattr(self.stub, name)
        return lambda request: method(request, metadata=self.md, timeout=10)

    def create(
        self, content: str, kind: int = pb.LEARNING_KIND_FACT, request_id: str = "", **fields: Any
    ) -> pb.LearningCandidate:
        candidate = pb.LearningCandidate(content=content, kind=kind, **fields)  # type: ignore[arg-type]
        req = pb.CreateLearningCandidateRequest(candidate=candidate, request_id=request_id)
        return self.CreateLearningCandidate(req).candidate  # type: ignore[no-any-return]

    def publish(self, candidate_id: str, **fields: Any) -> pb.PublishLearningCandidateResponse:
        return self.PublishLearningCandidate(  # type: ignore[no-any-return]
            pb.PublishLearningCandidateRequest(id=candidate_id, **fields)
        )


def fails(call: Callable[[], object], code: grpc.StatusCode) -> tuple[str, list[str]]:
    """Run a call that must fail with `code`; returns (ErrorInfo reason, BadRequest fields)."""
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    return error_info(err.value)


def events(server: LiveServer, tenant: str, subject_id: str) -> list[tuple[str, str]]:
    rows = learning_repo.events_for(server.server.core.db.reader(), tenant, subject_id)
    return [(e.from_state, e.to_state) for e in rows]


def test_candidate_publish_supersede_revoke(server: LiveServer, tenant_a: TenantClient) -> None:
    api = Learnings(tenant_a)
    first = api.create(
        "Deploys happen on Tuesdays.",
        pb.LEARNING_KIND_DECISION,
        source=common_pb2.Source(who="agent-1", run_id="r-9"),
        evidence_refs=["run:r-9"],
    )
    assert first.id
    assert first.state == pb.CANDIDATE_STATE_PENDING
    assert (first.scope.kind, first.scope.id) == (common_pb2.SCOPE_KIND_WORKSPACE, "default")
    assert first.confidence == pytest.approx(1.0)  # 0 on the wire means the default
    assert first.source.who == "agent-1"
    assert list(first.evidence_refs) == ["run:r-9"]
    assert first.HasField("create_time")
    assert not first.HasField("review_time")
    got = api.GetLearningCandidate(pb.GetLearningCandidateRequest(id=first.id)).candidate
    assert got == first

    published = api.publish(first.id, reason="agreed in standup")
    old = published.learning
    assert old.state == pb.LEARNING_STATE_ACTIVE
    assert (old.kind, old.content, old.candidate_id) == (pb.LEARNING_KIND_DECISION, first.content, first.id)
    assert old.scope == first.scope
    assert published.candidate.state == pb.CANDIDATE_STATE_PUBLISHED
    assert published.candidate.learning_id == old.id
    assert published.candidate.review_reason == "agreed in standup"
    assert published.candidate.HasField("review_time")

    second = api.create("Deploys happen on Thursdays.", pb.LEARNING_KIND_DECISION, confidence=0.6)
    new = api.publish(second.id, supersedes_id=old.id).learning
    assert new.supersedes_id == old.id
    assert new.confidence == pytest.approx(0.6)
    old_now = api.GetLearning(pb.GetLearningRequest(id=old.id)).learning
    assert old_now.state == pb.LEARNING_STATE_SUPERSEDED
    assert old_now.superseded_by_id == new.id

    revoked = api.RevokeLearning(pb.RevokeLearningRequest(id=new.id, reason="we deploy daily now")).learning
    assert revoked.state == pb.LEARNING_STATE_REVOKED
    assert revoked.revoke_reason == "we deploy daily now"
    assert api.GetLearning(pb.GetLearningRequest(id=new.id)).learning == revoked
    for lid in (new.id, old.id):  # neither revoked nor superseded learnings can be revoked
        reason, _ = fails(
            partial(api.RevokeLearning, pb.RevokeLearningRequest(id=lid, reason="x")),
            grpc.StatusCode.FAILED_PRECONDITION,
        )
        assert reason == "LEARNING_NOT_ACTIVE"

    # Every state change is in the audit trail.
    assert events(server, "tenant-a", first.id) == [("", "pending"), ("pending", "published")]
    assert events(server, "tenant-a", old.id) == [("", "active"), ("active", "superseded")]
    assert events(server, "tenant-a", new.id) == [("", "active"), ("active", "revoked")]


def test_create_validation(tenant_a: TenantClient) -> None:
    api = Learnings(tenant_a)
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"kind": pb.LEARNING_KIND_UNSPECIFIED}, "candidate.kind", "INVALID_ARGUMENT"),
        ({"kind": 99}, "candidate.kind", "INVALID_ARGUMENT"),
        ({"kind": pb.LEARNING_KIND_RUN_SUMMARY}, "candidate.kind", "RUN_SUMMARY_NOT_ALLOWED"),
        ({"content": ""}, "candidate.content", "INVALID_ARGUMENT"),
        ({"content": "x" * 4_001}, "candidate.content", "INVALID_ARGUMENT"),
        ({"confidence": 1.5}, "candidate.confidence", "INVALID_ARGUMENT"),
        ({"confidence": -0.25}, "candidate.confidence", "INVALID_ARGUMENT"),
        ({"evidence_refs": [f"r{i}" for i in range(21)]}, "candidate.evidence_refs", "INVALID_ARGUMENT"),
        ({"evidence_refs": ["ok", "r" * 257]}, "candidate.evidence_refs[1]", "INVALID_ARGUMENT"),
        ({"scope": common_pb2.Scope(id="p1")}, "candidate.scope.kind", "INVALID_ARGUMENT"),
        (
            {"scope": common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT)},
            "candidate.scope.id",
            "INVALID_ARGUMENT",
        ),
        (
            {"content": "the deploy token is ghp_16C7e42F292c6912E7710c838347Ae178B4a"},
            "candidate.content",
            "SECRET_MATERIAL",
        ),
        (
            {"content": "prod db password=hunter2", "kind": pb.LEARNING_KIND_PREFERENCE},
            "candidate.content",
            "SECRET_MATERIAL",
        ),
    ]
    for overrides, field, reason in cases:
        fields = {"content": "A perfectly fine fact.", "kind": pb.LEARNING_KIND_FACT, **overrides}
        got = fails(partial(api.create, **fields), invalid)
        assert got == (reason, [field]), overrides
    got = fails(lambda: api.create("A perfectly fine fact.", request_id="has space"), invalid)
    assert got[1] == ["request_id"]
    # None of it was stored.
    assert not api.ListLearningCandidates(pb.ListLearningCandidatesRequest()).candidates
    # The same secret is fine in a procedure, which may describe how credentials are wired.
    proc = api.create("export API_KEY=$(vault read -field=key secret/ci)", pb.LEARNING_KIND_PROCEDURE)
    assert proc.state == pb.CANDIDATE_STATE_PENDING


def test_review_errors(tenant_a: TenantClient) -> None:
    api = Learnings(tenant_a)
    invalid, missing = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    precondition = grpc.StatusCode.FAILED_PRECONDITION
    assert fails(lambda: api.publish(""), invalid)[1] == ["id"]
    assert fails(lambda: api.publish("nope"), missing)[0] == "LEARNING_CANDIDATE_NOT_FOUND"
    assert fails(lambda: api.GetLearningCandidate(pb.GetLearningCandidateRequest()), invalid)[1] == ["id"]
    assert (
        fails(lambda: api.GetLearning(pb.GetLearningRequest(id="nope")), missing)[0] == "LEARNING_NOT_FOUND"
    )

    c = api.create("The CI runs on self-hosted runners.")
    assert fails(lambda: api.RejectLearningCandidate(pb.RejectLearningCandidateRequest(id=c.id)), invalid)[
        1
    ] == ["reason"]
    assert fails(lambda: api.publish(c.id, reason="r" * 1_001), invalid)[1] == ["reason"]
    assert fails(lambda: api.publish(c.id, supersedes_id="nope"), missing)[0] == "LEARNING_NOT_FOUND"
    with pytest.raises(grpc.RpcError) as err:  # the message names the field that named it
        api.publish(c.id, supersedes_id="nope")
    assert (err.value.details() or "").startswith("supersedes_id: learning 'nope' not found")
    decision_candidate = api.create("We use trunk-based development.", pb.LEARNING_KIND_DECISION)
    decision = api.publish(decision_candidate.id).learning
    assert (
        fails(lambda: api.publish(c.id, supersedes_id=decision.id), precondition)[0] == "SUPERSEDES_MISMATCH"
    )
    # A failed publish changed nothing.
    assert (
        api.GetLearningCandidate(pb.GetLearningCandidateRequest(id=c.id)).candidate.state
        == pb.CANDIDATE_STATE_PENDING
    )
    assert api.GetLearning(pb.GetLearningRequest(id=decision.id)).learning.state == pb.LEARNING_STATE_ACTIVE

    rejected = api.RejectLearningCandidate(
        pb.RejectLearningCandidateRequest(id=c.id, reason="wrong")
    ).candidate
    assert rejected.state == pb.CANDIDATE_STATE_REJECTED
    assert rejected.review_reason == "wrong"
    assert rejected.learning_id == ""
    assert fails(lambda: api.publish(c.id), precondition)[0] == "CANDIDATE_NOT_PENDING"
    assert (
        fails(
            lambda: api.RejectLearningCandidate(pb.RejectLearningCandidateRequest(id=c.id, reason="x")),
            precondition,
        )[0]
        == "CANDIDATE_NOT_PENDING"
    )

    assert fails(lambda: api.RevokeLearning(pb.RevokeLearningRequest(id=decision.id, reason=" ")), invalid)[
        1
    ] == ["reason"]
    assert fails(
        lambda: api.ListLearningCandidates(pb.ListLearningCandidatesRequest(state=42)),  # type: ignore[arg-type]
        invalid,
    )[1] == ["state"]
    assert fails(lambda: api.ListLearnings(pb.ListLearningsRequest(kind=42)), invalid)[1] == ["kind"]  # type: ignore[arg-type]
    assert fails(lambda: api.ListLearnings(pb.ListLearningsRequest(page_size=1_001)), invalid)[1] == [
        "page_size"
    ]
    assert fails(lambda: api.ListLearnings(pb.ListLearningsRequest(page_token="junk")), invalid)[1] == [
        "page_token"
    ]


def test_idempotent_retries(tenant_a: TenantClient) -> None:
    api = Learnings(tenant_a)
    first = api.create("The on-call rota changes on Mondays.", request_id="create-1")
    again = api.create("The on-call rota changes on Mondays.", request_id="create-1")
    assert again == first
    assert len(api.ListLearningCandidates(pb.ListLearningCandidatesRequest()).candidates) == 1
    reason, fields = fails(
        lambda: api.create("Something else entirely.", request_id="create-1"),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert (reason, fields) == ("REQUEST_ID_REUSED", ["request_id"])

    published = api.publish(first.id, reason="ok", request_id="publish-1")
    retried = api.publish(first.id, reason="ok", request_id="publish-1")
    assert retried == published
    assert len(api.ListLearnings(pb.ListLearningsRequest()).learnings) == 1
    # Without the request_id a second publish is a second review.
    assert (
        fails(lambda: api.publish(first.id, reason="ok"), grpc.StatusCode.FAILED_PRECONDITION)[0]
        == "CANDIDATE_NOT_PENDING"
    )


def test_a_create_retry_sending_back_the_first_answer_is_the_same_request(tenant_a: TenantClient) -> None:
    """The candidate's id, state and times are output only: a retry that carries what the
    first answer filled in gets that answer (probe: REQUEST_ID_REUSED), and nothing more is
    stored."""
    api = Learnings(tenant_a)
    # Scope and confidence given, so that the answer differs only in output-only fields.
    first = api.create(
        "Releases are cut on Tuesdays.",
        request_id="create-2",
        scope=common_pb2.Scope(kind=common_pb2.SCOPE_KIND_WORKSPACE, id="default"),
        confidence=0.5,
    )
    resent = pb.CreateLearningCandidateRequest(candidate=first, request_id="create-2")
    assert api.CreateLearningCandidate(resent).candidate == first
    assert len(api.ListLearningCandidates(pb.ListLearningCandidatesRequest()).candidates) == 1


def test_reject_and_revoke_retries_return_the_first_result(tenant_a: TenantClient) -> None:
    """A review retried after its answer was lost: with its request_id it gets the first
    answer, not CANDIDATE_NOT_PENDING / LEARNING_NOT_ACTIVE, which it could not tell from
    another reviewer's change (probe: the requests had no request_id)."""
    api = Learnings(tenant_a)
    doomed = api.create("The staging cluster is in eu-west-2.")
    reject = pb.RejectLearningCandidateRequest(id=doomed.id, reason="wrong region", request_id="reject-1")
    rejected = api.RejectLearningCandidate(reject).candidate
    assert rejected.state == pb.CANDIDATE_STATE_REJECTED
    assert api.RejectLearningCandidate(reject).candidate == rejected
    other = pb.RejectLearningCandidateRequest(id=doomed.id, reason="another reason", request_id="reject-1")
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert fails(lambda: api.RejectLearningCandidate(other), invalid) == ("REQUEST_ID_REUSED", ["request_id"])
    bad_id = pb.RejectLearningCandidateRequest(id=doomed.id, reason="x", request_id="has space")
    assert fails(lambda: api.RejectLearningCandidate(bad_id), invalid)[1] == ["request_id"]

    learning = api.publish(api.create("Deploys need two approvals.").id).learning
    revoke = pb.RevokeLearningRequest(id=learning.id, reason="policy changed", request_id="revoke-1")
    revoked = api.RevokeLearning(revoke).learning
    assert revoked.state == pb.LEARNING_STATE_REVOKED
    assert api.RevokeLearning(revoke).learning == revoked
    # Without the request_id a second revoke is a second review.
    again = pb.RevokeLearningRequest(id=learning.id, reason="policy changed")
    assert fails(lambda: api.RevokeLearning(again), grpc.StatusCode.FAILED_PRECONDITION)[0] == (
        "LEARNING_NOT_ACTIVE"
    )


def test_lists_page_newest_first_and_filter(tenant_a: TenantClient) -> None:
    api = Learnings(tenant_a)
    made = [api.create(f"Fact number {i}.").id for i in range(7)]
    api.RejectLearningCandidate(pb.RejectLearningCandidateRequest(id=made[0], reason="no"))
    decision = api.publish(api.create("Use squash merges.", pb.LEARNING_KIND_DECISION).id).learning
    facts = [api.publish(cid).learning.id for cid in made[1:3]]

    seen: list[str] = []
    token, pages = "", 0
    while True:
        page = api.ListLearningCandidates(pb.ListLearningCandidatesRequest(page_size=3, page_token=token))
        seen += [c.id for c in page.candidates]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert pages == 3
    assert len(seen) == 8
    assert seen[1:] == made[::-1]  # newest first, no repeats (seen[0] is the decision's candidate)
    pending = api.ListLearningCandidates(pb.ListLearningCandidatesRequest(state=pb.CANDIDATE_STATE_PENDING))
    assert [c.id for c in pending.candidates] == made[:2:-1]
    rejected = api.ListLearningCandidates(pb.ListLearningCandidatesRequest(state=pb.CANDIDATE_STATE_REJECTED))
    assert [c.id for c in rejected.candidates] == [made[0]]

    api.RevokeLearning(pb.RevokeLearningRequest(id=facts[0], reason="stale"))
    everything = api.ListLearnings(pb.ListLearningsRequest())
    assert [lr.id for lr in everything.learnings] == [facts[1], facts[0], decision.id]
    only_facts = api.ListLearnings(pb.ListLearningsRequest(kind=pb.LEARNING_KIND_FACT))
    assert [lr.id for lr in only_facts.learnings] == [facts[1], facts[0]]
    active_facts = api.ListLearnings(
        pb.ListLearningsRequest(kind=pb.LEARNING_KIND_FACT, state=pb.LEARNING_STATE_ACTIVE)
    )
    assert [lr.id for lr in active_facts.learnings] == [facts[1]]
    page1 = api.ListLearnings(pb.ListLearningsRequest(page_size=2))
    page2 = api.ListLearnings(pb.ListLearningsRequest(page_size=2, page_token=page1.next_page_token))
    assert [lr.id for lr in [*page1.learnings, *page2.learnings]] == [facts[1], facts[0], decision.id]
    assert page2.next_page_token == ""
    # A token belongs to the filter it was issued for.
    mismatched = pb.ListLearningsRequest(
        page_size=2, page_token=page1.next_page_token, kind=pb.LEARNING_KIND_FACT
    )
    assert fails(lambda: api.ListLearnings(mismatched), grpc.StatusCode.INVALID_ARGUMENT)[1] == ["page_token"]


def test_a_page_of_large_candidates_fits_a_default_client_and_the_rest_follow(tenant_a: TenantClient) -> None:
    """page_size 1000 over 90 candidates of ~40 KB each (within every limit: 4,000 four-byte
    characters, 20 evidence refs of 256) is 3.6 MB, past what a page may carry (3 MiB, under
    the 4 MiB a default gRPC client takes): a shorter page and a token, and every candidate
    once over the pages."""
    api = Learnings(tenant_a)
    wide = "\U0001f600"
    source = common_pb2.Source(who=wide * 256, why=wide * 256)
    made = {
        api.create(f"{i} " + wide * 3990, evidence_refs=[wide * 256] * 20, source=source).id
        for i in range(90)
    }
    seen: list[str] = []
    token, sizes = "", []
    while True:
        page = api.ListLearningCandidates(pb.ListLearningCandidatesRequest(page_size=1000, page_token=token))
        seen += [c.id for c in page.candidates]
        sizes.append(page.ByteSize())
        token = page.next_page_token
        if not token:
            break
    assert len(sizes) >= 2 and max(sizes) < 4 << 20
    assert len(seen) == len(set(seen)) == 90 and set(seen) == made


def test_tenants_cannot_see_or_change_each_other(tenant_a: TenantClient, tenant_b: TenantClient) -> None:
    a, b = Learnings(tenant_a), Learnings(tenant_b)
    pending = a.create("Tenant A's pending fact.")
    learning = a.publish(a.create("Tenant A's published fact.").id).learning
    missing = grpc.StatusCode.NOT_FOUND
    attempts: list[tuple[Callable[[], object], str]] = [
        (
            lambda: b.GetLearningCandidate(pb.GetLearningCandidateRequest(id=pending.id)),
            "LEARNING_CANDIDATE_NOT_FOUND",
        ),
        (lambda: b.publish(pending.id), "LEARNING_CANDIDATE_NOT_FOUND"),
        (
            lambda: b.RejectLearningCandidate(
                pb.RejectLearningCandidateRequest(id=pending.id, reason="mine")
            ),
            "LEARNING_CANDIDATE_NOT_FOUND",
        ),
        (lambda: b.GetLearning(pb.GetLearningRequest(id=learning.id)), "LEARNING_NOT_FOUND"),
        (
            lambda: b.RevokeLearning(pb.RevokeLearningRequest(id=learning.id, reason="mine")),
            "LEARNING_NOT_FOUND",
        ),
    ]
    for call, reason in attempts:
        assert fails(call, missing)[0] == reason
    # Nor can B supersede A's learning with its own candidate.
    own = b.create("Tenant A's published fact.")
    assert fails(lambda: b.publish(own.id, supersedes_id=learning.id), missing)[0] == "LEARNING_NOT_FOUND"
    assert not b.ListLearnings(pb.ListLearningsRequest()).learnings
    assert [c.id for c in b.ListLearningCandidates(pb.ListLearningCandidatesRequest()).candidates] == [own.id]
    # A's rows are as they were.
    assert (
        a.GetLearningCandidate(pb.GetLearningCandidateRequest(id=pending.id)).candidate.state
        == pb.CANDIDATE_STATE_PENDING
    )
    assert a.GetLearning(pb.GetLearningRequest(id=learning.id)).learning.state == pb.LEARNING_STATE_ACTIVE
    assert len(a.ListLearningCandidates(pb.ListLearningCandidatesRequest()).candidates) == 2


def test_calls_need_a_tenant_key(server: LiveServer) -> None:
    stub = pb_grpc.LearningServiceStub(server.channel())
    request = pb.ListLearningsRequest()
    with pytest.raises(grpc.RpcError) as err:
        stub.ListLearnings(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as err:
        stub.ListLearnings(request, metadata=bearer(ADMIN_KEY), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error_info(err.value)[0] == "TENANT_KEY_REQUIRED"
