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
    """SHA-256 hex of what an agent would actually run, so a changed definition is visible."""
    return hashlib.sha256(f"{name}\n{description}\n{instructions}".encode()).hexdigest()
