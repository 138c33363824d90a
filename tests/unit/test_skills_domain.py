"""SkillService without gRPC: promotion rules, name validation and uniqueness, idempotency,
paging and tenant isolation, against a real DuckDB file."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from mnemo_server.config import LimitsConfig
from mnemo_server.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from mnemo_server.learning.model import CandidateDraft, LearningKind, SubjectKind
from mnemo_server.learning.service import LearningService
from mnemo_server.memory.model import IdempotencyKey, Scope, ScopeKind
from mnemo_server.memory.validation import Validator
from mnemo_server.skills.model import RolloutStage, SkillState, definition_fingerprint
from mnemo_server.skills.service import SkillService
from mnemo_server.store import learning_repo
from mnemo_server.store.database import Database

A, B = "tenant-a", "tenant-b"
STEPS = "1. git pull\n2. make release\n3. tag the commit"


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(tmp_path / "x.duckdb")
    yield database
    database.close()


@pytest.fixture
def learnings(db: Database) -> LearningService:
    ticks = itertools.count(1_700_000_000_000_000_000, 1_000)
    return LearningService(db, Validator(LimitsConfig()), clock=lambda: next(ticks))


@pytest.fixture
def svc(db: Database, learnings: LearningService) -> SkillService:
    return SkillService(db, learnings.validator, clock=learnings.clock)


def learning(
    learnings: LearningService,
    tenant: str = A,
    *,
    content: str = STEPS,
    kind: LearningKind = LearningKind.PROCEDURE,
    scope: Scope | None = None,
) -> str:
    c = learnings.create_candidate(
        tenant, CandidateDraft(kind=kind, content=content, scope=scope or Scope.workspace())
    )
    return learnings.publish_candidate(tenant, c.id).learning.id


def skill_rows(db: Database) -> int:
    row = db.reader().execute("SELECT count(*) FROM skills").fetchone()
    assert row is not None
    return int(row[0])


def test_promote_makes_a_draft_skill(db: Database, learnings: LearningService, svc: SkillService) -> None:
    lid = learning(learnings)
    skill = svc.promote_procedure(A, lid, "cut-release", "Cut a release from main.")
    assert skill.state is SkillState.DRAFT
    assert skill.instructions == STEPS
    assert skill.source_learning_id == lid
    assert skill.name == "cut-release"
    parts = ["cut-release", "Cut a release from main.", STEPS]
    netstrings = "".join(f"{len(p.encode())}:{p}," for p in parts)
    assert skill.definition_fingerprint == hashlib.sha256(netstrings.encode()).hexdigest()
    assert svc.get_skill(A, skill.id) == skill
    [event] = learning_repo.events_for(db.reader(), A, skill.id)
    assert (event.subject_kind, event.from_state, event.to_state) == (SubjectKind.SKILL, "", "draft")
    assert lid in event.reason


def test_fingerprint_tracks_the_definition(learnings: LearningService, svc: SkillService) -> None:
    lid = learning(learnings)
    one = svc.promote_procedure(A, lid, "one", "same")
    two = svc.promote_procedure(A, lid, "two", "same")
    three = svc.promote_procedure(A, lid, "three", "different")
    assert len({one.definition_fingerprint, two.definition_fingerprint, three.definition_fingerprint}) == 3


@pytest.mark.parametrize("name", ["a", "9lives", "deploy-to-prod", "x" * 64, "a-"])
def test_valid_names(learnings: LearningService, svc: SkillService, name: str) -> None:
    assert svc.promote_procedure(A, learning(learnings), name, "").name == name


@pytest.mark.parametrize(
    ("learning_id", "name", "description", "field"),
    [
        ("", "ok", "", "learning_id"),
        ("L", "", "", "name"),
        ("L", "Upper", "", "name"),
        ("L", "-leading-dash", "", "name"),
        ("L", "has space", "", "name"),
        ("L", "under_score", "", "name"),
        ("L", "x" * 65, "", "name"),
        ("L", "trailing-newline\n", "", "name"),
        ("L", "ok", "d" * 1_001, "description"),
    ],
)
def test_invalid_input_names_the_field(
    db: Database,
    learnings: LearningService,
    svc: SkillService,
    *,
    learning_id: str,
    name: str,
    description: str,
    field: str,
) -> None:
    lid = learning(learnings) if learning_id else ""
    with pytest.raises(InvalidArgument) as err:
        svc.promote_procedure(A, lid, name, description)
    assert [v.field for v in err.value.violations] == [field]
    assert skill_rows(db) == 0


def test_description_limit_is_inclusive(learnings: LearningService, svc: SkillService) -> None:
    assert len(svc.promote_procedure(A, learning(learnings), "long", "d" * 1_000).description) == 1_000


def test_learning_must_exist_in_this_tenant(learnings: LearningService, svc: SkillService) -> None:
    theirs = learning(learnings, B)
    for missing in ("no-such-learning", theirs):
        with pytest.raises(NotFound) as err:
            svc.promote_procedure(A, missing, "name", "")
        assert err.value.reason == "LEARNING_NOT_FOUND"


def test_preconditions_each_have_a_reason(
    db: Database, learnings: LearningService, svc: SkillService
) -> None:
    revoked = learning(learnings)
    learnings.revoke_learning(A, revoked, "outdated")
    fact = learning(learnings, kind=LearningKind.FACT, content="The release branch is main.")
    project = learning(learnings, scope=Scope(ScopeKind.PROJECT, "p1"))
    session = learning(learnings, scope=Scope(ScopeKind.SESSION, "s1"))
    cases = [
        (revoked, "LEARNING_NOT_ACTIVE"),
        (fact, "NOT_A_PROCEDURE"),
        (project, "NOT_WORKSPACE_SCOPE"),
        (session, "NOT_WORKSPACE_SCOPE"),
    ]
    for lid, reason in cases:
        with pytest.raises(FailedPrecondition) as err:
            svc.promote_procedure(A, lid, "name", "")
        assert err.value.reason == reason
    assert skill_rows(db) == 0


def test_superseded_procedure_cannot_be_promoted(learnings: LearningService, svc: SkillService) -> None:
    old = learning(learnings)
    c = learnings.create_candidate(A, CandidateDraft(kind=LearningKind.PROCEDURE, content="1. make release"))
    learnings.publish_candidate(A, c.id, supersedes_id=old)
    with pytest.raises(FailedPrecondition) as err:
        svc.promote_procedure(A, old, "name", "")
    assert err.value.reason == "LEARNING_NOT_ACTIVE"


def test_names_are_unique_per_tenant(db: Database, learnings: LearningService, svc: SkillService) -> None:
    first = svc.promote_procedure(A, learning(learnings), "release", "")
    with pytest.raises(AlreadyExists) as err:
        svc.promote_procedure(A, learning(learnings), "release", "")
    assert err.value.reason == "SKILL_NAME_TAKEN"
    assert err.value.metadata == {"skill_id": first.id}
    # Another tenant's namespace is its own.
    assert svc.promote_procedure(B, learning(learnings, B), "release", "").name == "release"
    assert skill_rows(db) == 2


def test_idempotent_promote(db: Database, learnings: LearningService, svc: SkillService) -> None:
    lid = learning(learnings)
    key = IdempotencyKey("PromoteProcedure", "promo-1", "fp-1")
    first = svc.promote_procedure(A, lid, "release", "", key=key)
    again = svc.promote_procedure(A, lid, "release", "", key=key)
    assert again == first
    assert skill_rows(db) == 1
    with pytest.raises(InvalidArgument) as err:
        svc.promote_procedure(A, lid, "other", "", key=IdempotencyKey("PromoteProcedure", "promo-1", "fp-2"))
    assert err.value.reason == "REQUEST_ID_REUSED"
    # Without the request_id the retry is a second promotion, refused by the name check.
    with pytest.raises(AlreadyExists):
        svc.promote_procedure(A, lid, "release", "")


def test_list_pages_and_filters(learnings: LearningService, svc: SkillService) -> None:
    lid = learning(learnings)
    other = learning(learnings, content="1. make lint")
    made = [svc.promote_procedure(A, lid, f"skill-{i}", "").id for i in range(4)]
    lint = svc.promote_procedure(A, other, "lint", "").id
    learnings.revoke_learning(A, lid, "replaced")
    seen, token = [], ""
    while True:
        page, token = svc.list_skills(A, state=None, page_size=2, page_token=token)
        assert len(page) <= 2
        seen += [s.id for s in page]
        if not token:
            break
    assert seen == [lint, *made[::-1]]
    drafts, _ = svc.list_skills(A, state=SkillState.DRAFT, page_size=0, page_token="")
    assert [s.id for s in drafts] == [lint]
    revoked, _ = svc.list_skills(A, state=SkillState.REVOKED, page_size=0, page_token="")
    assert [s.id for s in revoked] == made[::-1]
    with pytest.raises(InvalidArgument) as err:
        svc.list_skills(A, state=None, page_size=1_001, page_token="")
    assert [v.field for v in err.value.violations] == ["page_size"]


def test_other_tenants_skills_are_invisible(learnings: LearningService, svc: SkillService) -> None:
    skill = svc.promote_procedure(A, learning(learnings), "release", "")
    with pytest.raises(NotFound) as err:
        svc.get_skill(B, skill.id)
    assert err.value.reason == "SKILL_NOT_FOUND"
    assert svc.list_skills(B, state=None, page_size=0, page_token="") == ([], "")
    with pytest.raises(InvalidArgument):
        svc.get_skill(A, "")


def _activate(svc: SkillService, skill_id: str) -> None:
    svc.record_rollout_result(A, skill_id, RolloutStage.VERIFICATION, "run-v", True, "")
    svc.advance_skill(A, skill_id, SkillState.VERIFIED, "")
    svc.advance_skill(A, skill_id, SkillState.CANARY, "")
    svc.record_rollout_result(A, skill_id, RolloutStage.CANARY, "run-c", True, "")
    assert svc.advance_skill(A, skill_id, SkillState.ACTIVE, "").state is SkillState.ACTIVE


def test_rollback_restores_the_most_recent_activation_before_the_skill(
    learnings: LearningService, svc: SkillService
) -> None:
    """v1 and v2 were each active in turn; v3 came after both: its rollback restores v2, the
    one active last before it, and v2's rollback then restores v1."""
    made = []
    for n in range(3):
        skill = svc.promote_procedure(A, learning(learnings, content=f"{STEPS}\n{n}"), "cut-release", "")
        if n < 2:
            _activate(svc, skill.id)
            svc.revoke_skill(A, skill.id, "replaced")
        made.append(skill.id)
    v1, v2, v3 = made
    revoked, restored = svc.rollback_skill(A, v3, "v3 misbehaves")
    assert (revoked.id, revoked.state, restored.id, restored.state) == (
        v3,
        SkillState.REVOKED,
        v2,
        SkillState.ACTIVE,
    )
    revoked, restored = svc.rollback_skill(A, v2, "v2 too")
    assert (revoked.id, restored.id, restored.state) == (v2, v1, SkillState.ACTIVE)
    assert [s.id for s in svc.list_skills(A, state=SkillState.ACTIVE, page_size=0, page_token="")[0]] == [v1]
    with pytest.raises(FailedPrecondition, match="no skill named 'cut-release' was active before"):
        svc.rollback_skill(A, v1, "nothing before")


def test_definitions_that_differ_only_in_where_a_line_break_falls_have_their_own_fingerprints() -> None:
    a = definition_fingerprint("deploy", "Deploy\nstep one", "step two")
    b = definition_fingerprint("deploy", "Deploy", "step one\nstep two")
    c = definition_fingerprint("deploy", "", "Deploy\nstep one\nstep two")
    assert len({a, b, c}) == 3
    assert a == definition_fingerprint("deploy", "Deploy\nstep one", "step two")


def test_retried_changes_answer_with_what_the_first_call_left_not_what_came_after(
    learnings: LearningService, svc: SkillService
) -> None:
    """A retry returns the first result (README): a retried AdvanceSkill after a later
    advance, a retried RevokeSkill after a rollback brought the skill back, a retried
    RollbackSkill after the restored skill was revoked, and a retried publish after its
    learning was revoked each answered with the state as it is now."""
    v1 = svc.promote_procedure(A, learning(learnings, content=f"{STEPS}\n1"), "cut-release", "")
    _activate(svc, v1.id)
    v2 = svc.promote_procedure(A, learning(learnings, content=f"{STEPS}\n2"), "cut-release-2", "")
    svc.record_rollout_result(A, v2.id, RolloutStage.VERIFICATION, "run-v", True, "")
    advance = IdempotencyKey("AdvanceSkill", "adv-1", "fp")
    first = svc.advance_skill(A, v2.id, SkillState.VERIFIED, "", key=advance)
    svc.advance_skill(A, v2.id, SkillState.CANARY, "")
    assert svc.advance_skill(A, v2.id, SkillState.VERIFIED, "", key=advance) == first

    revoke = IdempotencyKey("RevokeSkill", "rev-1", "fp")
    revoked = svc.revoke_skill(A, v1.id, "replaced", key=revoke)
    v3 = svc.promote_procedure(A, learning(learnings, content=f"{STEPS}\n3"), "cut-release", "")
    rollback = IdempotencyKey("RollbackSkill", "rb-1", "fp")
    rolled = svc.rollback_skill(A, v3.id, "v3 misbehaves", key=rollback)
    assert rolled[1].id == v1.id and rolled[1].state is SkillState.ACTIVE
    assert svc.revoke_skill(A, v1.id, "replaced", key=revoke) == revoked  # not ACTIVE again
    svc.revoke_skill(A, v1.id, "gone for good")
    assert svc.rollback_skill(A, v3.id, "v3 misbehaves", key=rollback) == rolled

    c = learnings.create_candidate(A, CandidateDraft(kind=LearningKind.FACT, content="Tag every release."))
    publish = IdempotencyKey("PublishLearningCandidate", "pub-1", "fp")
    published = learnings.publish_candidate(A, c.id, key=publish)
    learnings.revoke_learning(A, published.learning.id, "wrong")
    assert learnings.publish_candidate(A, c.id, key=publish) == published
