"""A skill's rollout over gRPC against a real server: rollout results as evidence, the steps
draft -> verified -> canary -> active and what each needs, revocation, rollback to the skill
of the same name active before, every refusal changing nothing, retries and tenants."""

from __future__ import annotations

import threading
from concurrent import futures
from typing import cast

import grpc

from mnemo.v1 import skill_service_pb2 as pb
from tests.conftest import TenantClient
from tests.integration.test_skill_service import Api, fails

VERIFICATION, CANARY = pb.ROLLOUT_STAGE_VERIFICATION, pb.ROLLOUT_STAGE_CANARY
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


class Rollout(Api):
    def record(
        self,
        skill_id: str,
        stage: int,
        succeeded: bool,
        run_id: str = "run-1",
        note: str = "",
        fingerprint: str = "",
        request_id: str = "",
    ) -> pb.RolloutResult:
        result = pb.RolloutResult(
            skill_id=skill_id,
            stage=cast(pb.RolloutStage, stage),
            run_id=run_id,
            succeeded=succeeded,
            note=note,
        )
        request = pb.RecordRolloutResultRequest(
            result=result, definition_fingerprint=fingerprint, request_id=request_id
        )
        return self.skills.RecordRolloutResult(request, metadata=self.md, timeout=10).result

    def results(
        self, skill_id: str, page_size: int = 0, page_token: str = ""
    ) -> pb.ListRolloutResultsResponse:
        request = pb.ListRolloutResultsRequest(skill_id=skill_id, page_size=page_size, page_token=page_token)
        return self.skills.ListRolloutResults(request, metadata=self.md, timeout=10)

    def advance(
        self, skill_id: str, state: int, reason: str = "", fingerprint: str = "", request_id: str = ""
    ) -> pb.Skill:
        request = pb.AdvanceSkillRequest(
            id=skill_id,
            state=cast(pb.SkillState, state),
            reason=reason,
            definition_fingerprint=fingerprint,
            request_id=request_id,
        )
        return self.skills.AdvanceSkill(request, metadata=self.md, timeout=10).skill

    def revoke_skill(self, skill_id: str, reason: str = "retired") -> pb.Skill:
        request = pb.RevokeSkillRequest(id=skill_id, reason=reason)
        return self.skills.RevokeSkill(request, metadata=self.md, timeout=10).skill

    def rollback(
        self, skill_id: str, reason: str = "canary regressed", request_id: str = ""
    ) -> pb.RollbackSkillResponse:
        request = pb.RollbackSkillRequest(id=skill_id, reason=reason, request_id=request_id)
        return self.skills.RollbackSkill(request, metadata=self.md, timeout=10)

    def events(self, skill_id: str) -> list[tuple[int, int, str]]:
        got = self.skills.GetSkill(pb.GetSkillRequest(id=skill_id), metadata=self.md, timeout=10)
        return [(e.from_state, e.to_state, e.reason) for e in got.events]

    def activate(self, skill_id: str) -> pb.Skill:
        """A skill taken through every step with the evidence each needs."""
        self.record(skill_id, VERIFICATION, True)
        self.advance(skill_id, pb.SKILL_STATE_VERIFIED)
        self.advance(skill_id, pb.SKILL_STATE_CANARY)
        self.record(skill_id, CANARY, True)
        return self.advance(skill_id, pb.SKILL_STATE_ACTIVE)


def test_a_skill_advances_one_step_at_a_time_on_the_evidence_for_its_definition(
    tenant_a: TenantClient,
) -> None:
    api = Rollout(tenant_a)
    skill = api.promote(api.learning().id, "cut-release")
    fingerprint = skill.definition_fingerprint

    def refused(state: int) -> str:
        return fails(lambda: api.advance(skill.id, state), PRECONDITION)[0]

    assert refused(pb.SKILL_STATE_CANARY) == "SKILL_STATE_ORDER"
    assert refused(pb.SKILL_STATE_VERIFIED) == "NO_VERIFICATION_EVIDENCE"
    assert fails(lambda: api.record(skill.id, CANARY, True), PRECONDITION)[0] == "WRONG_STAGE"
    failed = api.record(skill.id, VERIFICATION, False, run_id="run-0", note="timed out")
    assert (failed.succeeded, failed.stage, failed.run_id, failed.note) == (
        False,
        VERIFICATION,
        "run-0",
        "timed out",
    )
    assert failed.definition_fingerprint == fingerprint and failed.skill_id == skill.id and failed.id
    assert refused(pb.SKILL_STATE_VERIFIED) == "NO_VERIFICATION_EVIDENCE"  # a failed run is no evidence
    # Evidence for another definition is refused and not recorded.
    assert (
        fails(lambda: api.record(skill.id, VERIFICATION, True, fingerprint="0" * 64), PRECONDITION)[0]
        == "DEFINITION_CHANGED"
    )
    assert len(api.results(skill.id).results) == 1
    passed = api.record(skill.id, VERIFICATION, True, run_id="run-1", fingerprint=fingerprint)
    assert api.get(skill.id).state == pb.SKILL_STATE_DRAFT  # evidence alone moves nothing

    verified = api.advance(skill.id, pb.SKILL_STATE_VERIFIED, reason="run-1 passed", fingerprint=fingerprint)
    assert verified.state == pb.SKILL_STATE_VERIFIED
    assert api.advance(skill.id, pb.SKILL_STATE_VERIFIED) == verified  # already there: unchanged
    assert refused(pb.SKILL_STATE_ACTIVE) == "SKILL_STATE_ORDER"
    assert api.advance(skill.id, pb.SKILL_STATE_CANARY).state == pb.SKILL_STATE_CANARY
    assert fails(lambda: api.record(skill.id, VERIFICATION, True), PRECONDITION)[0] == "WRONG_STAGE"
    assert refused(pb.SKILL_STATE_ACTIVE) == "NO_CANARY_EVIDENCE"
    # A canary is hidden from the catalog of active skills while its evidence comes in.
    assert not api.list(state=pb.SKILL_STATE_ACTIVE).skills
    api.record(skill.id, CANARY, True, run_id="canary-1")
    active = api.advance(skill.id, pb.SKILL_STATE_ACTIVE)
    assert active.state == pb.SKILL_STATE_ACTIVE
    assert [s.id for s in api.list(state=pb.SKILL_STATE_ACTIVE).skills] == [skill.id]

    assert api.events(skill.id) == [
        (
            pb.SKILL_STATE_UNSPECIFIED,
            pb.SKILL_STATE_DRAFT,
            f"promoted from learning {skill.source_learning_id}",
        ),
        (pb.SKILL_STATE_DRAFT, pb.SKILL_STATE_VERIFIED, "run-1 passed"),
        (pb.SKILL_STATE_VERIFIED, pb.SKILL_STATE_CANARY, "advanced to canary"),
        (pb.SKILL_STATE_CANARY, pb.SKILL_STATE_ACTIVE, "advanced to active"),
    ]
    # Results newest first, in pages.
    first = api.results(skill.id, page_size=2)
    rest = api.results(skill.id, page_size=2, page_token=first.next_page_token)
    assert [r.run_id for r in [*first.results, *rest.results]] == ["canary-1", "run-1", "run-0"]
    assert not rest.next_page_token and first.results[1] == passed


def test_one_failed_canary_run_keeps_the_skill_from_becoming_active(tenant_a: TenantClient) -> None:
    api = Rollout(tenant_a)
    skill = api.promote(api.learning().id, "cut-release")
    api.record(skill.id, VERIFICATION, True)
    api.advance(skill.id, pb.SKILL_STATE_VERIFIED)
    api.advance(skill.id, pb.SKILL_STATE_CANARY)
    api.record(skill.id, CANARY, True, run_id="canary-1")
    api.record(skill.id, CANARY, False, run_id="canary-2")
    api.record(skill.id, CANARY, True, run_id="canary-3")
    got = fails(lambda: api.advance(skill.id, pb.SKILL_STATE_ACTIVE), PRECONDITION)
    assert got[0] == "CANARY_FAILURES"
    assert api.get(skill.id).state == pb.SKILL_STATE_CANARY


def test_rollback_restores_the_skill_of_the_name_active_before(tenant_a: TenantClient) -> None:
    api = Rollout(tenant_a)
    first_source = api.learning()
    v1 = api.activate(api.promote(first_source.id, "cut-release").id)
    # A new definition: the old skill revoked, the new procedure promoted under the name.
    assert api.revoke_skill(v1.id, "moving to the CI pipeline").state == pb.SKILL_STATE_REVOKED
    v2 = api.activate(api.promote(api.learning("1. tag\n2. let CI release").id, "cut-release").id)
    assert fails(lambda: api.rollback(v1.id), PRECONDITION)[0] == "NO_EARLIER_ACTIVE"  # nothing before v1

    back = api.rollback(v2.id, "CI releases fail", request_id="rollback-1")
    assert (back.revoked.id, back.revoked.state) == (v2.id, pb.SKILL_STATE_REVOKED)
    assert (back.restored.id, back.restored.state) == (v1.id, pb.SKILL_STATE_ACTIVE)
    assert api.rollback(v2.id, "CI releases fail", request_id="rollback-1") == back  # a retry
    assert api.events(v2.id)[-1] == (
        pb.SKILL_STATE_ACTIVE,
        pb.SKILL_STATE_REVOKED,
        "rolled back: CI releases fail",
    )
    assert api.events(v1.id)[-1] == (
        pb.SKILL_STATE_REVOKED,
        pb.SKILL_STATE_ACTIVE,
        f"restored by the rollback of skill {v2.id}: CI releases fail",
    )
    assert [s.id for s in api.list(state=pb.SKILL_STATE_ACTIVE).skills] == [v1.id]

    # The skill to restore must still have an active source: revoking the source learning
    # revokes v1; a rollback of the next skill would bring back a revoked procedure.
    api.revoke(first_source.id, "wrong steps")
    v3 = api.promote(api.learning("1. tag\n2. release by hand").id, "cut-release")
    before = api.get(v3.id)
    assert fails(lambda: api.rollback(v3.id), PRECONDITION)[0] == "LEARNING_NOT_ACTIVE"
    assert api.get(v3.id) == before and api.get(v1.id).state == pb.SKILL_STATE_REVOKED


def test_a_rollback_into_a_name_another_skill_holds_changes_nothing(tenant_a: TenantClient) -> None:
    api = Rollout(tenant_a)
    v1 = api.activate(api.promote(api.learning().id, "cut-release").id)
    api.revoke_skill(v1.id)
    v2 = api.promote(api.learning("1. second").id, "cut-release")
    api.revoke_skill(v2.id)
    v3 = api.promote(api.learning("1. third").id, "cut-release")
    got = fails(lambda: api.rollback(v2.id), PRECONDITION)
    assert got[0] == "SKILL_NAME_TAKEN"
    states = [api.get(s.id).state for s in (v1, v2, v3)]
    assert states == [pb.SKILL_STATE_REVOKED, pb.SKILL_STATE_REVOKED, pb.SKILL_STATE_DRAFT]


def test_rollout_errors_name_the_field_and_change_nothing(tenant_a: TenantClient) -> None:
    api = Rollout(tenant_a)
    skill = api.promote(api.learning().id, "cut-release")
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    bad_input = [
        (lambda: api.record("", VERIFICATION, True), "result.skill_id"),
        (lambda: api.record(skill.id, 0, True), "result.stage"),
        (lambda: api.record(skill.id, 9, True), "result.stage"),
        (lambda: api.record(skill.id, VERIFICATION, True, run_id=""), "result.run_id"),
        (lambda: api.record(skill.id, VERIFICATION, True, run_id="r" * 257), "result.run_id"),
        (lambda: api.record(skill.id, VERIFICATION, True, note="n" * 1_001), "result.note"),
        (lambda: api.record(skill.id, VERIFICATION, True, note="token ghp_" + "a" * 36), "result.note"),
        (lambda: api.record(skill.id, VERIFICATION, True, request_id="has space"), "request_id"),
        (lambda: api.results(""), "skill_id"),
        (lambda: api.results(skill.id, page_size=-1), "page_size"),
        (lambda: api.results(skill.id, page_token="junk"), "page_token"),
        (lambda: api.advance("", pb.SKILL_STATE_VERIFIED), "id"),
        (lambda: api.advance(skill.id, 0), "state"),
        (lambda: api.advance(skill.id, pb.SKILL_STATE_DRAFT), "state"),
        (lambda: api.advance(skill.id, pb.SKILL_STATE_REVOKED), "state"),
        (lambda: api.advance(skill.id, 42), "state"),
        (lambda: api.advance(skill.id, pb.SKILL_STATE_VERIFIED, reason="r" * 1_001), "reason"),
        (lambda: api.revoke_skill(skill.id, ""), "reason"),
        (lambda: api.rollback(skill.id, ""), "reason"),
        (lambda: api.rollback(""), "id"),
        (lambda: api.revoke_skill(skill.id, "retired\x00hidden"), "reason"),
        (lambda: api.advance(skill.id, pb.SKILL_STATE_VERIFIED, reason="a\x00b"), "reason"),
        (lambda: api.record(skill.id, VERIFICATION, True, run_id="ghp_" + "a" * 36), "result.run_id"),
        (lambda: api.promote(skill.source_learning_id, "other-name", "a\x00b"), "description"),
    ]
    for call, field in bad_input:
        assert fails(call, invalid)[1] == [field], field
    missing = grpc.StatusCode.NOT_FOUND
    assert fails(lambda: api.record("nope", VERIFICATION, True), missing)[0] == "SKILL_NOT_FOUND"
    assert fails(lambda: api.results("nope"), missing)[0] == "SKILL_NOT_FOUND"
    assert fails(lambda: api.advance("nope", pb.SKILL_STATE_VERIFIED), missing)[0] == "SKILL_NOT_FOUND"
    assert fails(lambda: api.revoke_skill("nope"), missing)[0] == "SKILL_NOT_FOUND"
    assert fails(lambda: api.rollback("nope"), missing)[0] == "SKILL_NOT_FOUND"
    assert not api.results(skill.id).results and api.get(skill.id) == skill  # nothing written

    # Retries take effect once; the same request_id for another request is refused.
    once = api.record(skill.id, VERIFICATION, True, request_id="result-1")
    assert api.record(skill.id, VERIFICATION, True, request_id="result-1") == once
    assert fails(lambda: api.record(skill.id, VERIFICATION, False, request_id="result-1"), invalid) == (
        "REQUEST_ID_REUSED",
        ["request_id"],
    )
    assert len(api.results(skill.id).results) == 1
    # A retry that sends back what the first answer filled in (all output only) is the same
    # request (probe: it was refused as REQUEST_ID_REUSED).
    resent = pb.RecordRolloutResultRequest(result=once, request_id="result-1")
    assert api.skills.RecordRolloutResult(resent, metadata=api.md, timeout=10).result == once
    assert len(api.results(skill.id).results) == 1

    api.revoke_skill(skill.id)
    assert fails(lambda: api.revoke_skill(skill.id), PRECONDITION)[0] == "SKILL_REVOKED"
    assert fails(lambda: api.advance(skill.id, pb.SKILL_STATE_VERIFIED), PRECONDITION)[0] == "SKILL_REVOKED"
    assert fails(lambda: api.record(skill.id, VERIFICATION, True), PRECONDITION)[0] == "SKILL_REVOKED"


def test_tenants_cannot_roll_out_each_others_skills(tenant_a: TenantClient, tenant_b: TenantClient) -> None:
    a, b = Rollout(tenant_a), Rollout(tenant_b)
    skill = a.promote(a.learning().id, "cut-release")
    a.record(skill.id, VERIFICATION, True)
    missing = grpc.StatusCode.NOT_FOUND
    for call in (
        lambda: b.record(skill.id, VERIFICATION, True),
        lambda: b.results(skill.id),
        lambda: b.advance(skill.id, pb.SKILL_STATE_VERIFIED),
        lambda: b.revoke_skill(skill.id),
        lambda: b.rollback(skill.id),
    ):
        assert fails(call, missing)[0] == "SKILL_NOT_FOUND"
    assert a.get(skill.id).state == pb.SKILL_STATE_DRAFT and len(a.results(skill.id).results) == 1


def test_get_skill_reads_the_state_and_its_events_at_one_moment(tenant_a: TenantClient) -> None:
    """A skill's state is always its newest event's: read while another caller moves skills
    along (probe: 4-48 of the reads in a run answered ACTIVE beside events ending in a
    revocation, or DRAFT beside events ending in VERIFIED)."""
    api = Rollout(tenant_a)
    source = api.learning().id
    skills = [api.promote(source, f"step-{i}").id for i in range(3)]
    done = threading.Event()
    torn: list[tuple[int, list[int]]] = []

    def read() -> int:
        reads = 0
        while not done.is_set():
            for skill_id in skills:
                got = api.skills.GetSkill(pb.GetSkillRequest(id=skill_id), metadata=api.md, timeout=10)
                if got.skill.state != got.events[-1].to_state:
                    torn.append((got.skill.state, [e.to_state for e in got.events]))
                reads += 1
        return reads

    with futures.ThreadPoolExecutor(3) as pool:
        readers = [pool.submit(read) for _ in range(3)]
        try:
            for skill_id in skills:
                api.activate(skill_id)
                api.revoke_skill(skill_id)
        finally:
            done.set()
        reads = sum(r.result() for r in readers)
    assert reads > 0 and not torn, torn[:3]
