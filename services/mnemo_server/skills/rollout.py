"""The rollout rules of a skill: draft -> verified -> canary -> active, each step allowed by
its evidence (kheish-learning-and-skills.txt, "Promotion rollout states"): verified needs a
successful verification run of the skill's definition; active needs at least one successful
canary run and no failed one, for that definition. A result is evidence only for the
definition it ran, so a fingerprint-guarded record is refused when the definition differs."""

from __future__ import annotations

from collections.abc import Callable

from mnemo_server.errors import FailedPrecondition
from mnemo_server.skills.model import RolloutStage, Skill, SkillState

NEXT_STATE = {
    SkillState.DRAFT: SkillState.VERIFIED,
    SkillState.VERIFIED: SkillState.CANARY,
    SkillState.CANARY: SkillState.ACTIVE,
}
# The skill states in which a stage's results are taken.
STAGE_STATES = {
    RolloutStage.VERIFICATION: (SkillState.DRAFT, SkillState.VERIFIED),
    RolloutStage.CANARY: (SkillState.CANARY,),
}

# (succeeded, failed) results of a stage for the skill's current definition
Evidence = Callable[[RolloutStage], tuple[int, int]]


def require_unrevoked(skill: Skill) -> None:
    if skill.state is SkillState.REVOKED:
        raise FailedPrecondition(
            f"skill {skill.id} is revoked", reason="SKILL_REVOKED", metadata={"skill_id": skill.id}
        )


def require_definition(skill: Skill, fingerprint: str) -> None:
    """A caller's fingerprint guard (empty: none) must name the skill's definition."""
    if fingerprint and fingerprint != skill.definition_fingerprint:
        raise FailedPrecondition(
            f"definition_fingerprint: skill {skill.id}'s definition is {skill.definition_fingerprint}, "
            f"not {fingerprint}",
            reason="DEFINITION_CHANGED",
            metadata={"skill_id": skill.id, "definition_fingerprint": skill.definition_fingerprint},
        )


def require_stage_open(skill: Skill, stage: RolloutStage) -> None:
    """Results of `stage` are taken only in the states that gather its evidence."""
    require_unrevoked(skill)
    if skill.state not in STAGE_STATES[stage]:
        states = " or ".join(s.value for s in STAGE_STATES[stage])
        raise FailedPrecondition(
            f"skill {skill.id} is {skill.state.value}; {stage.value} results are taken while it is {states}",
            reason="WRONG_STAGE",
            metadata={"skill_id": skill.id, "state": skill.state.value},
        )


def require_step(skill: Skill, target: SkillState, evidence: Evidence) -> None:
    """FAILED_PRECONDITION unless `target` is the next state of `skill` and its evidence
    allows the step."""
    require_unrevoked(skill)
    details = {"skill_id": skill.id, "state": skill.state.value}
    if NEXT_STATE.get(skill.state) is not target:
        raise FailedPrecondition(
            f"skill {skill.id} is {skill.state.value}; it cannot become {target.value} "
            "(draft -> verified -> canary -> active, one step at a time)",
            reason="SKILL_STATE_ORDER",
            metadata=details,
        )
    if target is SkillState.VERIFIED:
        succeeded, _ = evidence(RolloutStage.VERIFICATION)
        if not succeeded:
            raise FailedPrecondition(
                f"skill {skill.id} has no successful verification run of its definition",
                reason="NO_VERIFICATION_EVIDENCE",
                metadata=details,
            )
    elif target is SkillState.ACTIVE:
        succeeded, failed = evidence(RolloutStage.CANARY)
        if failed:
            raise FailedPrecondition(
                f"skill {skill.id} failed {failed} canary run(s) of its definition",
                reason="CANARY_FAILURES",
                metadata=details,
            )
        if not succeeded:
            raise FailedPrecondition(
                f"skill {skill.id} has no successful canary run of its definition",
                reason="NO_CANARY_EVIDENCE",
                metadata=details,
            )
