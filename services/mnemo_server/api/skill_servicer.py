"""mnemo.v1.SkillService: protobuf in, domain call, protobuf out."""

from __future__ import annotations

import grpc

from mnemo.v1 import skill_service_pb2 as pb
from mnemo.v1 import skill_service_pb2_grpc as pb_grpc
from mnemo_server.api import convert
from mnemo_server.api.interceptor import current_principal
from mnemo_server.api.learning_servicer import enum_from_pb
from mnemo_server.learning.model import LifecycleEvent
from mnemo_server.skills.model import RolloutResult, RolloutStage, Skill, SkillState
from mnemo_server.skills.service import SkillService
from mnemo_server.tenancy.tenants import require_tenant

_STATE_TO_PB = {
    SkillState.DRAFT: pb.SKILL_STATE_DRAFT,
    SkillState.VERIFIED: pb.SKILL_STATE_VERIFIED,
    SkillState.CANARY: pb.SKILL_STATE_CANARY,
    SkillState.ACTIVE: pb.SKILL_STATE_ACTIVE,
    SkillState.REVOKED: pb.SKILL_STATE_REVOKED,
}
_STATE_FROM_PB = {v: k for k, v in _STATE_TO_PB.items()}
_STAGE_TO_PB = {
    RolloutStage.VERIFICATION: pb.ROLLOUT_STAGE_VERIFICATION,
    RolloutStage.CANARY: pb.ROLLOUT_STAGE_CANARY,
}
_STAGE_FROM_PB = {v: k for k, v in _STAGE_TO_PB.items()}


def _tenant() -> str:
    return require_tenant(current_principal())


def _skill_pb(s: Skill) -> pb.Skill:
    return pb.Skill(
        id=s.id,
        name=s.name,
        description=s.description,
        instructions=s.instructions,
        source_learning_id=s.source_learning_id,
        state=_STATE_TO_PB[s.state],
        definition_fingerprint=s.definition_fingerprint,
        create_time=convert.ns_to_ts(s.create_time_ns),
        update_time=convert.ns_to_ts(s.update_time_ns),
    )


def _event_pb(e: LifecycleEvent) -> pb.SkillEvent:
    return pb.SkillEvent(
        from_state=_STATE_TO_PB[SkillState(e.from_state)] if e.from_state else pb.SKILL_STATE_UNSPECIFIED,
        to_state=_STATE_TO_PB[SkillState(e.to_state)],
        reason=e.reason,
        time=convert.ns_to_ts(e.time_ns),
    )


def _result_pb(r: RolloutResult) -> pb.RolloutResult:
    return pb.RolloutResult(
        id=r.id,
        skill_id=r.skill_id,
        stage=_STAGE_TO_PB[r.stage],
        run_id=r.run_id,
        succeeded=r.succeeded,
        definition_fingerprint=r.definition_fingerprint,
        note=r.note,
        create_time=convert.ns_to_ts(r.create_time_ns),
    )


class SkillServicer(pb_grpc.SkillServiceServicer):
    def __init__(self, skills: SkillService):
        self.skills = skills

    def PromoteProcedure(
        self, request: pb.PromoteProcedureRequest, context: grpc.ServicerContext
    ) -> pb.PromoteProcedureResponse:
        tenant = _tenant()
        self.skills.validator.request_id(request.request_id)
        skill = self.skills.promote_procedure(
            tenant,
            request.learning_id,
            request.name,
            request.description,
            key=convert.idempotency_key("PromoteProcedure", request, request.request_id),
        )
        return pb.PromoteProcedureResponse(skill=_skill_pb(skill))

    def GetSkill(self, request: pb.GetSkillRequest, context: grpc.ServicerContext) -> pb.GetSkillResponse:
        skill, events = self.skills.skill_events(_tenant(), request.id)
        return pb.GetSkillResponse(skill=_skill_pb(skill), events=[_event_pb(e) for e in events])

    def ListSkills(
        self, request: pb.ListSkillsRequest, context: grpc.ServicerContext
    ) -> pb.ListSkillsResponse:
        tenant = _tenant()
        state = enum_from_pb(request.state, _STATE_FROM_PB, "state", "skill state")
        rows, token = self.skills.list_skills(
            tenant, state=state, page_size=request.page_size, page_token=request.page_token
        )
        return pb.ListSkillsResponse(skills=[_skill_pb(s) for s in rows], next_page_token=token)

    def RecordRolloutResult(
        self, request: pb.RecordRolloutResultRequest, context: grpc.ServicerContext
    ) -> pb.RecordRolloutResultResponse:
        tenant = _tenant()
        self.skills.validator.request_id(request.request_id)
        r = request.result
        result = self.skills.record_rollout_result(
            tenant,
            r.skill_id,
            enum_from_pb(r.stage, _STAGE_FROM_PB, "result.stage", "rollout stage"),
            r.run_id,
            r.succeeded,
            r.note,
            fingerprint=request.definition_fingerprint,
            key=convert.idempotency_key("RecordRolloutResult", request, request.request_id),
        )
        return pb.RecordRolloutResultResponse(result=_result_pb(result))

    def ListRolloutResults(
        self, request: pb.ListRolloutResultsRequest, context: grpc.ServicerContext
    ) -> pb.ListRolloutResultsResponse:
        rows, token = self.skills.list_rollout_results(
            _tenant(), request.skill_id, page_size=request.page_size, page_token=request.page_token
        )
        return pb.ListRolloutResultsResponse(results=[_result_pb(r) for r in rows], next_page_token=token)

    def AdvanceSkill(
        self, request: pb.AdvanceSkillRequest, context: grpc.ServicerContext
    ) -> pb.AdvanceSkillResponse:
        tenant = _tenant()
        self.skills.validator.request_id(request.request_id)
        skill = self.skills.advance_skill(
            tenant,
            request.id,
            enum_from_pb(request.state, _STATE_FROM_PB, "state", "skill state"),
            request.reason,
            fingerprint=request.definition_fingerprint,
            key=convert.idempotency_key("AdvanceSkill", request, request.request_id),
        )
        return pb.AdvanceSkillResponse(skill=_skill_pb(skill))

    def RevokeSkill(
        self, request: pb.RevokeSkillRequest, context: grpc.ServicerContext
    ) -> pb.RevokeSkillResponse:
        tenant = _tenant()
        self.skills.validator.request_id(request.request_id)
        skill = self.skills.revoke_skill(
            tenant,
            request.id,
            request.reason,
            key=convert.idempotency_key("RevokeSkill", request, request.request_id),
        )
        return pb.RevokeSkillResponse(skill=_skill_pb(skill))

    def RollbackSkill(
        self, request: pb.RollbackSkillRequest, context: grpc.ServicerContext
    ) -> pb.RollbackSkillResponse:
        tenant = _tenant()
        self.skills.validator.request_id(request.request_id)
        revoked, restored = self.skills.rollback_skill(
            tenant,
            request.id,
            request.reason,
            key=convert.idempotency_key("RollbackSkill", request, request.request_id),
        )
        return pb.RollbackSkillResponse(revoked=_skill_pb(revoked), restored=_skill_pb(restored))
