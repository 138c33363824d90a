"""Durable store of session feedback (SQLite, WAL, synchronous=FULL: a submission that was
acknowledged survives kill -9). Idempotent by (tenant, session_id)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path

from mnemo_server.errors import FailedPrecondition
from mnemo_sidecar.learning.model import (
    Candidate,
    FeedbackCandidate,
    FeedbackSession,
    ModelKind,
    SessionMark,
    TrainingOutcome,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    tenant TEXT NOT NULL, session_id TEXT NOT NULL, query TEXT NOT NULL, feature_names TEXT NOT NULL,
    end_time_ns INTEGER NOT NULL, received_ns INTEGER NOT NULL, seq INTEGER NOT NULL,
    baseline_ndcg REAL, predictor_ndcg REAL, win REAL,
    PRIMARY KEY (tenant, session_id));
CREATE TABLE IF NOT EXISTS candidates (
    tenant TEXT NOT NULL, session_id TEXT NOT NULL, ord INTEGER NOT NULL, cand_id TEXT NOT NULL,
    text TEXT NOT NULL, baseline_score REAL NOT NULL, features BLOB NOT NULL, relevance REAL NOT NULL,
    baseline_rank INTEGER NOT NULL, predictor_rank INTEGER NOT NULL,
    PRIMARY KEY (tenant, session_id, ord));
CREATE INDEX IF NOT EXISTS sessions_by_seq ON sessions (tenant, seq);
-- The health window reads the newest decided sessions; most are not (ties, cold start), and
-- through sessions_by_seq that read walked every undecided one: 3.9 ms a Score at 5,000.
CREATE INDEX IF NOT EXISTS decided_by_seq ON sessions (tenant, seq) WHERE win IS NOT NULL;
CREATE TABLE IF NOT EXISTS health (
    tenant TEXT PRIMARY KEY, win_ema REAL NOT NULL, sessions_since_promotion INTEGER NOT NULL,
    sessions_since_training INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS outcomes (
    tenant TEXT NOT NULL, model TEXT NOT NULL, version TEXT NOT NULL, promoted INTEGER NOT NULL,
    heldout INTEGER NOT NULL, candidate_ndcg REAL NOT NULL, current_ndcg REAL NOT NULL,
    baseline_ndcg REAL NOT NULL, reason TEXT NOT NULL, train_seconds REAL NOT NULL,
    train_pairs INTEGER NOT NULL, finish_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS fine_tunes (
    tenant TEXT PRIMARY KEY, stored INTEGER NOT NULL, last_seq INTEGER NOT NULL);
"""


# The file's format, in SQLite's user_version: a sidecar refuses a file a newer one wrote (as
# the server refuses a newer schema) rather than read it wrongly after a downgrade. Raise it
# with any change an older sidecar would misread; adding tables alone was harmless so far.
FORMAT = 1


_STORED = "SELECT 1 FROM sessions WHERE tenant = ? AND session_id = ?"


class PairStore:
    def __init__(self, path: Path, max_sessions: int = 0):
        """max_sessions > 0: a tenant keeps its newest that many sessions (and their pairs).
        Every training run reads all of a tenant's sessions into memory, so without a cap
        the file, the run's memory and its time grew with every session ever submitted."""
        self.max_sessions = max_sessions
        self._path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        try:
            self._open(path)
        except sqlite3.DatabaseError as exc:  # not a database, damaged: one line, not a traceback
            self._conn.close()
            raise FailedPrecondition(
                f"{path} cannot be opened as the sidecar's pair store: {exc}; move it aside to "
                "start with no sessions (the server sends none again)",
                reason="BAD_DATA_DIR",
            ) from None
        self._lock = threading.Lock()
        # Per tenant (stored sessions, stored pairs): counted once, then kept by add_session.
        self._counts: dict[str, tuple[int, int]] = {}

    def _open(self, path: Path) -> None:
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        found = self._conn.execute("PRAGMA user_version").fetchall()[0][0]
        if found > FORMAT:
            self._conn.close()
            raise FailedPrecondition(
                f"{path} is format {found}, newer than this sidecar's {FORMAT}: a newer mnemo-sidecar "
                "wrote it (downgrade refused)",
                reason="BAD_DATA_DIR",
            )
        self._conn.executescript(_SCHEMA)
        self._conn.execute(f"PRAGMA user_version = {FORMAT}")

    @property
    def path(self) -> Path:
        return self._path

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # --- sessions --------------------------------------------------------------------

    def add_session(
        self,
        tenant: str,
        s: FeedbackSession,
        baseline_ndcg: float | None,
        predictor_ndcg: float | None,
        win: float | None,
    ) -> bool:
        """False when the session was already stored (nothing written)."""
        with self._lock:
            cur = self._conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                exists = cur.execute(_STORED, (tenant, s.session_id)).fetchone()
                if exists:
                    cur.execute("ROLLBACK")
                    return False
                seq = cur.execute(
                    "SELECT COALESCE(MAX(seq), 0) + 1 FROM sessions WHERE tenant = ?", (tenant,)
                ).fetchone()[0]
                cur.execute(
                    "INSERT INTO sessions VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (
                        tenant,
                        s.session_id,
                        s.query,
                        json.dumps(list(s.feature_names)),
                        s.end_time_ns,
                        time.time_ns(),
                        seq,
                        baseline_ndcg,
                        predictor_ndcg,
                        win,
                    ),
                )
                cur.executemany(
                    "INSERT INTO candidates VALUES (?,?,?,?,?,?,?,?,?,?)",
                    [
                        (
                            tenant,
                            s.session_id,
                            i,
                            c.candidate.id,
                            c.candidate.text,
                            c.candidate.baseline_score,
                            array("f", c.candidate.features).tobytes(),
                            c.relevance,
                            c.baseline_rank,
                            c.predictor_rank,
                        )
                        for i, c in enumerate(s.candidates)
                    ],
                )
                evicted_sessions = evicted_pairs = 0
                if 0 < self.max_sessions < seq:
                    # seq counts the tenant's sessions one by one: those up to `oldest` are
                    # the ones past the cap (an evicted session sent again is stored anew).
                    oldest = seq - self.max_sessions
                    evicted_pairs = cur.execute(
                        "DELETE FROM candidates WHERE tenant = ? AND session_id IN "
                        "(SELECT session_id FROM sessions WHERE tenant = ? AND seq <= ?)",
                        (tenant, tenant, oldest),
                    ).rowcount
                    evicted_sessions = cur.execute(
                        "DELETE FROM sessions WHERE tenant = ? AND seq <= ?", (tenant, oldest)
                    ).rowcount
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            if tenant in self._counts:
                n_sessions, n_pairs = self._counts[tenant]
                self._counts[tenant] = (
                    n_sessions + 1 - evicted_sessions,
                    n_pairs + len(s.candidates) - evicted_pairs,
                )
            return True

    def has_session(self, tenant: str, session_id: str) -> bool:
        with self._lock:
            found = self._conn.execute(_STORED, (tenant, session_id)).fetchone()
        return found is not None

    def sessions(self, tenant: str) -> list[FeedbackSession]:
        """All stored sessions, oldest first."""
        with self._lock:
            heads = self._conn.execute(
                "SELECT session_id, query, feature_names, end_time_ns FROM sessions WHERE tenant = ? "
                "ORDER BY seq",
                (tenant,),
            ).fetchall()
            rows = self._conn.execute(
                "SELECT session_id, cand_id, text, baseline_score, features, relevance, baseline_rank, "
                "predictor_rank FROM candidates WHERE tenant = ? ORDER BY session_id, ord",
                (tenant,),
            ).fetchall()
        by_session: dict[str, list[FeedbackCandidate]] = {}
        for sid, cid, text, base, feats, rel, brank, prank in rows:
            by_session.setdefault(sid, []).append(
                FeedbackCandidate(Candidate(cid, text, base, tuple(array("f", feats))), rel, brank, prank)
            )
        return [
            FeedbackSession(sid, q, tuple(json.loads(names)), tuple(by_session.get(sid, ())), end)
            for sid, q, names, end in heads
        ]

    def counts(self, tenant: str) -> tuple[int, int]:
        """(stored sessions, stored pairs). Counted once per tenant, then kept up to date by
        add_session, the only writer: at the cap (20,000 sessions of 70 candidates) counting
        a tenant's pairs took ~87 ms under the store's lock, and every Score (through the
        health snapshot) and every submission counted them, so Score could not answer in
        StartSession's deadline however small its model."""
        with self._lock:
            known = self._counts.get(tenant)
            if known is None:
                n_sessions = self._conn.execute(
                    "SELECT count(*) FROM sessions WHERE tenant = ?", (tenant,)
                ).fetchone()[0]
                n_pairs = self._conn.execute(
                    "SELECT count(*) FROM candidates WHERE tenant = ?", (tenant,)
                ).fetchone()[0]
                known = self._counts[tenant] = (int(n_sessions), int(n_pairs))
            return known

    def recent_wins(
        self, tenant: str, window: int, among_newest: int = 2**62
    ) -> list[tuple[float, float | None, float | None]]:
        """(win, predictor_ndcg, baseline_ndcg) of the newest `window` decided sessions among
        the tenant's newest `among_newest` sessions (seq counts them one by one; all of them
        by default)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT win, predictor_ndcg, baseline_ndcg FROM sessions WHERE tenant = ? "
                "AND win IS NOT NULL AND seq > "
                "(SELECT COALESCE(MAX(seq), 0) FROM sessions WHERE tenant = ?) - ? "
                "ORDER BY seq DESC LIMIT ?",
                (tenant, tenant, among_newest, window),
            ).fetchall()
        return [(float(w), p, b) for w, p, b in rows]

    def tenants(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT DISTINCT tenant FROM sessions").fetchall()]

    # --- health ----------------------------------------------------------------------

    def health_state(self, tenant: str) -> tuple[float, int, int]:
        """(win_ema, sessions since the last promotion, sessions since the last training)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT win_ema, sessions_since_promotion, sessions_since_training FROM health "
                "WHERE tenant = ?",
                (tenant,),
            ).fetchone()
        return (0.5, 0, 0) if row is None else (float(row[0]), int(row[1]), int(row[2]))

    def change_health_state(
        self, tenant: str, change: Callable[[float, int, int], tuple[float, int, int]]
    ) -> None:
        """Replace the tenant's health state with change(current state), read and written in
        one transaction: sessions stored at once, and a training process writing the same
        row, would otherwise each write back what they read and lose the others' updates
        (probe: 8 callers storing 60 sessions applied ~45 of them to the EMA)."""
        with self._lock:
            cur = self._conn.cursor()
            cur.execute("BEGIN IMMEDIATE")  # the file's write lock: other processes wait
            try:
                row = cur.execute(
                    "SELECT win_ema, sessions_since_promotion, sessions_since_training FROM health "
                    "WHERE tenant = ?",
                    (tenant,),
                ).fetchone()
                state = (0.5, 0, 0) if row is None else (float(row[0]), int(row[1]), int(row[2]))
                cur.execute("INSERT OR REPLACE INTO health VALUES (?, ?, ?, ?)", (tenant, *change(*state)))
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    # --- the cross-encoder's fine-tunes ----------------------------------------------

    def session_mark(self, tenant: str) -> SessionMark:
        """How many sessions the tenant has stored, and the sequence number of the newest."""
        stored = self.counts(tenant)[0]
        with self._lock:
            last_seq = self._conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM sessions WHERE tenant = ?", (tenant,)
            ).fetchone()[0]
        # A session stored between the two reads is in last_seq but not in stored: the next
        # fine-tune then comes a session off its schedule, which is harmless, and the count
        # stays the one add_session keeps rather than a count over the table.
        return SessionMark(stored, int(last_seq))

    def record_fine_tune(self, tenant: str, mark: SessionMark) -> None:
        """The tenant's cross-encoder was fine-tuned on the sessions stored at `mark`."""
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO fine_tunes VALUES (?, ?, ?)", (tenant, mark.stored, mark.last_seq)
            )

    def last_fine_tune(self, tenant: str) -> SessionMark | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT stored, last_seq FROM fine_tunes WHERE tenant = ?", (tenant,)
            ).fetchone()
        return None if row is None else SessionMark(int(row[0]), int(row[1]))

    # --- outcomes --------------------------------------------------------------------

    def add_outcome(self, tenant: str, o: TrainingOutcome) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT INTO outcomes VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    tenant,
                    o.model.value,
                    o.candidate_version,
                    int(o.promoted),
                    o.heldout_sessions,
                    o.candidate_ndcg,
                    o.current_ndcg,
                    o.baseline_ndcg,
                    o.reason,
                    o.train_seconds,
                    o.train_pairs,
                    o.finish_time_ns,
                ),
            )

    def outcomes(self, tenant: str, limit: int = 10) -> list[TrainingOutcome]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT model, version, promoted, heldout, candidate_ndcg, current_ndcg, baseline_ndcg, "
                "reason, train_seconds, train_pairs, finish_ns FROM outcomes WHERE tenant = ? "
                "ORDER BY finish_ns DESC LIMIT ?",
                (tenant, limit),
            ).fetchall()
        return [
            TrainingOutcome(ModelKind(m), v, bool(p), h, cn, cur, bn, r, ts, tp, fin)
            for m, v, p, h, cn, cur, bn, r, ts, tp, fin in rows
        ]


def split_heldout(
    sessions: Sequence[FeedbackSession],
    fraction: float,
    minimum: int,
) -> tuple[list[FeedbackSession], list[FeedbackSession]]:
    """(train, held back): the newest sessions with at least one positive are held back."""
    useful = [s for s in sessions if s.positives]
    n_held = max(minimum, int(len(useful) * fraction))
    if len(useful) < 2 * n_held:
        n_held = len(useful) // 2
    return useful[: len(useful) - n_held], useful[len(useful) - n_held :]
