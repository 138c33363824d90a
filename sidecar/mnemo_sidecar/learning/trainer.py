"""Training from session feedback, and promotion on held-back sessions.

The newest sessions (with any positive feedback) are held back. The cross-encoder is
fine-tuned from the configured (or bundled) model on the rest (question -> used memory vs.
unused hard negatives), then the ranker is trained on the rest with the promoted
cross-encoder's scores as one more feature: for the sessions the fine-tune learned from,
scores from fold models that did not see them (cross_fit.py). Only with a cross-encoder
fast enough here for Score's deadline (`cross_encoder.feature_max_ms`): a slower one is
judged alone, for Recall's rerank, and the ranker learns without it.
Each candidate version is compared on the held-back sessions with the current version (or,
without one, with the baseline order); only a better one is promoted. A cross-encoder is
judged by the ranker it makes (one fitted with its scores against one with the current
version's), if fast enough; a promoted ranker is fitted again on every session before it is
served, so the next candidate is judged on held-back sessions the served one has not seen,
or, with too few of those, against a ranker like it fitted on the candidate's own training
sessions."""

from __future__ import annotations

import math
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mnemo_server.errors import FailedPrecondition
from mnemo_server.retrieval.scoring import minmax
from mnemo_sidecar.crossencoder.data import LabelledPair
from mnemo_sidecar.crossencoder.finetune import FinetuneReport, bundled_base, finetune
from mnemo_sidecar.crossencoder.runtime import CrossEncoderRuntime
from mnemo_sidecar.deadlines import Deadline
from mnemo_sidecar.engine import RankingEngine
from mnemo_sidecar.learning import cross_fit
from mnemo_sidecar.learning.health import decided_win_rate, win_of
from mnemo_sidecar.learning.model import FeedbackSession, ModelKind, SessionMark, TrainingOutcome
from mnemo_sidecar.learning.ndcg import ndcg_at, order_by
from mnemo_sidecar.learning.pair_store import split_heldout
from mnemo_sidecar.ranker.model import RankerFailed, RankerModel, session_matrix, train_ranker

Progress = Callable[[ModelKind, str, float, str], None]
CeCache = dict[str, dict[str, dict[str, float]]]
ShouldStop = Callable[[], bool]


def _relevance(s: FeedbackSession) -> dict[str, float]:
    return {c.candidate.id: c.relevance for c in s.candidates}


def baseline_ndcg(sessions: Sequence[FeedbackSession]) -> float:
    values = [
        ndcg_at(order_by({c.candidate.id: c.candidate.baseline_score for c in s.candidates}), _relevance(s))
        for s in sessions
    ]
    return statistics.fmean(v for v in values if v is not None) if sessions else 0.0


def ce_blend_ndcg(ce: CrossEncoderRuntime, sessions: Sequence[FeedbackSession]) -> float:
    """The cross-encoder blended 50/50 with the baseline after per-session min-max (what
    measured best on this kind of data), judged on the feedback."""
    values = []
    for s in sessions:
        logits = ce.score(s.query, [c.candidate.text for c in s.candidates], Deadline.none())
        blended = [
            0.5 * a + 0.5 * b
            for a, b in zip(
                minmax([float(x) for x in logits]),
                minmax([c.candidate.baseline_score for c in s.candidates]),
                strict=True,
            )
        ]
        v = ndcg_at(
            order_by(dict(zip((c.candidate.id for c in s.candidates), blended, strict=True))), _relevance(s)
        )
        if v is not None:
            values.append(v)
    return statistics.fmean(values) if values else 0.0


def ranker_ndcg(
    model: RankerModel, sessions: Sequence[FeedbackSession], ce_scores: dict[str, dict[str, float]] | None
) -> float:
    return ranker_heldout(model, sessions, ce_scores)[0]


def ranker_heldout(
    model: RankerModel, sessions: Sequence[FeedbackSession], ce_scores: dict[str, dict[str, float]] | None
) -> tuple[float, float]:
    """(mean NDCG@10 of the model's order, its win rate against the baseline over the
    sessions where the two differ)."""
    values: list[float] = []
    wins: list[float | None] = []
    for s in sessions:
        scores = model.score(session_matrix(s, model.feature_names, (ce_scores or {}).get(s.session_id)))
        rel = _relevance(s)
        v = ndcg_at(
            order_by(dict(zip((c.candidate.id for c in s.candidates), map(float, scores), strict=True))), rel
        )
        b = ndcg_at(order_by({c.candidate.id: c.candidate.baseline_score for c in s.candidates}), rel)
        if v is not None and b is not None:
            values.append(v)
            wins.append(win_of(v, b))
    return (statistics.fmean(values) if values else 0.0), decided_win_rate(wins)


def ce_training_pairs(
    sessions: Sequence[FeedbackSession], hard: int, random_negatives: int, max_pairs: int, seed: int = 0
) -> list[LabelledPair]:
    """Per session: the used memories as positives, the `hard` best-ranked unused candidates
    and `random_negatives` others as negatives."""
    rng = random.Random(seed)
    pairs: list[LabelledPair] = []
    for s in sessions:
        pos = [c for c in s.candidates if c.relevance > 0]
        neg = sorted((c for c in s.candidates if c.relevance <= 0), key=lambda c: -c.candidate.baseline_score)
        if not pos or not neg:
            continue
        chosen = neg[:hard] + rng.sample(neg[hard:], min(len(neg[hard:]), random_negatives))
        pairs.extend(LabelledPair(s.query, c.candidate.text, min(1.0, c.relevance), "feedback") for c in pos)
        pairs.extend(LabelledPair(s.query, c.candidate.text, 0.0, "feedback") for c in chosen)
    rng.shuffle(pairs)
    return pairs[:max_pairs]


def sessions_until_fine_tune(last: SessionMark | None, now: SessionMark, growth: float) -> int:
    """Sessions still to arrive before a scheduled run fine-tunes the cross-encoder (0: the
    next one does): (growth - 1) x those stored at the last fine-tune, counted from it
    (`cross_encoder.finetune_growth`)."""
    if last is None or growth <= 1.0:
        return 0
    return max(0, math.ceil((growth - 1.0) * last.stored) - (now.last_seq - last.last_seq))


# Sessions whose heads are timed to judge a cross-encoder's speed (after one untimed call:
# an ONNX session's first run pays for its set-up).
TIMED_SESSIONS = 5


def head_scoring_ms(
    engine: RankingEngine, ce: CrossEncoderRuntime, sessions: Sequence[FeedbackSession]
) -> float:
    """Median milliseconds the cross-encoder takes to score a session's head, as Score does."""
    timed = list(sessions[:TIMED_SESSIONS])
    engine.ce_head_scores(ce, timed[0].query, [c.candidate for c in timed[0].candidates], Deadline.none())
    times = []
    for s in timed:
        started = time.perf_counter()
        engine.ce_head_scores(ce, s.query, [c.candidate for c in s.candidates], Deadline.none())
        times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times)


@dataclass
class _Run:
    """One training run's sessions and callbacks."""

    tenant: str
    train: list[FeedbackSession]
    held: list[FeedbackSession]
    progress: Progress
    should_stop: ShouldStop
    # Cross-encoder scores by model version and session: a run scores each pair once.
    ce_cache: CeCache = field(default_factory=dict)
    # Why a cross-encoder (by version) is too slow to be the ranker's feature; "" if it is not.
    too_slow: dict[str, str] = field(default_factory=dict)
    # The sessions a cross-encoder scores as the ranker's feature: the newest (see
    # cross_encoder.feature_max_sessions).
    featured: list[FeedbackSession] = field(default_factory=list)


class Trainer:
    def __init__(self, engine: RankingEngine):
        self.engine = engine
        self.cfg = engine.cfg

    def train(
        self,
        tenant: str,
        kinds: set[ModelKind],
        *,
        force: bool,
        progress: Progress,
        should_stop: ShouldStop,
        scheduled: bool = False,
        on_outcome: Callable[[TrainingOutcome], None] | None = None,
    ) -> list[TrainingOutcome]:
        """`scheduled`: a background run, which fine-tunes the cross-encoder only when it is
        due (sessions_until_fine_tune); a Train call trains what it asks for. Each model's
        outcome is recorded, and passed to `on_outcome`, as soon as it is decided: a run
        that promoted the cross-encoder and then died in the ranker's turn (a kill, the
        watchdog) lost it, and the serving process, which swaps models in on outcomes,
        went on serving the old one (probe)."""

        def concluded(outcome: TrainingOutcome) -> None:
            store.add_outcome(tenant, outcome)
            outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(outcome)

        t = self.cfg.training
        store = self.engine.store
        fine_tune = ModelKind.CROSS_ENCODER in kinds and t.cross_encoder
        # Only a fine-tune needs the mark. Read before the sessions: one stored in between
        # counts as arrived after the fine-tune.
        mark = store.session_mark(tenant) if fine_tune else SessionMark(0, 0)
        health = self.engine.health
        seen = health.sessions_since_training(tenant)  # before the sessions: see on_training
        sessions = store.sessions(tenant)
        useful = [s for s in sessions if s.positives]
        train, held = split_heldout(sessions, t.heldout_fraction, t.min_heldout)
        refusal = ""
        if len(useful) < t.min_sessions and not force:
            refusal = (
                f"{len(useful)} sessions with positive feedback; training needs {t.min_sessions} (or force)"
            )
        elif not train or not held:
            refusal = "not enough sessions with positive feedback to train and hold some back"
        if refusal:
            # A refusal is a run for the schedule too: else, with enough sessions stored but
            # too few with a used memory (sessions ended without feedback), every next
            # session started another training process to be refused.
            health.on_training(tenant, seen)
            raise FailedPrecondition(refusal, reason="NOT_ENOUGH_SESSIONS")
        outcomes: list[TrainingOutcome] = []
        cap = self.cfg.cross_encoder.feature_max_sessions
        everything = [*train, *held]  # oldest first: the held-back sessions are the newest
        run = _Run(
            tenant, train, held, progress, should_stop, featured=everything[-cap:] if cap > 0 else everything
        )
        if fine_tune:
            last = store.last_fine_tune(tenant)
            wait = sessions_until_fine_tune(last, mark, self.cfg.cross_encoder.finetune_growth)
            if scheduled and last is not None and wait:
                progress(
                    ModelKind.CROSS_ENCODER,
                    "skipped",
                    1.0,
                    f"not due: fine-tuned when {last.stored} sessions were stored; the next after"
                    f" {wait} more",
                )
            else:
                outcome = self._train_cross_encoder(run)
                if outcome.train_pairs:  # a fine-tune ran (promoted or not)
                    store.record_fine_tune(tenant, mark)
                concluded(outcome)
        if ModelKind.RANKER in kinds and t.ranker:
            concluded(self._train_ranker(run))
        health.on_training(tenant, seen)
        return outcomes

    def _scratch(self) -> Path:
        self.cfg.training_scratch.mkdir(parents=True, exist_ok=True)
        return self.cfg.training_scratch

    def _decide(self, candidate: float, current: float | None, baseline: float) -> tuple[bool, str]:
        against, name = (
            (current, "the current version") if current is not None else (baseline, "the baseline")
        )
        if candidate > against + self.cfg.training.promote_margin:
            return (
                True,
                f"promoted: NDCG@10 {candidate:.4f} beats {name} ({against:.4f}) on held-back sessions",
            )
        return False, f"kept {name}: candidate NDCG@10 {candidate:.4f} does not beat {against:.4f}"

    def _train_cross_encoder(self, run: _Run) -> TrainingOutcome:
        tenant, train, held, progress = run.tenant, run.train, run.held, run.progress
        c = self.cfg.cross_encoder
        kind = ModelKind.CROSS_ENCODER

        def pairs_of(sessions: Sequence[FeedbackSession]) -> list[LabelledPair]:
            return ce_training_pairs(sessions, c.hard_negatives, c.random_negatives, c.max_pairs)

        pairs = pairs_of(train)
        if not pairs:
            # Forced training with no training session holding both a used and an unused
            # memory: nothing to fine-tune on, which is no reason to fail the ranker's turn.
            reason = f"kept the current version: {len(train)} training sessions give no pairs"
            progress(kind, "done", 1.0, reason)
            return TrainingOutcome(
                kind, "", False, len(held), 0.0, 0.0, baseline_ndcg(held), reason, 0.0, 0, time.time_ns()
            )
        current, _ = self.engine.cross_encoder(tenant)
        # From the configured (or bundled) model every time, on every session so far, not
        # on from the current fine-tune: the fold models must not start from one that has
        # seen the sessions they score (cross_fit), and the served one is fitted like them.
        base = Path(c.path) if c.path else bundled_base()
        with self.engine.registry.candidate(tenant, kind) as (version, directory):
            started = time.perf_counter()

            budget = c.fine_tune_max_s if c.fine_tune_max_s > 0 else None

            def fit(
                on_pairs: list[LabelledPair], out_dir: Path, step: str, share: float = 1.0
            ) -> FinetuneReport:
                return finetune(
                    base,
                    on_pairs,
                    out_dir,
                    epochs=c.epochs,
                    lr=c.learning_rate,
                    batch_size=c.batch_size,
                    max_length=c.max_length,
                    pos_weight=c.positive_weight,
                    max_seconds=budget,
                    step_fraction=share,
                    threads=self.cfg.training.torch_threads,
                    progress=lambda f, msg: progress(kind, step, f, msg),
                    should_stop=run.should_stop,
                )

            progress(
                kind, "fine-tuning", 0.0, f"{len(pairs)} pairs from {len(train)} sessions, base {base.name}"
            )
            served = fit(pairs, self.engine.fine_tuned_model_dir(directory), "fine-tuning")
            share = served.steps / served.planned_steps
            source = f"fine-tuned from {base.name} on {len(train)} sessions"
            if share < 1.0:
                source += f" ({served.steps} of {served.planned_steps} steps, cut to its {budget:g} s budget)"
            candidate = self.engine.load_fine_tuned(directory)
            # Timed before the fold models are fitted: one too slow to be the ranker's feature
            # needs none of them.
            too_slow = self._too_slow(run, candidate) if self.cfg.training.ranker else ""
            as_feature = self.cfg.training.ranker and not too_slow

            def fit_fold(on: Sequence[FeedbackSession], out_dir: Path) -> bool:
                # A fold's complement may hold no session with both a used and an unused memory.
                fold_pairs = pairs_of(on)
                if fold_pairs:  # trained like the served model: the same share of its steps
                    fit(fold_pairs, out_dir, "cross-fitting", share)
                return bool(fold_pairs)

            if as_feature and c.cross_fit_folds >= 2:
                oof = cross_fit.out_of_fold_scores(
                    train,
                    c.cross_fit_folds,
                    fit_fold,
                    lambda model_dir, onnx: self.engine.load_cross_encoder(model_dir, onnx, fine_tuned=True),
                    lambda ce, s: self.engine.ce_head_scores(
                        ce, s.query, [x.candidate for x in s.candidates], Deadline.none()
                    ),
                    lambda f, msg: progress(kind, "cross-fitting", f, msg),
                    scratch=self._scratch(),
                    scored={s.session_id for s in run.featured},
                )
                cross_fit.save(directory, oof)
                source += f" (the ranker learns their scores from {c.cross_fit_folds} fold models)"
            seconds = time.perf_counter() - started
            if not as_feature and 0 < c.judge_max_sessions < len(held):
                held = held[-c.judge_max_sessions :]  # the newest: alone, it scores every candidate
            progress(kind, "evaluating", 0.0, f"{len(held)} held-back sessions")
            caveat = f" (alone, for Recall's rerank: {too_slow})" if too_slow else ""
            if as_feature:
                # Judged by what it is used for: the order of a ranker fitted on the same
                # sessions with its scores as a feature, against one with the current version's
                # scores (or none). Alone, blended with the baseline, an in-domain fine-tune lost
                # to the general cross-encoder on LoCoMo, yet as a feature it lifted the ranker.
                with_candidate = self._ce_features(candidate, run.featured, run.ce_cache, progress, kind)
                with_current = None
                caveat = " (as the ranker's feature; current: no cross-encoder)"
                if current is not None:
                    with_current = self._ce_features(current, run.featured, run.ce_cache, progress, kind)
                    caveat = " (as the ranker's feature)"
                cand_ndcg = self._probe_ranker(train, held, with_candidate)
                current_ndcg: float | None = self._probe_ranker(train, held, with_current)
            else:
                cand_ndcg = ce_blend_ndcg(candidate, held)
                current_ndcg = ce_blend_ndcg(current, held) if current is not None else None
            base_ndcg = baseline_ndcg(held)
            return self._conclude(
                tenant,
                kind,
                version,
                lambda: candidate,
                source,
                (cand_ndcg, current_ndcg, base_ndcg),
                len(held),
                seconds,
                len(pairs),
                progress,
                caveat,
            )

    def _ce_features(
        self,
        ce: CrossEncoderRuntime,
        sessions: Sequence[FeedbackSession],
        cache: CeCache,
        progress: Progress,
        kind: ModelKind = ModelKind.RANKER,
    ) -> dict[str, dict[str, float]]:
        """Per session of `sessions`, the cross-encoder's scores for the head of its
        candidates (what the ranker gets as a feature when serving), kept in the run's cache
        by model version; for the sessions it was fine-tuned on, its fold models' scores
        (cross_fit)."""
        cached = cache.setdefault(ce.version, {})
        if not cached:
            cached.update(cross_fit.load(ce))
        todo = [s for s in sessions if s.session_id not in cached]
        for n, s in enumerate(todo, 1):
            cached[s.session_id] = self.engine.ce_head_scores(
                ce, s.query, [c.candidate for c in s.candidates], Deadline.none()
            )
            if n % 20 == 0 or n == len(todo):
                progress(kind, "cross-encoder features", n / len(todo), f"{n}/{len(todo)} sessions")
        # Those sessions only, though the cache (fold scores of an earlier run) may hold more:
        # cross-encoders compared with each other are compared on the same sessions.
        return {s.session_id: cached[s.session_id] for s in sessions}

    def _too_slow(self, run: _Run, ce: CrossEncoderRuntime) -> str:
        """Why this cross-encoder cannot be the ranker's feature here ("" if it can): Score
        would spend longer on its head than `cross_encoder.feature_max_ms`."""
        limit, head = self.cfg.cross_encoder.feature_max_ms, self.cfg.cross_encoder.score_head
        if limit <= 0 or not run.held:
            return ""
        if ce.version not in run.too_slow:
            ms = head_scoring_ms(self.engine, ce, run.held)
            run.too_slow[ce.version] = (
                f"scoring its head of {head} candidates takes {ms:.0f} ms here, over the"
                f" {limit:.0f} ms a ranker's feature may take"
                if ms > limit
                else ""
            )
        return run.too_slow[ce.version]

    def _probe_ranker(
        self,
        train: Sequence[FeedbackSession],
        held: Sequence[FeedbackSession],
        ce_scores: dict[str, dict[str, float]] | None,
    ) -> float:
        """Held-back NDCG@10 of a ranker fitted on `train` with these cross-encoder scores."""
        with tempfile.TemporaryDirectory(prefix="probe-", dir=self._scratch()) as tmp:
            model, _ = train_ranker(train, ce_scores, self.cfg.ranker, Path(tmp), "probe")
            return ranker_ndcg(model, held, ce_scores)

    def _train_ranker(self, run: _Run) -> TrainingOutcome:
        tenant, train, held, progress = run.tenant, run.train, run.held, run.progress
        kind = ModelKind.RANKER
        ce, _ = self.engine.cross_encoder(tenant)
        too_slow = self._too_slow(run, ce) if ce is not None else ""
        if too_slow:
            ce = None  # the ranker learns without it
        ce_version = ce.version if ce is not None else None
        ce_scores = self._ce_features(ce, run.featured, run.ce_cache, progress) if ce is not None else None
        with self.engine.registry.candidate(tenant, kind) as (version, directory):
            started = time.perf_counter()
            progress(kind, "training", 0.0, f"lambdarank on {len(train)} sessions")
            model, rows = train_ranker(
                train, ce_scores, self.cfg.ranker, directory, version, ce_version=ce_version
            )
            seconds = time.perf_counter() - started
            current = self.engine.ranker(tenant)
            judged, current_ndcg, caveat = self._incumbent(
                current.model if current is not None else None, train, held, ce_scores, ce_version
            )
            cand_ndcg, win_rate = ranker_heldout(model, judged, ce_scores)
            base_ndcg = baseline_ndcg(judged)
            source = f"lambdarank on {len(train)} sessions" + (
                " + cross-encoder feature" if ce_scores else ""
            )
            if too_slow:
                caveat += f" (no cross-encoder feature: {too_slow})"

            def refit() -> RankerModel:
                """The promoted model is fitted again on every session before it is served."""
                if not self.cfg.ranker.refit_on_all:
                    return model
                progress(kind, "refitting", 0.0, f"lambdarank on all {len(train) + len(held)} sessions")
                return train_ranker(
                    [*train, *held], ce_scores, self.cfg.ranker, directory, version, ce_version=ce_version
                )[0]

            outcome = self._conclude(
                tenant,
                kind,
                version,
                refit,
                source + (f", refit on {len(train) + len(held)}" if self.cfg.ranker.refit_on_all else ""),
                (cand_ndcg, current_ndcg, base_ndcg),
                len(judged),
                seconds,
                rows,
                progress,
                caveat,
            )
            if outcome.promoted:
                self.engine.health.on_promotion(tenant, win_rate)
            return outcome

    def _incumbent(
        self,
        current: RankerModel | None,
        train: list[FeedbackSession],
        held: list[FeedbackSession],
        ce_scores: dict[str, dict[str, float]] | None,
        ce_version: str | None,
    ) -> tuple[list[FeedbackSession], float | None, str]:
        """The sessions to judge on, the current version's NDCG@10 on them (None: judge
        against the baseline), and a caveat for the reason. A ranker that learned another
        cross-encoder's scores is no incumbent. A refit model has seen the older held-back
        sessions (judged on those it would win by memory), so it is judged on the ones it
        has not seen; if too few are left, a ranker like it (its cross-encoder feature or
        none) fitted on the candidate's training sessions stands in for it. One that fails to
        score is no incumbent either: it would keep every candidate out."""
        if current is None:
            return held, None, ""
        if current.uses_ce and current.ce_version != ce_version:
            if ce_version is None:
                return held, None, " (the current version has a cross-encoder feature, this one none)"
            return held, None, " (the current version learned from another cross-encoder's scores)"
        unseen = [s for s in held if s.session_id not in current.trained_sessions]
        try:  # scored also where a stand-in is judged for it, to know that it scores at all
            on_unseen = ranker_ndcg(current, unseen or held[:1], ce_scores)
        except RankerFailed as exc:  # it serves nothing: no incumbent to keep a new one out
            return held, None, f" (the current version fails to score: {exc.message})"
        if len(unseen) >= self.cfg.training.min_heldout:
            return unseen, on_unseen, ""
        stand_in = self._probe_ranker(train, held, ce_scores if current.uses_ce else None)
        return (
            held,
            stand_in,
            f" (the current version has seen {len(held) - len(unseen)} of the {len(held)} held-back"
            f" sessions: judged by a ranker like it fitted on the same {len(train)} sessions)",
        )

    def _conclude(
        self,
        tenant: str,
        kind: ModelKind,
        version: str,
        promotable: Callable[[], object],
        source: str,
        ndcg: tuple[float, float | None, float],
        heldout: int,
        seconds: float,
        pairs: int,
        progress: Progress,
        caveat: str = "",
    ) -> TrainingOutcome:
        """Promote the candidate (atomically, hot-swapped) or discard it, and say why.
        `promotable` gives the model to serve; it is only called for a promotion."""
        candidate, current, baseline = ndcg
        promoted, reason = self._decide(candidate, current, baseline)
        reason += caveat
        if promoted:
            self.engine.registry.promote(tenant, kind, version, promotable(), source)
        else:
            self.engine.registry.discard(tenant, kind, version)
        progress(kind, "done", 1.0, reason)
        return TrainingOutcome(
            kind,
            version,
            promoted,
            heldout,
            candidate,
            current or 0.0,
            baseline,
            reason,
            seconds,
            pairs,
            time.time_ns(),
        )
