"""LearningService without gRPC: validation, the review workflow, supersession, revocation,
idempotency, paging and tenant isolation, against a real DuckDB file."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mnemo_server.config import LimitsConfig
from mnemo_server.errors import FailedPrecondition, InvalidArgument, NotFound
from mnemo_server.learning.model import (
    CandidateDraft,
    CandidateState,
    LearningKind,
    LearningState,
    Origin,
    SubjectKind,
)
from mnemo_server.learning.secrets_guard import find_secret_material
from mnemo_server.learning.service import LearningService
from mnemo_server.memory.model import IdempotencyKey, Scope, ScopeKind, Source
from mnemo_server.memory.paging import encode_token, query_fingerprint
from mnemo_server.memory.validation import Validator
from mnemo_server.skills.model import SkillState
from mnemo_server.skills.service import SkillService
from mnemo_server.store import learning_repo
from mnemo_server.store.database import Database

A, B = "tenant-a", "tenant-b"


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(tmp_path / "x.duckdb")
    yield database
    database.close()


@pytest.fixture
def svc(db: Database) -> LearningService:
    # A strictly increasing clock makes "newest first" deterministic.
    ticks = itertools.count(1_700_000_000_000_000_000, 1_000)
    return LearningService(db, Validator(LimitsConfig()), clock=lambda: next(ticks))


@pytest.fixture
def skills(db: Database, svc: LearningService) -> SkillService:
    return SkillService(db, svc.validator, clock=svc.clock)


def rows(db: Database, table: str) -> int:
    row = db.reader().execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def fact(
    content: str = "The staging cluster runs in eu-west-1.",
    *,
    kind: LearningKind | None = LearningKind.FACT,
    scope: Scope | None = None,
    confidence: float = 1.0,
    source: Source | None = None,
    evidence_refs: tuple[str, ...] = (),
) -> CandidateDraft:
    return CandidateDraft(
        kind=kind,
        content=content,
        scope=scope or Scope.workspace(),
        confidence=confidence,
        source=source or Source(),
        evidence_refs=evidence_refs,
    )


def published(svc: LearningService, tenant: str = A, draft: CandidateDraft | None = None) -> str:
    c = svc.create_candidate(tenant, draft or fact())
    return svc.publish_candidate(tenant, c.id).learning.id


# --- create ------------------------------------------------------------------------------


def test_create_defaults_and_records_event(db: Database, svc: LearningService) -> None:
    c = svc.create_candidate(A, fact(source=Source(who="agent-7", run_id="r1"), evidence_refs=("run:r1",)))
    assert c.state is CandidateState.PENDING
    assert c.origin is Origin.API
    assert c.scope == Scope(ScopeKind.WORKSPACE, "default")
    assert c.confidence == 1.0
    assert c.review_time_ns is None
    assert c.learning_id == ""
    assert c.source.who == "agent-7"
    assert c.evidence_refs == ("run:r1",)
    assert svc.get_candidate(A, c.id) == c
    [event] = learning_repo.events_for(db.reader(), A, c.id)
    assert (event.subject_kind, event.from_state, event.to_state) == (SubjectKind.CANDIDATE, "", "pending")


def test_workspace_scope_with_empty_id_means_default(svc: LearningService) -> None:
    c = svc.create_candidate(A, fact(scope=Scope(ScopeKind.WORKSPACE, "")))
    assert c.scope == Scope.workspace()


@pytest.mark.parametrize(
    ("draft", "field"),
    [
        (fact(kind=None), "candidate.kind"),
        (fact(""), "candidate.content"),
        (fact("   \n "), "candidate.content"),
        (fact("x" * 4_001), "candidate.content"),
        (fact("nul\x00byte"), "candidate.content"),
        (fact(confidence=1.01), "candidate.confidence"),
        (fact(confidence=-0.5), "candidate.confidence"),
        (fact(confidence=math.nan), "candidate.confidence"),
        (fact(evidence_refs=tuple(f"ref-{i}" for i in range(21))), "candidate.evidence_refs"),
        (fact(evidence_refs=("ok", "r" * 257)), "candidate.evidence_refs[1]"),
        (fact(evidence_refs=("",)), "candidate.evidence_refs[0]"),
        (fact(scope=Scope(ScopeKind.PROJECT, "")), "candidate.scope.id"),
        (fact(scope=Scope(ScopeKind.WORKSPACE, "other")), "candidate.scope.id"),
        (fact(source=Source(who="w" * 300)), "candidate.source.who"),
    ],
)
def test_invalid_drafts_name_the_field_and_write_nothing(
    db: Database, svc: LearningService, draft: CandidateDraft, field: str
) -> None:
    with pytest.raises(InvalidArgument) as err:
        svc.create_candidate(A, draft)
    assert [v.field for v in err.value.violations] == [field]
    assert rows(db, "learning_candidates") == 0
    assert rows(db, "lifecycle_events") == 0


def test_violations_are_reported_together(svc: LearningService) -> None:
    with pytest.raises(InvalidArgument) as err:
        svc.create_candidate(A, fact("", kind=None, confidence=2.0))
    assert {v.field for v in err.value.violations} == {
        "candidate.kind",
        "candidate.content",
        "candidate.confidence",
    }


def test_limits_are_inclusive(svc: LearningService) -> None:
    c = svc.create_candidate(
        A, fact("x" * 4_000, confidence=0.0, evidence_refs=tuple("r" * 255 + str(i % 10) for i in range(20)))
    )
    assert len(c.content) == 4_000
    assert len(c.evidence_refs) == 20
    assert c.confidence == 0.0


def test_run_summaries_are_daemon_only(db: Database, svc: LearningService) -> None:
    with pytest.raises(InvalidArgument) as err:
        svc.create_candidate(A, fact("Run r1 fixed the flaky test.", kind=LearningKind.RUN_SUMMARY))
    assert err.value.reason == "RUN_SUMMARY_NOT_ALLOWED"
    assert [v.field for v in err.value.violations] == ["candidate.kind"]
    assert rows(db, "learning_candidates") == 0
    made = svc.create_candidate(
        A, fact("Run r1 fixed the flaky test.", kind=LearningKind.RUN_SUMMARY), origin=Origin.DAEMON
    )
    assert made.kind is LearningKind.RUN_SUMMARY
    assert made.origin is Origin.DAEMON


SECRETS = [
    "The OpenAI key is sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c",
    "ci uses ghp_16C7e42F292c6912E7710c838347Ae178B4a",
    "AWS id AKIAIOSFODNN7EXAMPLE for the backup bucket",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
    "-----BEGIN PRIVATE KEY----- abc",
    "set api_key=abc123 in the env",
    "OPENAI_API_KEY=abc123",
    "header api-key: 1234",
    "send x-api-key: deadbeef",
    'config {"clientSecret": "s3cr3t"}',
    "secret_token=xyz",
    "db password=hunter2",
    "The admin Password: hunter2",
    "Use my personal access token for the registry",
    # Forms a probe got stored.
    "-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBF0\n-----END PGP PRIVATE KEY BLOCK-----",
    "Stripe live key sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "bot token xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy",
    "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "Authorization: Bearer 9f8e7d6c5b4a39281706",
    "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "aws_secret_access_key: wJalrXUtnFEMI",
    "SECRET_KEY=django-insecure-abc",
    "GITHUB_TOKEN=abc123",
    "token=abc123",
    "pass\u200bword: hunter2",
    "password\uff1a hunter2",
]


@pytest.mark.parametrize("content", SECRETS)
@pytest.mark.parametrize("kind", [LearningKind.FACT, LearningKind.PREFERENCE, LearningKind.DECISION])
def test_secret_material_is_refused_before_storage(
    db: Database, svc: LearningService, content: str, kind: LearningKind
) -> None:
    with pytest.raises(InvalidArgument) as err:
        svc.create_candidate(A, fact(content, kind=kind))
    assert err.value.reason == "SECRET_MATERIAL"
    assert [v.field for v in err.value.violations] == ["candidate.content"]
    # The error names what it looks like, never echoes it.
    assert "hunter2" not in err.value.message
    assert "abc123" not in err.value.message
    assert rows(db, "learning_candidates") == 0


def test_procedures_may_describe_credentials(svc: LearningService) -> None:
    c = svc.create_candidate(
        A, fact("export API_KEY=$(vault read -field=key secret/ci)", kind=LearningKind.PROCEDURE)
    )
    assert c.kind is LearningKind.PROCEDURE


# The secrets themselves (not mentions of where one goes): a procedure becomes a skill.
LITERAL_SECRETS = [
    s
    for s in SECRETS
    if s.startswith(
        ("The OpenAI", "ci uses", "AWS id", "-----", "Stripe", "bot token", "jwt", "Authorization")
    )
]


@pytest.mark.parametrize("content", LITERAL_SECRETS)
def test_procedures_holding_a_secret_itself_are_refused(
    db: Database, svc: LearningService, content: str
) -> None:
    assert len(LITERAL_SECRETS) == 10
    with pytest.raises(InvalidArgument) as err:
        svc.create_candidate(A, fact(f"export TOKEN; then: {content}", kind=LearningKind.PROCEDURE))
    assert err.value.reason == "SECRET_MATERIAL"
    assert rows(db, "learning_candidates") == 0


KEY = "sk-abcdefghijklmnopqrstuvwxyz123456"


def test_secrets_are_refused_in_every_text_shown_with_a_learning_or_skill(
    db: Database, svc: LearningService, skills: SkillService
) -> None:
    for draft, field in [
        (fact(evidence_refs=("run:r1", f"env {KEY}")), "candidate.evidence_refs[1]"),
        (fact(source=Source(why=f"pasted {KEY}")), "candidate.source.why"),
    ]:
        with pytest.raises(InvalidArgument) as err:
            svc.create_candidate(A, draft)
        assert (err.value.reason, [v.field for v in err.value.violations]) == ("SECRET_MATERIAL", [field])
    assert rows(db, "learning_candidates") == 0
    c = svc.create_candidate(A, fact("Run `make release` from a clean tree.", kind=LearningKind.PROCEDURE))
    with pytest.raises(InvalidArgument) as err:
        svc.publish_candidate(A, c.id, reason=f"verified with {KEY}")
    assert [v.field for v in err.value.violations] == ["reason"]
    learning = svc.publish_candidate(A, c.id, reason="verified by hand").learning.id
    with pytest.raises(InvalidArgument) as err:
        skills.promote_procedure(A, learning, "release", f"uses {KEY}")
    assert [v.field for v in err.value.violations] == ["description"]
    assert rows(db, "skills") == 0
    # Saying where a secret is kept stays possible outside a learning's content.
    assert (
        skills.promote_procedure(A, learning, "release", "needs the deploy key from vault").name == "release"
    )


@pytest.mark.parametrize(
    "content",
    [
        "The user prefers dark mode.",
        "Deploys use the task-force runner; see scikit-learn docs for the model.",
        "API keys are kept in Vault under secret/ci; never paste them.",
        "Password rotation happens every 90 days.",
        "The skeleton key metaphor is overused.",
        # Placeholders and prose, not credentials.
        "Send Authorization: Bearer $TOKEN with each call.",
        "Tokens expire after an hour; refresh them before the batch starts.",
        "The secret to fast builds is a warm cache.",
        "Tests pass: 95% of the suite is green.",
    ],
)
def test_ordinary_facts_pass_the_secret_guard(content: str) -> None:
    assert find_secret_material(content) is None


def test_idempotent_create(db: Database, svc: LearningService) -> None:
    key = IdempotencyKey("CreateLearningCandidate", "req-1", "fp-1")
    first = svc.create_candidate(A, fact(), key=key)
    again = svc.create_candidate(A, fact(), key=key)
    assert again == first
    assert rows(db, "learning_candidates") == 1
    with pytest.raises(InvalidArgument) as err:
        svc.create_candidate(
            A, fact("something else"), key=IdempotencyKey("CreateLearningCandidate", "req-1", "fp-2")
        )
    assert err.value.reason == "REQUEST_ID_REUSED"
    assert [v.field for v in err.value.violations] == ["request_id"]
    # The same request_id is another tenant's own business.
    other = svc.create_candidate(B, fact(), key=key)
    assert other.id != first.id
    assert rows(db, "learning_candidates") == 2


# --- publish / reject ----------------------------------------------------------------------


def test_publish_creates_active_learning(db: Database, svc: LearningService) -> None:
    scope = Scope(ScopeKind.PROJECT, "p1")
    c = svc.create_candidate(
        A, fact("Builds need Go 1.23.", kind=LearningKind.DECISION, scope=scope, confidence=0.75)
    )
    result = svc.publish_candidate(A, c.id, reason="checked the go.mod")
    lr, pc = result.learning, result.candidate
    assert lr.state is LearningState.ACTIVE
    assert lr.candidate_id == c.id
    assert (lr.scope, lr.kind, lr.content) == (scope, LearningKind.DECISION, "Builds need Go 1.23.")
    assert lr.confidence == pytest.approx(0.75)
    assert lr.supersedes_id == ""
    assert pc.state is CandidateState.PUBLISHED
    assert pc.learning_id == lr.id
    assert pc.review_reason == "checked the go.mod"
    assert pc.review_time_ns is not None
    assert svc.get_candidate(A, c.id) == pc
    assert svc.get_learning(A, lr.id) == lr
    transitions = [(e.from_state, e.to_state) for e in learning_repo.events_for(db.reader(), A, c.id)]
    assert transitions == [("", "pending"), ("pending", "published")]
    assert [(e.from_state, e.to_state) for e in learning_repo.events_for(db.reader(), A, lr.id)] == [
        ("", "active")
    ]


def test_only_pending_candidates_can_be_reviewed(svc: LearningService) -> None:
    done = svc.create_candidate(A, fact())
    svc.publish_candidate(A, done.id)
    dropped = svc.create_candidate(A, fact("Another fact."))
    svc.reject_candidate(A, dropped.id, "duplicate")
    for cid in (done.id, dropped.id):
        with pytest.raises(FailedPrecondition) as err:
            svc.publish_candidate(A, cid)
        assert err.value.reason == "CANDIDATE_NOT_PENDING"
        with pytest.raises(FailedPrecondition) as err:
            svc.reject_candidate(A, cid, "again")
        assert err.value.reason == "CANDIDATE_NOT_PENDING"


def test_reject(db: Database, svc: LearningService) -> None:
    c = svc.create_candidate(A, fact())
    for bad in ("", "   ", "r" * 1_001):
        with pytest.raises(InvalidArgument) as err:
            svc.reject_candidate(A, c.id, bad)
        assert [v.field for v in err.value.violations] == ["reason"]
    assert svc.get_candidate(A, c.id).state is CandidateState.PENDING
    rejected = svc.reject_candidate(A, c.id, "not true")
    assert rejected.state is CandidateState.REJECTED
    assert rejected.review_reason == "not true"
    assert rejected.learning_id == ""
    assert rejected.review_time_ns is not None
    assert rows(db, "learnings") == 0
    assert [e.to_state for e in learning_repo.events_for(db.reader(), A, c.id)] == ["pending", "rejected"]


def test_supersede(db: Database, svc: LearningService) -> None:
    old_id = published(svc, draft=fact("Deploys happen on Tuesdays.", kind=LearningKind.DECISION))
    c = svc.create_candidate(A, fact("Deploys happen on Thursdays.", kind=LearningKind.DECISION))
    new = svc.publish_candidate(A, c.id, supersedes_id=old_id).learning
    old = svc.get_learning(A, old_id)
    assert new.supersedes_id == old_id
    assert new.state is LearningState.ACTIVE
    assert old.state is LearningState.SUPERSEDED
    assert old.superseded_by_id == new.id
    assert [(e.from_state, e.to_state) for e in learning_repo.events_for(db.reader(), A, old_id)] == [
        ("", "active"),
        ("active", "superseded"),
    ]
    # A superseded learning cannot be superseded again.
    c2 = svc.create_candidate(A, fact("Deploys happen on Fridays.", kind=LearningKind.DECISION))
    with pytest.raises(FailedPrecondition) as err:
        svc.publish_candidate(A, c2.id, supersedes_id=old_id)
    assert err.value.reason == "LEARNING_NOT_ACTIVE"


@pytest.mark.parametrize(
    "other",
    [
        fact("Deploys happen on Tuesdays.", kind=LearningKind.FACT),  # other kind
        fact("Deploys happen on Tuesdays.", kind=LearningKind.DECISION, scope=Scope(ScopeKind.PROJECT, "p")),
    ],
)
def test_supersede_needs_same_scope_and_kind(
    db: Database, svc: LearningService, other: CandidateDraft
) -> None:
    old_id = published(svc, draft=fact("Deploys happen on Mondays.", kind=LearningKind.DECISION))
    c = svc.create_candidate(A, other)
    with pytest.raises(FailedPrecondition) as err:
        svc.publish_candidate(A, c.id, supersedes_id=old_id)
    assert err.value.reason == "SUPERSEDES_MISMATCH"
    # Nothing moved: the transaction is all or nothing.
    assert svc.get_candidate(A, c.id).state is CandidateState.PENDING
    assert svc.get_learning(A, old_id).state is LearningState.ACTIVE
    assert rows(db, "learnings") == 1


def test_supersede_target_must_exist_in_this_tenant(db: Database, svc: LearningService) -> None:
    theirs = published(svc, tenant=B)
    c = svc.create_candidate(A, fact())
    for missing in ("no-such-learning", theirs):
        with pytest.raises(NotFound) as err:
            svc.publish_candidate(A, c.id, supersedes_id=missing)
        assert err.value.reason == "LEARNING_NOT_FOUND"
    assert svc.get_candidate(A, c.id).state is CandidateState.PENDING
    assert svc.get_learning(B, theirs).state is LearningState.ACTIVE


def test_publish_is_atomic(db: Database, svc: LearningService, monkeypatch: pytest.MonkeyPatch) -> None:
    c = svc.create_candidate(A, fact())

    def boom(*_args: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(learning_repo, "record_events", boom)
    with pytest.raises(RuntimeError):
        svc.publish_candidate(A, c.id)
    assert rows(db, "learnings") == 0
    assert svc.get_candidate(A, c.id).state is CandidateState.PENDING


def test_idempotent_publish(db: Database, svc: LearningService) -> None:
    c = svc.create_candidate(A, fact())
    key = IdempotencyKey("PublishLearningCandidate", "pub-1", "fp")
    first = svc.publish_candidate(A, c.id, key=key)
    again = svc.publish_candidate(A, c.id, key=key)
    assert again == first
    assert rows(db, "learnings") == 1
    with pytest.raises(FailedPrecondition):  # without the request_id it is a second review
        svc.publish_candidate(A, c.id)


def test_missing_ids_are_invalid(svc: LearningService) -> None:
    calls: list[Callable[[], object]] = [
        lambda: svc.get_candidate(A, ""),
        lambda: svc.publish_candidate(A, ""),
        lambda: svc.reject_candidate(A, "", "r"),
        lambda: svc.get_learning(A, ""),
        lambda: svc.revoke_learning(A, "", "r"),
    ]
    for call in calls:
        with pytest.raises(InvalidArgument) as err:
            call()
        assert [v.field for v in err.value.violations] == ["id"]


# --- revoke ----------------------------------------------------------------------------------


def test_revoke_cascades_to_skills(db: Database, svc: LearningService, skills: SkillService) -> None:
    proc = published(svc, draft=fact("Run `make release` from a clean tree.", kind=LearningKind.PROCEDURE))
    other = published(svc, draft=fact("Run `make lint` before pushing.", kind=LearningKind.PROCEDURE))
    s1 = skills.promote_procedure(A, proc, "release", "")
    s2 = skills.promote_procedure(A, proc, "release-again", "")
    kept = skills.promote_procedure(A, other, "lint", "")
    for bad in ("", "x" * 1_001):
        with pytest.raises(InvalidArgument) as err:
            svc.revoke_learning(A, proc, bad)
        assert [v.field for v in err.value.violations] == ["reason"]
    revoked = svc.revoke_learning(A, proc, "the release process changed")
    assert revoked.state is LearningState.REVOKED
    assert revoked.revoke_reason == "the release process changed"
    assert revoked.update_time_ns > revoked.create_time_ns
    assert skills.get_skill(A, s1.id).state is SkillState.REVOKED
    assert skills.get_skill(A, s2.id).state is SkillState.REVOKED
    assert skills.get_skill(A, kept.id).state is SkillState.DRAFT
    [_, event] = learning_repo.events_for(db.reader(), A, s1.id)
    assert (event.subject_kind, event.from_state, event.to_state) == (SubjectKind.SKILL, "draft", "revoked")
    assert proc in event.reason
    with pytest.raises(FailedPrecondition) as not_active:
        svc.revoke_learning(A, proc, "again")
    assert not_active.value.reason == "LEARNING_NOT_ACTIVE"


def test_superseded_learnings_cannot_be_revoked(svc: LearningService) -> None:
    old = published(svc)
    c = svc.create_candidate(A, fact("The staging cluster moved to eu-central-1."))
    svc.publish_candidate(A, c.id, supersedes_id=old)
    with pytest.raises(FailedPrecondition) as err:
        svc.revoke_learning(A, old, "wrong")
    assert err.value.reason == "LEARNING_NOT_ACTIVE"


# --- lists ------------------------------------------------------------------------------------


def test_list_candidates_pages_newest_first(svc: LearningService) -> None:
    made = [svc.create_candidate(A, fact(f"Fact number {i}.")).id for i in range(7)]
    svc.reject_candidate(A, made[0], "no")
    seen, token, pages = [], "", 0
    while True:
        page, token = svc.list_candidates(A, state=None, page_size=3, page_token=token)
        seen += [c.id for c in page]
        pages += 1
        if not token:
            break
    assert seen == made[::-1]
    assert pages == 3
    pending, _ = svc.list_candidates(A, state=CandidateState.PENDING, page_size=0, page_token="")
    assert [c.id for c in pending] == made[:0:-1]
    _, token = svc.list_candidates(A, state=None, page_size=2, page_token="")
    with pytest.raises(InvalidArgument) as err:  # a token belongs to its filter
        svc.list_candidates(A, state=CandidateState.PENDING, page_size=2, page_token=token)
    assert [v.field for v in err.value.violations] == ["page_token"]
    # Garbage, and a well-formed token whose position is not one this server writes.
    fingerprint = query_fingerprint("learning_candidates", A, None)
    bad_tokens = ("garbage!", encode_token("not-a-position", fingerprint), encode_token([1, 2], fingerprint))
    for bad_token in bad_tokens:
        with pytest.raises(InvalidArgument):
            svc.list_candidates(A, state=None, page_size=2, page_token=bad_token)
    for size in (-1, 1_001):
        with pytest.raises(InvalidArgument) as err:
            svc.list_candidates(A, state=None, page_size=size, page_token="")
        assert [v.field for v in err.value.violations] == ["page_size"]


def test_list_learnings_filters(svc: LearningService) -> None:
    f1 = published(svc, draft=fact("Fact one."))
    d1 = published(svc, draft=fact("Decision one.", kind=LearningKind.DECISION))
    f2 = published(svc, draft=fact("Fact two."))
    svc.revoke_learning(A, f1, "wrong")
    everything, _ = svc.list_learnings(A, state=None, kind=None, page_size=0, page_token="")
    assert [lr.id for lr in everything] == [f2, d1, f1]
    facts, _ = svc.list_learnings(A, state=None, kind=LearningKind.FACT, page_size=0, page_token="")
    assert [lr.id for lr in facts] == [f2, f1]
    active_facts, _ = svc.list_learnings(
        A, state=LearningState.ACTIVE, kind=LearningKind.FACT, page_size=0, page_token=""
    )
    assert [lr.id for lr in active_facts] == [f2]
    first, token = svc.list_learnings(A, state=None, kind=None, page_size=2, page_token="")
    rest, last = svc.list_learnings(A, state=None, kind=None, page_size=2, page_token=token)
    assert [lr.id for lr in first + rest] == [f2, d1, f1]
    assert last == ""


# --- tenants ------------------------------------------------------------------------------------


def test_other_tenants_rows_are_invisible(svc: LearningService) -> None:
    c = svc.create_candidate(A, fact())
    lid = published(svc)
    candidate_calls: list[Callable[[], object]] = [
        lambda: svc.get_candidate(B, c.id),
        lambda: svc.publish_candidate(B, c.id),
        lambda: svc.reject_candidate(B, c.id, "mine now"),
    ]
    learning_calls: list[Callable[[], object]] = [
        lambda: svc.get_learning(B, lid),
        lambda: svc.revoke_learning(B, lid, "mine now"),
    ]
    for call in candidate_calls:
        with pytest.raises(NotFound) as err:
            call()
        assert err.value.reason == "LEARNING_CANDIDATE_NOT_FOUND"
    for call in learning_calls:
        with pytest.raises(NotFound) as err:
            call()
        assert err.value.reason == "LEARNING_NOT_FOUND"
    assert svc.list_candidates(B, state=None, page_size=0, page_token="") == ([], "")
    assert svc.list_learnings(B, state=None, kind=None, page_size=0, page_token="") == ([], "")
    assert svc.get_candidate(A, c.id).state is CandidateState.PENDING
    assert svc.get_learning(A, lid).state is LearningState.ACTIVE
