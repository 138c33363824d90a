"""SQL for the skills table. Functions take a cursor so callers decide the transaction;
every statement is filtered by tenant_id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mnemo_server.skills.model import RolloutResult, RolloutStage, Skill, SkillState
from mnemo_server.store.database import Cursor, fetch_one
from mnemo_server.store.learning_repo import PagePosition, newest_first_page

_COLUMNS = (
    "tenant_id, id, name, description, instructions, source_learning_id, state, definition_fingerprint, "
    "create_time_ns, update_time_ns"
)

_COLUMNS_OF_S = ", ".join(f"s.{c.strip()}" for c in _COLUMNS.split(","))  # in a join, as "skills s"


def _decode(row: Sequence[Any]) -> Skill:
    (
        tenant_id,
        sid,
        name,
        description,
        instructions,
        source_learning_id,
        state,
        fingerprint,
        create_ns,
        update_ns,
    ) = row
    return Skill(
        id=sid,
        tenant_id=tenant_id,
        name=name,
        description=description,
        instructions=instructions,
        source_learning_id=source_learning_id,
        state=SkillState(state),
        definition_fingerprint=fingerprint,
        create_time_ns=create_ns,
        update_time_ns=update_ns,
    )


def insert_skill(cur: Cursor, s: Skill) -> None:
    cur.execute(
        f"INSERT INTO skills ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            s.tenant_id,
            s.id,
            s.name,
            s.description,
            s.instructions,
            s.source_learning_id,
            s.state.value,
            s.definition_fingerprint,
            s.create_time_ns,
            s.update_time_ns,
        ],
    )


def get_skill(cur: Cursor, tenant_id: str, skill_id: str) -> Skill | None:
    row = fetch_one(
        cur, f"SELECT {_COLUMNS} FROM skills WHERE tenant_id = ? AND id = ?", [tenant_id, skill_id]
    )
    return None if row is None else _decode(row)


def unrevoked_skill_named(cur: Cursor, tenant_id: str, name: str) -> Skill | None:
    """The skill holding a name: revoked skills hold none, so that a procedure revoked or
    superseded can be promoted again under its name (the seed's "revoking/re-promoting")."""
    row = fetch_one(
        cur,
        f"SELECT {_COLUMNS} FROM skills WHERE tenant_id = ? AND name = ? AND state <> ? LIMIT 1",
        [tenant_id, name, SkillState.REVOKED.value],
    )
    return None if row is None else _decode(row)


def list_skills(
    cur: Cursor, tenant_id: str, state: SkillState | None, before: PagePosition | None, limit: int
) -> list[Skill]:
    where, params = ["tenant_id = ?"], [tenant_id]
    if state is not None:
        where.append("state = ?")
        params.append(state.value)
    tail, values = newest_first_page(where, params, before, limit)
    rows = cur.execute(f"SELECT {_COLUMNS} FROM skills {tail}", values).fetchall()
    return [_decode(r) for r in rows]


def unrevoked_skills_from(cur: Cursor, tenant_id: str, learning_id: str) -> list[Skill]:
    rows = cur.execute(
        f"SELECT {_COLUMNS} FROM skills WHERE tenant_id = ? AND source_learning_id = ? AND state <> ? "
        "ORDER BY create_time_ns, id",
        [tenant_id, learning_id, SkillState.REVOKED.value],
    ).fetchall()
    return [_decode(r) for r in rows]


def last_active_before(cur: Cursor, tenant_id: str, skill: Skill) -> Skill | None:
    """The skill of `skill`'s name that most recently became active (a lifecycle event to
    active) before `skill` was promoted: what a rollback of `skill` returns to. Ordered by
    the events' insertion (the table is only appended to), not their times: a clock set
    back must not reorder them."""
    row = fetch_one(
        cur,
        f"SELECT {_COLUMNS_OF_S} FROM skills s "
        "JOIN lifecycle_events e ON e.tenant_id = s.tenant_id AND e.subject_id = s.id "
        "WHERE s.tenant_id = ? AND s.name = ? AND s.id <> ? AND e.subject_kind = 'skill' AND e.to_state = ? "
        "AND e.rowid < (SELECT min(rowid) FROM lifecycle_events WHERE tenant_id = ? AND subject_id = ?) "
        "ORDER BY e.rowid DESC LIMIT 1",
        [tenant_id, skill.name, skill.id, SkillState.ACTIVE.value, tenant_id, skill.id],
    )
    return None if row is None else _decode(row)


def set_state(cur: Cursor, tenant_id: str, skill_ids: Sequence[str], state: SkillState, now_ns: int) -> None:
    if skill_ids:
        cur.execute(
            "UPDATE skills SET state = ?, update_time_ns = ? WHERE tenant_id = ? AND id = ANY(?)",
            [state.value, now_ns, tenant_id, list(skill_ids)],
        )


# --- rollout results ---------------------------------------------------------------------

_RESULT_COLUMNS = (
    "tenant_id, id, skill_id, stage, run_id, succeeded, definition_fingerprint, note, create_time_ns"
)


def insert_result(cur: Cursor, r: RolloutResult) -> None:
    cur.execute(
        f"INSERT INTO skill_rollout_results ({_RESULT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            r.tenant_id,
            r.id,
            r.skill_id,
            r.stage.value,
            r.run_id,
            r.succeeded,
            r.definition_fingerprint,
            r.note,
            r.create_time_ns,
        ],
    )


def _decode_result(row: Sequence[Any]) -> RolloutResult:
    tenant_id, rid, skill_id, stage, run_id, succeeded, fingerprint, note, create_ns = row
    return RolloutResult(
        id=rid,
        tenant_id=tenant_id,
        skill_id=skill_id,
        stage=RolloutStage(stage),
        run_id=run_id,
        succeeded=bool(succeeded),
        definition_fingerprint=fingerprint,
        note=note,
        create_time_ns=create_ns,
    )


def get_result(cur: Cursor, tenant_id: str, result_id: str) -> RolloutResult | None:
    row = fetch_one(
        cur,
        f"SELECT {_RESULT_COLUMNS} FROM skill_rollout_results WHERE tenant_id = ? AND id = ?",
        [tenant_id, result_id],
    )
    return None if row is None else _decode_result(row)


def list_results(
    cur: Cursor, tenant_id: str, skill_id: str, before: PagePosition | None, limit: int
) -> list[RolloutResult]:
    tail, values = newest_first_page(["tenant_id = ?", "skill_id = ?"], [tenant_id, skill_id], before, limit)
    rows = cur.execute(f"SELECT {_RESULT_COLUMNS} FROM skill_rollout_results {tail}", values).fetchall()
    return [_decode_result(r) for r in rows]


def evidence(
    cur: Cursor, tenant_id: str, skill_id: str, stage: RolloutStage, fingerprint: str
) -> tuple[int, int]:
    """(succeeded, failed) results of `stage` for the definition `fingerprint`."""
    row = fetch_one(
        cur,
        "SELECT count(*) FILTER (WHERE succeeded), count(*) FILTER (WHERE NOT succeeded) "
        "FROM skill_rollout_results WHERE tenant_id = ? AND skill_id = ? AND stage = ? "
        "AND definition_fingerprint = ?",
        [tenant_id, skill_id, stage.value, fingerprint],
    )
    assert row is not None  # an aggregate always answers one row
    return int(row[0]), int(row[1])
