"""The skill domain: promote an active, workspace-scoped procedure learning into a draft
skill, roll it out (rollout results as evidence, draft -> verified -> canary -> active by
the rules of rollout.py), revoke it or roll back to the skill of its name active before it,
and read skills back. (A skill is also revoked when its source learning stops being active:
see LearningService.)"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from mnemo_server.errors import AlreadyExists, FailedPrecondition, FieldViolation, InvalidArgument, NotFound
from mnemo_server.learning.model import LearningKind, LearningState, LifecycleEvent, SubjectKind
from mnemo_server.learning.secrets_guard import refuse_secret_material
from mnemo_server.learning.service import check_reason, fetch_page, require_id
from mnemo_server.memory.model import IdempotencyKey, ScopeKind, now_ns
from mnemo_server.memory.paging import query_fingerprint
from mnemo_server.memory.validation import Validator, raise_if
from mnemo_server.skills import rollout
from mnemo_server.skills.model import RolloutResult, RolloutStage, Skill, SkillState, definition_fingerprint
from mnemo_server.store import idempotency_repo, learning_repo, skill_repo, snapshots
from mnemo_server.store.database import Cursor, Database

# fullmatch, not match: "$" would accept a trailing newline.
SKILL_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
MAX_DESCRIPTION_CHARS = 1_000
MAX_RUN_ID_CHARS = 256
MAX_NOTE_CHARS = 1_000


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
        elif "\x00" in description:
            out.append(FieldViolation("description", "must not contain NUL characters"))
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

    def skill_events(self, tenant_id: str, skill_id: str) -> tuple[Skill, list[LifecycleEvent]]:
        """The skill and its state changes, oldest first, read together."""
        require_id(skill_id, "id")
        # One snapshot: read one after the other, a change between them gave a state its
        # events contradicted (probe: ACTIVE beside events ending in a revocation).
        with self.db.snapshot() as cur:
            return self._skill(cur, tenant_id, skill_id), learning_repo.events_for(cur, tenant_id, skill_id)

    # --- rollout ----------------------------------------------------------------------

    def record_rollout_result(
        self,
        tenant_id: str,
        skill_id: str,
        stage: RolloutStage | None,
        run_id: str,
        succeeded: bool,
        note: str,
        *,
        fingerprint: str = "",
        key: IdempotencyKey | None = None,
    ) -> RolloutResult:
        out: list[FieldViolation] = []
        if not skill_id:
            out.append(FieldViolation("result.skill_id", "is required"))
        if stage is None:
            out.append(FieldViolation("result.stage", "is required (VERIFICATION or CANARY)"))
        if not run_id.strip() or len(run_id) > MAX_RUN_ID_CHARS or "\x00" in run_id:
            out.append(
                FieldViolation("result.run_id", f"must be 1-{MAX_RUN_ID_CHARS} characters, without NUL")
            )
        if len(note) > MAX_NOTE_CHARS or "\x00" in note:
            out.append(
                FieldViolation("result.note", f"must be at most {MAX_NOTE_CHARS} characters, without NUL")
            )
        raise_if(out)
        assert stage is not None  # reported above
        refuse_secret_material("result.run_id", run_id)  # listed back to every caller, like the note
        refuse_secret_material("result.note", note)
        with self.db.transaction() as cur:
            now = self.clock()
            replay = idempotency_repo.lookup(cur, self.db.stored.requests, tenant_id, key)
            if replay is not None:
                return self._result(cur, tenant_id, replay["id"])
            skill = self._skill(cur, tenant_id, skill_id, "result.skill_id")
            rollout.require_definition(skill, fingerprint)
            rollout.require_stage_open(skill, stage)
            result = RolloutResult(
                id=str(uuid.uuid4()),
                tenant_id=tenant_id,
                skill_id=skill.id,
                stage=stage,
                run_id=run_id,
                succeeded=succeeded,
                definition_fingerprint=skill.definition_fingerprint,
                note=note,
                create_time_ns=now,
            )
            skill_repo.insert_result(cur, result)
            idempotency_repo.record(cur, self.db.stored.requests, tenant_id, key, {"id": result.id}, now)
            return result

    def list_rollout_results(
        self, tenant_id: str, skill_id: str, *, page_size: int, page_token: str
    ) -> tuple[list[RolloutResult], str]:
        require_id(skill_id, "skill_id")
        cur = self.db.reader()
        self._skill(cur, tenant_id, skill_id, "skill_id")  # NOT_FOUND rather than an empty page
        return fetch_page(
            lambda before, limit: skill_repo.list_results(cur, tenant_id, skill_id, before, limit),
            self.validator,
            page_size,
            page_token,
            query_fingerprint("rollout_results", tenant_id, skill_id),
        )

    def advance_skill(
        self,
        tenant_id: str,
        skill_id: str,
        target: SkillState | None,
        reason: str,
        *,
        fingerprint: str = "",
        key: IdempotencyKey | None = None,
    ) -> Skill:
        require_id(skill_id, "id")
        if target not in rollout.NEXT_STATE.values():
            raise InvalidArgument("state", "must be VERIFIED, CANARY or ACTIVE")
        assert target is not None
        check_reason(reason, required=False)

        def advance(cur: Cursor, skill: Skill, now: int) -> None:
            rollout.require_definition(skill, fingerprint)
            if skill.state is target:
                return  # already there: answered as it is
            rollout.require_step(
                skill,
                target,
                lambda stage: skill_repo.evidence(
                    cur, tenant_id, skill.id, stage, skill.definition_fingerprint
                ),
            )
            self._move(cur, skill, target, reason or f"advanced to {target.value}", now)

        return self._change(tenant_id, skill_id, key, advance)

    def revoke_skill(
        self, tenant_id: str, skill_id: str, reason: str, *, key: IdempotencyKey | None = None
    ) -> Skill:
        require_id(skill_id, "id")
        check_reason(reason, required=True)

        def revoke(cur: Cursor, skill: Skill, now: int) -> None:
            rollout.require_unrevoked(skill)
            self._move(cur, skill, SkillState.REVOKED, reason, now)

        return self._change(tenant_id, skill_id, key, revoke)

    def _change(
        self,
        tenant_id: str,
        skill_id: str,
        key: IdempotencyKey | None,
        change: Callable[[Cursor, Skill, int], None],
    ) -> Skill:
        """`change(cur, skill, now)` applied to one skill in a transaction, recorded for its
        request_id; a retry answers with the skill as the first call left it, changing
        nothing."""
        with self.db.transaction() as cur:
            now = self.clock()  # under the write lock: lifecycle events stay in the order written
            replay = idempotency_repo.lookup(cur, self.db.stored.requests, tenant_id, key)
            if replay is not None:
                return self._as_left(cur, tenant_id, replay, "id", "skill")
            skill = self._skill(cur, tenant_id, skill_id)
            change(cur, skill, now)
            left = self._skill(cur, tenant_id, skill.id)
            outcome = {"id": skill.id, "skill": snapshots.dump(left)}
            idempotency_repo.record(cur, self.db.stored.requests, tenant_id, key, outcome, now)
            return left

    def _as_left(
        self, cur: Cursor, tenant_id: str, replay: dict[str, Any], id_key: str, snapshot_key: str
    ) -> Skill:
        """A replayed answer's skill as the first call left it; records from before answers
        were kept name only the skill, which is then read as it is."""
        kept = replay.get(snapshot_key)
        if kept is not None:
            return snapshots.load(Skill, kept)
        return self._skill(cur, tenant_id, replay[id_key])

    def rollback_skill(
        self, tenant_id: str, skill_id: str, reason: str, *, key: IdempotencyKey | None = None
    ) -> tuple[Skill, Skill]:
        """(the skill rolled back, now revoked; the skill of its name active again)."""
        require_id(skill_id, "id")
        check_reason(reason, required=True)
        with self.db.transaction() as cur:
            now = self.clock()
            replay = idempotency_repo.lookup(cur, self.db.stored.requests, tenant_id, key)
            if replay is not None:
                return (
                    self._as_left(cur, tenant_id, replay, "revoked", "revoked_skill"),
                    self._as_left(cur, tenant_id, replay, "restored", "restored_skill"),
                )
            skill = self._skill(cur, tenant_id, skill_id)
            details = {"skill_id": skill.id}
            earlier = skill_repo.last_active_before(cur, tenant_id, skill)
            if earlier is None:
                raise FailedPrecondition(
                    f"no skill named {skill.name!r} was active before skill {skill.id}",
                    reason="NO_EARLIER_ACTIVE",
                    metadata=details,
                )
            source = learning_repo.get_learning(cur, tenant_id, earlier.source_learning_id)
            if source is None or source.state is not LearningState.ACTIVE:
                # A skill must never outlive its source: restoring it would teach a
                # procedure that was revoked or replaced.
                raise FailedPrecondition(
                    f"skill {earlier.id}, active before, comes from learning {earlier.source_learning_id}, "
                    "which is no longer active",
                    reason="LEARNING_NOT_ACTIVE",
                    metadata={**details, "restore_id": earlier.id},
                )
            if skill.state is not SkillState.REVOKED:
                self._move(cur, skill, SkillState.REVOKED, f"rolled back: {reason}", now)
            taken = skill_repo.unrevoked_skill_named(cur, tenant_id, earlier.name)
            if taken is not None and taken.id != earlier.id:
                raise FailedPrecondition(  # raised in the transaction: the revocation above rolls back
                    f"skill {taken.id} holds the name {earlier.name!r}",
                    reason="SKILL_NAME_TAKEN",
                    metadata={**details, "holder_id": taken.id},
                )
            if earlier.state is not SkillState.ACTIVE:
                self._move(
                    cur,
                    earlier,
                    SkillState.ACTIVE,
                    f"restored by the rollback of skill {skill.id}: {reason}",
                    now,
                )
            revoked, restored = self._skill(cur, tenant_id, skill.id), self._skill(cur, tenant_id, earlier.id)
            outcome = {
                "revoked": skill.id,
                "restored": earlier.id,
                "revoked_skill": snapshots.dump(revoked),
                "restored_skill": snapshots.dump(restored),
            }
            idempotency_repo.record(cur, self.db.stored.requests, tenant_id, key, outcome, now)
            return revoked, restored

    def _move(self, cur: Cursor, skill: Skill, to: SkillState, reason: str, now: int) -> None:
        skill_repo.set_state(cur, skill.tenant_id, [skill.id], to, now)
        learning_repo.record_events(
            cur, skill.tenant_id, [LifecycleEvent(SubjectKind.SKILL, skill.id, skill.state, to, reason, now)]
        )

    def _result(self, cur: Cursor, tenant_id: str, result_id: str) -> RolloutResult:
        found = skill_repo.get_result(cur, tenant_id, result_id)
        if found is None:
            raise NotFound("rollout_result", result_id)
        return found

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

    def _skill(self, cur: Cursor, tenant_id: str, skill_id: str, field: str = "") -> Skill:
        found = skill_repo.get_skill(cur, tenant_id, skill_id)
        if found is None:
            raise NotFound("skill", skill_id, field)
        return found
