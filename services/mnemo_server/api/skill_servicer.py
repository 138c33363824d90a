"""mnemo.v1.SkillService: protobuf in, domain call, protobuf out."""

from __future__ import annotations

import grpc

from mnemo.v1 import skill_service_pb2 as pb
from mnemo.v1 import skill_service_pb2_grpc as pb_grpc
from mnemo_server.api import convert
from mnemo_server.api.interceptor import current_principal
from mnemo_server.api.learning_servicer import enum_from_pb
from mnemo_server.skills.model import Skill, SkillState
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
        return pb.GetSkillResponse(skill=_skill_pb(self.skills.get_skill(_tenant(), request.id)))

    def ListSkills(
        self, request: pb.ListSkillsRequest, context: grpc.ServicerContext
    ) -> pb.ListSkillsResponse:
        tenant = _tenant()
        state = enum_from_pb(request.state, _STATE_FROM_PB, "state", "skill state")
        rows, token = self.skills.list_skills(
            tenant, state=state, page_size=request.page_size, page_token=request.page_token
        )
        return pb.ListSkillsResponse(skills=[_skill_pb(s) for s in rows], next_page_token=token)
