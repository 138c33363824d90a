"""Plain domain types for skills: reusable procedures promoted from reviewed learnings."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum


class SkillState(StrEnum):
    DRAFT = "draft"
    VERIFIED = "verified"
    CANARY = "canary"
    ACTIVE = "active"
    REVOKED = "revoked"


class RolloutStage(StrEnum):
    """Which step of the rollout a run's result is evidence for."""

    VERIFICATION = "verification"
    CANARY = "canary"


@dataclass(frozen=True)
class RolloutResult:
    id: str
    tenant_id: str
    skill_id: str
    stage: RolloutStage
    run_id: str
    succeeded: bool
    definition_fingerprint: str  # the definition the run executed
    note: str
    create_time_ns: int


@dataclass(frozen=True)
class Skill:
    id: str
    tenant_id: str
    name: str
    description: str
    instructions: str
    source_learning_id: str
    state: SkillState
    definition_fingerprint: str
    create_time_ns: int
    update_time_ns: int


def definition_fingerprint(name: str, description: str, instructions: str) -> str:
    """SHA-256 hex of what an agent would actually run, so a changed definition is visible.
    Each part goes in as a netstring of its UTF-8 bytes ("<length>:<bytes>,"): joined by
    newlines, which a description or instructions may hold, "Deploy\nstep one" + "step two"
    and "Deploy" + "step one\nstep two" had one fingerprint, and a rollout result recorded
    for one passed the other's DEFINITION_CHANGED check (probe)."""
    digest = hashlib.sha256()
    for part in (name, description, instructions):
        data = part.encode()
        digest.update(b"%d:%b," % (len(data), data))
    return digest.hexdigest()
