"""DuckDB schema, applied as numbered migrations recorded in store_meta. A migration is SQL,
or a function of the connection where a change needs Python (it runs in the same
transaction as the version's record)."""

from __future__ import annotations

import json
from collections.abc import Callable

import duckdb

from mnemo_server.store import session_candidates
from mnemo_server.store.session_candidates import SessionMemoryRow


def _candidates_into_sessions(con: duckdb.DuckDBPyConnection) -> None:
    """8: each session's candidates packed into its own row (session_candidates says why),
    the relevance its end gave them into `continuity`; session_memories goes. Reads the
    table as migration 7 left it (a session's rows, its features as JSON); a session without
    candidate rows keeps NULL candidates, which read as none."""
    con.execute("DROP INDEX sessions_by_id")
    con.execute("ALTER TABLE sessions ADD COLUMN candidates BLOB")
    con.execute("ALTER TABLE sessions ADD COLUMN continuity VARCHAR")
    con.execute("CREATE INDEX sessions_by_id ON sessions (id)")
    # One connection throughout (a cursor is a transaction of its own, which would not see
    # the new columns), so the rows are read a chunk of sessions at a time, not streamed.
    keys = con.execute("SELECT DISTINCT tenant_id, session_id FROM session_memories ORDER BY 1, 2").fetchall()
    for start in range(0, len(keys), 256):
        chunk = keys[start : start + 256]
        wanted = set(chunk)
        rows = con.execute(
            "SELECT tenant_id, session_id, memory_id, candidate_ord, injected_rank, origin, "
            "baseline_score, baseline_rank, predictor_score, predictor_rank, final_score, tokens, "
            "features, relevance, relevance_source FROM session_memories "
            f"WHERE session_id IN ({', '.join('?' * len(chunk))}) "
            "ORDER BY tenant_id, session_id, candidate_ord",
            [sid for _, sid in chunk],
        ).fetchall()
        sessions: dict[tuple[str, str], list[SessionMemoryRow]] = {}
        for r in rows:
            if (r[0], r[1]) in wanted:
                sessions.setdefault((r[0], r[1]), []).append(
                    SessionMemoryRow(
                        memory_id=r[2],
                        candidate_ord=r[3],
                        injected_rank=r[4],
                        origin=r[5],
                        baseline_score=r[6],
                        baseline_rank=r[7],
                        predictor_score=r[8],
                        predictor_rank=r[9],
                        final_score=r[10],
                        tokens=r[11],
                        features=json.loads(r[12]),
                        relevance=r[13],
                        relevance_source=r[14],
                    )
                )
        for (tenant_id, session_id), members in sessions.items():
            judged = [
                [m.memory_id, m.relevance, m.relevance_source] for m in members if m.relevance is not None
            ]
            con.execute(
                "UPDATE sessions SET candidates = ?, continuity = ? WHERE tenant_id = ? AND id = ?",
                [
                    session_candidates.pack(members),
                    json.dumps(judged) if judged else None,
                    tenant_id,
                    session_id,
                ],
            )
    con.execute("DROP INDEX session_memories_by_session")
    con.execute("DROP TABLE session_memories")


MIGRATIONS: list[str | Callable[[duckdb.DuckDBPyConnection], None]] = [
    # 1: tenants, keys, memories, audit, idempotency
    """
    CREATE TABLE store_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
    CREATE SEQUENCE memory_seq START 1;
    CREATE TABLE tenants (
        id VARCHAR PRIMARY KEY,
        display_name VARCHAR NOT NULL,
        create_time_ns BIGINT NOT NULL
    );
    CREATE TABLE api_keys (
        id VARCHAR PRIMARY KEY,
        tenant_id VARCHAR NOT NULL,
        secret_hash VARCHAR NOT NULL,
        description VARCHAR NOT NULL,
        create_time_ns BIGINT NOT NULL,
        revoke_time_ns BIGINT
    );
    CREATE TABLE memories (
        tenant_id VARCHAR NOT NULL,
        id VARCHAR NOT NULL,
        seq BIGINT NOT NULL,
        external_id VARCHAR,
        scope_kind VARCHAR NOT NULL,
        scope_id VARCHAR NOT NULL,
        type VARCHAR NOT NULL,
        category VARCHAR NOT NULL,
        content VARCHAR NOT NULL,
        normalized_content VARCHAR NOT NULL,
        content_hash VARCHAR NOT NULL,
        importance FLOAT NOT NULL,
        confidence FLOAT NOT NULL,
        pinned BOOLEAN NOT NULL,
        source_who VARCHAR NOT NULL,
        source_why VARCHAR NOT NULL,
        source_run_id VARCHAR NOT NULL,
        source_session_id VARCHAR NOT NULL,
        metadata VARCHAR NOT NULL,
        event_time_ns BIGINT NOT NULL,
        create_time_ns BIGINT NOT NULL,
        update_time_ns BIGINT NOT NULL,
        delete_time_ns BIGINT,
        supersedes_id VARCHAR NOT NULL,
        superseded_by_id VARCHAR NOT NULL,
        revision BIGINT NOT NULL,
        embedding_model VARCHAR NOT NULL,
        -- what the LanceDB row currently reflects (NULL: nothing indexed yet)
        indexed_revision BIGINT,
        indexed_model VARCHAR,
        access_count BIGINT NOT NULL DEFAULT 0,
        last_access_ns BIGINT,
        PRIMARY KEY (tenant_id, id)
    );
    -- Point lookups: DuckDB only uses single-column ART indexes for them.
    CREATE INDEX memories_by_id ON memories (id);
    CREATE INDEX memories_by_hash ON memories (content_hash);
    CREATE INDEX memories_by_external_id ON memories (external_id);
    CREATE INDEX memories_by_seq ON memories (seq);
    CREATE TABLE memory_history (
        tenant_id VARCHAR NOT NULL,
        memory_id VARCHAR NOT NULL,
        action VARCHAR NOT NULL,
        actor VARCHAR NOT NULL,
        reason VARCHAR NOT NULL,
        details VARCHAR NOT NULL,
        time_ns BIGINT NOT NULL
    );
    CREATE TABLE idempotency (
        tenant_id VARCHAR NOT NULL,
        request_id VARCHAR NOT NULL,
        method VARCHAR NOT NULL,
        fingerprint VARCHAR NOT NULL,
        result VARCHAR NOT NULL,
        create_time_ns BIGINT NOT NULL,
        PRIMARY KEY (tenant_id, request_id)
    );
    """,
    # 2: learnings and skills
    """
    CREATE TABLE learning_candidates (
        tenant_id VARCHAR NOT NULL,
        id VARCHAR NOT NULL,
        scope_kind VARCHAR NOT NULL,
        scope_id VARCHAR NOT NULL,
        kind VARCHAR NOT NULL,
        content VARCHAR NOT NULL,
        confidence FLOAT NOT NULL,
        source VARCHAR NOT NULL,
        evidence_refs VARCHAR NOT NULL,
        origin VARCHAR NOT NULL,
        state VARCHAR NOT NULL,
        review_reason VARCHAR NOT NULL,
        learning_id VARCHAR NOT NULL,
        create_time_ns BIGINT NOT NULL,
        review_time_ns BIGINT,
        PRIMARY KEY (tenant_id, id)
    );
    CREATE TABLE learnings (
        tenant_id VARCHAR NOT NULL,
        id VARCHAR NOT NULL,
        scope_kind VARCHAR NOT NULL,
        scope_id VARCHAR NOT NULL,
        kind VARCHAR NOT NULL,
        content VARCHAR NOT NULL,
        confidence FLOAT NOT NULL,
        state VARCHAR NOT NULL,
        candidate_id VARCHAR NOT NULL,
        supersedes_id VARCHAR NOT NULL,
        superseded_by_id VARCHAR NOT NULL,
        revoke_reason VARCHAR NOT NULL,
        create_time_ns BIGINT NOT NULL,
        update_time_ns BIGINT NOT NULL,
        PRIMARY KEY (tenant_id, id)
    );
    CREATE TABLE skills (
        tenant_id VARCHAR NOT NULL,
        id VARCHAR NOT NULL,
        name VARCHAR NOT NULL,
        description VARCHAR NOT NULL,
        instructions VARCHAR NOT NULL,
        source_learning_id VARCHAR NOT NULL,
        state VARCHAR NOT NULL,
        definition_fingerprint VARCHAR NOT NULL,
        create_time_ns BIGINT NOT NULL,
        update_time_ns BIGINT NOT NULL,
        PRIMARY KEY (tenant_id, id)
    );
    CREATE TABLE lifecycle_events (
        tenant_id VARCHAR NOT NULL,
        subject_kind VARCHAR NOT NULL,
        subject_id VARCHAR NOT NULL,
        from_state VARCHAR NOT NULL,
        to_state VARCHAR NOT NULL,
        reason VARCHAR NOT NULL,
        time_ns BIGINT NOT NULL
    );
    """,
    # 3: sessions, what they injected, transcripts, and the outbox of training pairs
    """
    CREATE TABLE sessions (
        tenant_id VARCHAR NOT NULL,
        id VARCHAR NOT NULL,
        agent_id VARCHAR NOT NULL,
        persona_id VARCHAR NOT NULL,
        project_id VARCHAR NOT NULL,
        context VARCHAR NOT NULL,
        state VARCHAR NOT NULL,
        request_fingerprint VARCHAR NOT NULL,
        ranking_path VARCHAR NOT NULL,
        fallback_reason VARCHAR NOT NULL,
        model_version VARCHAR NOT NULL,
        predictor_weight FLOAT NOT NULL,
        sidecar_ms FLOAT NOT NULL,
        sidecar_deadline_ms INTEGER NOT NULL,
        took_ms FLOAT NOT NULL,
        token_budget INTEGER NOT NULL,
        tokens_used INTEGER NOT NULL,
        dropped_count INTEGER NOT NULL,
        feature_names VARCHAR NOT NULL,
        start_time_ns BIGINT NOT NULL,
        end_time_ns BIGINT,
        feedback_delivered BOOLEAN NOT NULL DEFAULT FALSE,
        PRIMARY KEY (tenant_id, id)
    );
    CREATE TABLE session_memories (
        tenant_id VARCHAR NOT NULL,
        session_id VARCHAR NOT NULL,
        memory_id VARCHAR NOT NULL,
        candidate_ord INTEGER NOT NULL,
        injected_rank INTEGER NOT NULL,
        origin VARCHAR NOT NULL,
        baseline_score FLOAT NOT NULL,
        baseline_rank INTEGER NOT NULL,
        predictor_score FLOAT NOT NULL,
        predictor_rank INTEGER NOT NULL,
        final_score FLOAT NOT NULL,
        tokens INTEGER NOT NULL,
        features VARCHAR NOT NULL,
        relevance FLOAT,
        relevance_source VARCHAR NOT NULL DEFAULT '',
        PRIMARY KEY (tenant_id, session_id, memory_id)
    );
    CREATE TABLE session_transcripts (
        tenant_id VARCHAR NOT NULL,
        session_id VARCHAR NOT NULL,
        content VARCHAR NOT NULL,
        create_time_ns BIGINT NOT NULL,
        PRIMARY KEY (tenant_id, session_id)
    );
    CREATE TABLE sidecar_outbox (
        tenant_id VARCHAR NOT NULL,
        session_id VARCHAR NOT NULL,
        payload BLOB NOT NULL,
        create_time_ns BIGINT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_ns BIGINT NOT NULL,
        delivered_ns BIGINT,
        last_error VARCHAR NOT NULL DEFAULT '',
        PRIMARY KEY (tenant_id, session_id)
    );
    """,
    # 4: the speaker of "Name: text" memories (a Recall signal), derived from the content
    r"""
    -- DuckDB cannot alter a table that has indexes: drop them, alter, and build them again.
    DROP INDEX memories_by_id;
    DROP INDEX memories_by_hash;
    DROP INDEX memories_by_external_id;
    DROP INDEX memories_by_seq;
    ALTER TABLE memories ADD COLUMN speaker VARCHAR NOT NULL DEFAULT '';
    UPDATE memories SET speaker =
        regexp_extract(content, '^([A-Z][\w''’.-]*(?: [A-Z][\w''’.-]*){0,2}):\s', 1);
    UPDATE memories SET speaker = '' WHERE speaker IN ('Fact', 'Preference', 'Decision', 'Note', 'Notes',
        'Todo', 'TODO', 'Summary', 'Question', 'Answer', 'Q', 'A', 'Update', 'Warning', 'Error', 'Info',
        'Action', 'Context', 'Task');
    CREATE INDEX memories_by_id ON memories (id);
    CREATE INDEX memories_by_hash ON memories (content_hash);
    CREATE INDEX memories_by_external_id ON memories (external_id);
    CREATE INDEX memories_by_seq ON memories (seq);
    """,
    # 5: single-column indexes for point lookups (DuckDB does not use a composite key for them)
    """
    CREATE INDEX idempotency_by_request_id ON idempotency (request_id);
    CREATE INDEX sessions_by_id ON sessions (id);
    CREATE INDEX session_memories_by_session ON session_memories (session_id);
    CREATE INDEX outbox_by_session ON sidecar_outbox (session_id);
    """,
    # 6: the seq index is not needed (seq grows with insertion, so zone maps prune range scans)
    # and every index costs each insert
    """
    DROP INDEX memories_by_seq;
    """,
    # 7: session_memories without its primary key. Its index on three strings cost a
    # StartSession's insert of 60 candidates ~15 % of its time inside the sessions write lock
    # (with 60k rows stored, insert and COMMIT: 2.68 against 2.27 ms alone, 4.2 against 3.6
    # with three busy processes beside it). The rows are unique by construction: a pool
    # holds each memory once, and a taken session id fails the sessions insert of the same
    # transaction. DuckDB cannot drop a key, so the table is copied. (Its columns repeat
    # migration 3's on purpose: a migration is history, and text shared between two would
    # let an edit of one rewrite the other.)
    """
    DROP INDEX session_memories_by_session;
    CREATE TABLE session_memories_v7 (
        tenant_id VARCHAR NOT NULL,
        session_id VARCHAR NOT NULL,
        memory_id VARCHAR NOT NULL,
        candidate_ord INTEGER NOT NULL,
        injected_rank INTEGER NOT NULL,
        origin VARCHAR NOT NULL,
        baseline_score FLOAT NOT NULL,
        baseline_rank INTEGER NOT NULL,
        predictor_score FLOAT NOT NULL,
        predictor_rank INTEGER NOT NULL,
        final_score FLOAT NOT NULL,
        tokens INTEGER NOT NULL,
        features VARCHAR NOT NULL,
        relevance FLOAT,
        relevance_source VARCHAR NOT NULL DEFAULT ''
    );
    INSERT INTO session_memories_v7 BY NAME SELECT * FROM session_memories;
    DROP TABLE session_memories;
    ALTER TABLE session_memories_v7 RENAME TO session_memories;
    CREATE INDEX session_memories_by_session ON session_memories (session_id);
    """,
    _candidates_into_sessions,
    # 9: a memory's history is read by its id (GetMemoryHistory, and whether a purged id has
    # any); without an index every read scanned the whole table: 3.4-3.8 ms at 100k entries,
    # growing with every create, update and delete. Inserts and checkpoints cost the same
    # within noise with it (one entry a transaction, at 100k: ~1.0 ms with COMMIT either way).
    """
    CREATE INDEX memory_history_by_memory ON memory_history (memory_id);
    """,
    # 10: skills' rollout evidence (verification and canary runs), read per skill
    """
    CREATE TABLE skill_rollout_results (
        tenant_id VARCHAR NOT NULL,
        id VARCHAR NOT NULL,
        skill_id VARCHAR NOT NULL,
        stage VARCHAR NOT NULL,
        run_id VARCHAR NOT NULL,
        succeeded BOOLEAN NOT NULL,
        definition_fingerprint VARCHAR NOT NULL,
        note VARCHAR NOT NULL,
        create_time_ns BIGINT NOT NULL
    );
    CREATE INDEX rollout_results_by_skill ON skill_rollout_results (skill_id);
    """,
]
