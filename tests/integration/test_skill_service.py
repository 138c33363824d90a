"""SkillService over gRPC against a real server: promotion, the revocation cascade from
LearningService, every validation error, idempotent retries, paging and tenant isolation."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import partial
from typing import cast

import grpc
import pytest

from mnemo.v1 import common_pb2
from mnemo.v1 import learning_service_pb2 as lpb
from mnemo.v1 import learning_service_pb2_grpc as lpb_grpc
from mnemo.v1 import skill_service_pb2 as pb
from mnemo.v1 import skill_service_pb2_grpc as pb_grpc
from mnemo_server.store import learning_repo
from tests.conftest import LiveServer, TenantClient, error_info

STEPS = "1. git pull --rebase\n2. make release\n3. push the tag"


class Api:
    """Learning and skill stubs bound to one tenant's key."""

    def __init__(self, client: TenantClient):
        self.learnings = lpb_grpc.LearningServiceStub(client.channel)
        self.skills = pb_grpc.SkillServiceStub(client.channel)
        self.md = client.md

    def learning(
        self,
        content: str = STEPS,
        kind: int = lpb.LEARNING_KIND_PROCEDURE,
        scope: common_pb2.Scope | None = None,
    ) -> lpb.Learning:
        """A published learning."""
        candidate = lpb.LearningCandidate(content=content, kind=kind, scope=scope)  # type: ignore[arg-type]
        created = self.learnings.CreateLearningCandidate(
            lpb.CreateLearningCandidateRequest(candidate=candidate), metadata=self.md, timeout=10
        ).candidate
        return self.learnings.PublishLearningCandidate(
            lpb.PublishLearningCandidateRequest(id=created.id), metadata=self.md, timeout=10
        ).learning

    def supersede(self, learning_id: str, content: str) -> lpb.Learning:
        """A procedure published to replace the learning."""
        candidate = lpb.LearningCandidate(content=content, kind=lpb.LEARNING_KIND_PROCEDURE)
        created = self.learnings.CreateLearningCandidate(
            lpb.CreateLearningCandidateRequest(candidate=candidate), metadata=self.md, timeout=10
        ).candidate
        return self.learnings.PublishLearningCandidate(
            lpb.PublishLearningCandidateRequest(id=created.id, supersedes_id=learning_id),
            metadata=self.md,
            timeout=10,
        ).learning

    def revoke(self, learning_id: str, reason: str = "outdated") -> None:
        self.learnings.RevokeLearning(
            lpb.RevokeLearningRequest(id=learning_id, reason=reason), metadata=self.md, timeout=10
        )

    def promote(self, learning_id: str, name: str, description: str = "", request_id: str = "") -> pb.Skill:
        return self.skills.PromoteProcedure(
            pb.PromoteProcedureRequest(
                learning_id=learning_id, name=name, description=description, request_id=request_id
            ),
            metadata=self.md,
            timeout=10,
        ).skill

    def get(self, skill_id: str) -> pb.Skill:
        return self.skills.GetSkill(pb.GetSkillRequest(id=skill_id), metadata=self.md, timeout=10).skill

    def list(self, *, state: int = 0, page_size: int = 0, page_token: str = "") -> pb.ListSkillsResponse:
        # state is a plain int so tests can send numbers the enum does not define.
        request = pb.ListSkillsRequest(
            state=cast(pb.SkillState, state), page_size=page_size, page_token=page_token
        )
        return self.skills.ListSkills(request, metadata=self.md, timeout=10)


def fails(call: Callable[[], object], code: grpc.StatusCode) -> tuple[str, list[str]]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    return error_info(err.value)


def test_promote_then_revoke_the_source(server: LiveServer, tenant_a: TenantClient) -> None:
    api = Api(tenant_a)
    proc = api.learning()
    other = api.learning("1. make lint\n2. make test")
    skill = api.promote(proc.id, "cut-release", "Cut a release from main.")
    assert skill.id
    assert skill.state == pb.SKILL_STATE_DRAFT
    assert skill.name == "cut-release"
    assert skill.instructions == STEPS
    assert skill.source_learning_id == proc.id
    parts = ["cut-release", "Cut a release from main.", STEPS]
    netstrings = "".join(f"{len(p.encode())}:{p}," for p in parts)
    assert skill.definition_fingerprint == hashlib.sha256(netstrings.encode()).hexdigest()
    assert skill.HasField("create_time")
    assert api.get(skill.id) == skill
    second = api.promote(proc.id, "cut-release-fast")
    unrelated = api.promote(other.id, "lint")

    api.revoke(proc.id, "the release process moved to CI")
    assert api.get(skill.id).state == pb.SKILL_STATE_REVOKED
    assert api.get(second.id).state == pb.SKILL_STATE_REVOKED
    assert api.get(unrelated.id).state == pb.SKILL_STATE_DRAFT
    revoked = api.list(state=pb.SKILL_STATE_REVOKED).skills
    assert [s.id for s in revoked] == [second.id, skill.id]
    trail = learning_repo.events_for(server.server.core.db.reader(), "tenant-a", skill.id)
    assert [(e.from_state, e.to_state) for e in trail] == [("", "draft"), ("draft", "revoked")]
    # A revoked learning cannot be promoted again.
    assert (
        fails(lambda: api.promote(proc.id, "again"), grpc.StatusCode.FAILED_PRECONDITION)[0]
        == "LEARNING_NOT_ACTIVE"
    )


def test_superseding_the_source_revokes_its_skills(server: LiveServer, tenant_a: TenantClient) -> None:
    """A skill copies its source's procedure: once a newer learning replaces that procedure,
    the skill would teach the old steps, so it is revoked with the supersession."""
    api = Api(tenant_a)
    proc = api.learning()
    skill = api.promote(proc.id, "cut-release")
    newer = api.supersede(proc.id, "1. tag from CI")
    assert api.get(skill.id).state == pb.SKILL_STATE_REVOKED
    trail = learning_repo.events_for(server.server.core.db.reader(), "tenant-a", skill.id)
    assert [(e.from_state, e.to_state) for e in trail] == [("", "draft"), ("draft", "revoked")]
    assert trail[-1].reason == f"source learning {proc.id} superseded by {newer.id}"
    # The new steps are promoted under the revoked skill's name (revoke, then re-promote).
    again = api.promote(newer.id, "cut-release")
    assert (
        again.state == pb.SKILL_STATE_DRAFT
        and again.id != skill.id
        and again.instructions == "1. tag from CI"
    )
    assert fails(lambda: api.promote(newer.id, "cut-release"), grpc.StatusCode.ALREADY_EXISTS)[0] == (
        "SKILL_NAME_TAKEN"
    )  # while a skill holds it, the name stays taken


def test_promote_errors(tenant_a: TenantClient) -> None:
    api = Api(tenant_a)
    proc = api.learning()
    fact = api.learning("The release branch is main.", lpb.LEARNING_KIND_FACT)
    project = api.learning(scope=common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="p1"))
    superseded = api.learning("1. old steps")
    current = api.supersede(superseded.id, "1. new steps")

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    bad_input: list[tuple[Callable[[], object], str]] = [
        (lambda: api.promote("", "name"), "learning_id"),
        (lambda: api.promote(proc.id, ""), "name"),
        (lambda: api.promote(proc.id, "Release"), "name"),
        (lambda: api.promote(proc.id, "-release"), "name"),
        (lambda: api.promote(proc.id, "re lease"), "name"),
        (lambda: api.promote(proc.id, "x" * 65), "name"),
        (lambda: api.promote(proc.id, "release", "d" * 1_001), "description"),
        (lambda: api.promote(proc.id, "release", request_id="has space"), "request_id"),
        (lambda: api.list(state=77), "state"),
        (lambda: api.list(page_size=-1), "page_size"),
        (lambda: api.list(page_token="junk"), "page_token"),
        (lambda: api.get(""), "id"),
    ]
    for call, field in bad_input:
        assert fails(call, invalid) == ("INVALID_ARGUMENT", [field])

    assert (
        fails(lambda: api.promote("no-such-learning", "release"), grpc.StatusCode.NOT_FOUND)[0]
        == "LEARNING_NOT_FOUND"
    )
    assert fails(lambda: api.get("no-such-skill"), grpc.StatusCode.NOT_FOUND)[0] == "SKILL_NOT_FOUND"
    preconditions = [
        (superseded.id, "LEARNING_NOT_ACTIVE"),
        (fact.id, "NOT_A_PROCEDURE"),
        (project.id, "NOT_WORKSPACE_SCOPE"),
    ]
    for lid, reason in preconditions:
        got = fails(partial(api.promote, lid, "release"), grpc.StatusCode.FAILED_PRECONDITION)
        assert got[0] == reason
    # Nothing was written by any of it.
    assert not api.list().skills

    api.promote(proc.id, "release", "d" * 1_000)
    # Names are unique across the tenant's skills, whatever learning they come from.
    assert (
        fails(lambda: api.promote(current.id, "release"), grpc.StatusCode.ALREADY_EXISTS)[0]
        == "SKILL_NAME_TAKEN"
    )
    assert len(api.list().skills) == 1


def test_idempotent_promote(tenant_a: TenantClient) -> None:
    api = Api(tenant_a)
    proc = api.learning()
    first = api.promote(proc.id, "release", "Cut a release.", request_id="promote-1")
    again = api.promote(proc.id, "release", "Cut a release.", request_id="promote-1")
    assert again == first
    assert len(api.list().skills) == 1
    assert fails(
        lambda: api.promote(proc.id, "other", request_id="promote-1"), grpc.StatusCode.INVALID_ARGUMENT
    ) == ("REQUEST_ID_REUSED", ["request_id"])


def test_list_pages_newest_first(tenant_a: TenantClient) -> None:
    api = Api(tenant_a)
    proc = api.learning()
    made = [api.promote(proc.id, f"skill-{i}").id for i in range(5)]
    seen: list[str] = []
    token, pages = "", 0
    while True:
        page = api.list(page_size=2, page_token=token)
        seen += [s.id for s in page.skills]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == made[::-1]
    assert pages == 3
    drafts = api.list(state=pb.SKILL_STATE_DRAFT, page_size=1)
    assert [s.id for s in drafts.skills] == [made[-1]]
    assert fails(
        lambda: api.list(page_size=1, page_token=drafts.next_page_token), grpc.StatusCode.INVALID_ARGUMENT
    )[1] == ["page_token"]
    assert not api.list(state=pb.SKILL_STATE_ACTIVE).skills


def test_tenants_cannot_see_or_change_each_other(tenant_a: TenantClient, tenant_b: TenantClient) -> None:
    a, b = Api(tenant_a), Api(tenant_b)
    proc = a.learning()
    skill = a.promote(proc.id, "release")
    missing = grpc.StatusCode.NOT_FOUND
    assert fails(lambda: b.get(skill.id), missing)[0] == "SKILL_NOT_FOUND"
    assert fails(lambda: b.promote(proc.id, "stolen"), missing)[0] == "LEARNING_NOT_FOUND"
    assert fails(lambda: b.revoke(proc.id), missing)[0] == "LEARNING_NOT_FOUND"
    assert not b.list().skills
    # Names are per tenant: B may use A's.
    theirs = b.promote(b.learning().id, "release")
    assert theirs.id != skill.id
    assert [s.id for s in a.list().skills] == [skill.id]
    assert a.get(skill.id).state == pb.SKILL_STATE_DRAFT
