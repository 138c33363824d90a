"""The skill domain: promote an active, workspace-scoped procedure learning into a draft
skill, and read skills back. (Revocation follows the source learning: see
LearningService.revoke_learning.)"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

from mnemo_server.errors import AlreadyExists, FailedPrecondition, FieldViolation, NotFound
from mnemo_server.learning.model import LearningKind, LearningState, LifecycleEvent, SubjectKind
from mnemo_server.learning.secrets_guard import refuse_secret_material
from mnemo_server.learning.service import fetch_page, require_id
from mnemo_server.memory.model import IdempotencyKey, ScopeKind, now_ns
from mnemo_server.memory.paging import query_fingerprint
from mnemo_server.memory.validation import Validator, raise_if
from mnemo_server.skills.model import Skill, SkillState, definition_fingerprint
from mnemo_server.store import idempotency_repo, learning_repo, skill_repo
from mnemo_server.store.database import Cursor, Database

# fullmatch, not match: "$" would accept a trailing newline.
SKILL_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
MAX_DESCRIPTION_CHARS = 1_000


class SkillService:
    def __init__(self, db: Database, validator: Validator, clock: Callable[[], int] = now_ns):
        self.db = db
        self.validator = validator
        self.clock = clock

    def promote_procedure(
        self,
        tenant_id: str,
        learning_id: str,
        name: str,
        description: str,
        *,
        key: IdempotencyKey | None = None,
    ) -> Skill:
        out: list[FieldViolation] = []
        if not learning_id:
            out.append(FieldViolation("learning_id", "is required"))
        if not SKILL_NAME_RE.fullmatch(name):
            out.append(
                FieldViolation(
                    "name", "must be 1-64 characters of [a-z0-9-], starting with a letter or digit"
                )
            )
        if len(description) > MAX_DESCRIPTION_CHARS:
            out.append(
                FieldViolation(
                    "description", f"is {len(description)} characters; the limit is {MAX_DESCRIPTION_CHARS}"
                )
            )
        raise_if(out)
        refuse_secret_material("description", description)  # shown with the skill to every agent
        with self.db.transaction() as cur:
            now = self.clock()  # under the write lock: lifecycle events stay in the order written
            replay = idempotency_repo.lookup(cur, self.db.stored.requests, tenant_id, key)
            if replay is not None:
                return self._skill(cur, tenant_id, replay["id"])
            learning = learning_repo.get_learning(cur, tenant_id, learning_id)
            if learning is None:
                raise NotFound("learning", learning_id)
            details = {"learning_id": learning_id}
            if learning.state is not LearningState.ACTIVE:
                raise FailedPrecondition(
                    f"learning {learning_id} is {learning.state}; only an active learning can be promoted",
                    reason="LEARNING_NOT_ACTIVE",
                    metadata=details,
                )
            if learning.kind is not LearningKind.PROCEDURE:
                raise FailedPrecondition(
                    f"learning {learning_id} is a {learning.kind}; only procedures become skills",
                    reason="NOT_A_PROCEDURE",
                    metadata=details,
                )
            if learning.scope.kind is not ScopeKind.WORKSPACE:
                # Skills are shared by every agent of the tenant; a narrower procedure would leak out
                # of its session, persona or project.
                raise FailedPrecondition(
                    f"learning {learning_id} is scoped to {learning.scope.key}; only "
                    "workspace procedures become skills",
                    reason="NOT_WORKSPACE_SCOPE",
                    metadata=details,
                )
            taken = skill_repo.unrevoked_skill_named(cur, tenant_id, name)
            if taken is not None:
                raise AlreadyExists(
                    f"name: skill {taken.id} is already named {name!r}",
                    reason="SKILL_NAME_TAKEN",
                    metadata={"skill_id": taken.id},
                )
            skill = Skill(
                id=str(uuid.uuid4()),
                tenant_id=tenant_id,
                name=name,
                description=description,
                instructions=learning.content,
                source_learning_id=learning_id,
                state=SkillState.DRAFT,
                definition_fingerprint=definition_fingerprint(name, description, learning.content),
                create_time_ns=now,
                update_time_ns=now,
            )
            skill_repo.insert_skill(cur, skill)
            learning_repo.record_events(
                cur,
                tenant_id,
                [
                    LifecycleEvent(
                        SubjectKind.SKILL,
                        skill.id,
                        "",
                        SkillState.DRAFT,
                        f"promoted from learning {learning_id}",
                        now,
                    )
                ],
            )
            idempotency_repo.record(cur, self.db.stored.requests, tenant_id, key, {"id": skill.id}, now)
            return self._skill(cur, tenant_id, skill.id)

    def get_skill(self, tenant_id: str, skill_id: str) -> Skill:
        require_id(skill_id, "id")
        return self._skill(self.db.reader(), tenant_id, skill_id)

    def list_skills(
        self, tenant_id: str, *, state: SkillState | None, page_size: int, page_token: str
    ) -> tuple[list[Skill], str]:
        cur = self.db.reader()
        return fetch_page(
            lambda before, limit: skill_repo.list_skills(cur, tenant_id, state, before, limit),
            self.validator,
            page_size,
            page_token,
            query_fingerprint("skills", tenant_id, state),
        )

    def _skill(self, cur: Cursor, tenant_id: str, skill_id: str) -> Skill:
        found = skill_repo.get_skill(cur, tenant_id, skill_id)
        if found is None:
            raise NotFound("skill", skill_id)
        return found
