"""The sidecar's core, without gRPC: which models serve a tenant, Rerank and Score under a
deadline, storing feedback and keeping the predictor's health."""

from __future__ import annotations

import logging
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from mnemo_server.errors import Cancelled, DeadlineExceeded, FailedPrecondition
from mnemo_sidecar.config import SidecarConfig
from mnemo_sidecar.crossencoder.runtime import CrossEncoderRuntime
from mnemo_sidecar.deadlines import Deadline
from mnemo_sidecar.embedding_blend import EmbeddingBlend
from mnemo_sidecar.learning.health import Health, HealthTracker, win_of
from mnemo_sidecar.learning.model import Candidate, FeedbackCandidate, FeedbackSession, ModelKind
from mnemo_sidecar.learning.ndcg import ndcg_at, order_by
from mnemo_sidecar.learning.pair_store import PairStore
from mnemo_sidecar.learning.registry import ModelRegistry, Promoted
from mnemo_sidecar.ranker.model import LOG_EVERY_FAILURES, RankerModel, session_matrix
from mnemo_sidecar.ranker.text_features import TEXT_FEATURES, derive_in_steps

Scores = npt.NDArray[np.float32]
CE = ModelKind.CROSS_ENCODER
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RerankResult:
    scores: Scores
    cross_encoder: bool
    version: str


@dataclass(frozen=True)
class ScoreResult:
    scores: Scores | None  # None: cold start
    version: str
    predictor_weight: float


@dataclass(frozen=True)
class SubmitResult:
    duplicate: bool
    stored_pairs: int
    health: Health
    training_started: bool


class RankingEngine:
    def __init__(self, cfg: SidecarConfig, store: PairStore, registry: ModelRegistry, health: HealthTracker):
        self.cfg = cfg
        self.store = store
        self.registry = registry
        self.health = health
        self.onnx_cache = cfg.data_path / "onnx-cache"
        inf = cfg.inference
        self.blend = EmbeddingBlend(
            Path(inf.embedder_cache_dir) if inf.embedder_cache_dir else cfg.data_path / "embedder",
            threads=inf.intra_op_threads,
        )
        self._base_ce: CrossEncoderRuntime | None = None
        self._base_ce_lock = threading.Lock()
        # Per tenant, submitted sessions whose shadow prediction failed (see `_shadow`).
        self.shadow_failures: Counter[str] = Counter()
        self._shadow_lock = threading.Lock()
        # Set by the app: starts a background training run for a tenant (returns False if busy).
        self.start_background_training: Callable[[str], bool] = lambda _tenant: False

    @classmethod
    def over(
        cls,
        cfg: SidecarConfig,
        store: PairStore,
        models_dir: Path,
        resident: Mapping[ModelKind, int] | None = None,
    ) -> RankingEngine:
        """An engine over a pair store, the model registry in `models_dir` and the health
        the store keeps: the sidecar's own, a training process's over the same files, or a
        test's."""
        return cls(cfg, store, ModelRegistry(models_dir, resident), HealthTracker(store, cfg.health))

    # --- models ------------------------------------------------------------------------

    def load_cross_encoder(
        self, directory: Path, onnx_cache: Path | None = None, *, fine_tuned: bool = False
    ) -> CrossEncoderRuntime:
        """The configured cross-encoder, or with `fine_tuned` one of the sidecar's own
        fine-tunes (served in cross_encoder.fine_tune_precision)."""
        c = self.cfg.cross_encoder
        return CrossEncoderRuntime(
            directory,
            onnx_cache or self.onnx_cache,
            precision=c.fine_tune_precision if fine_tuned else c.precision,
            intra_op_threads=self.cfg.inference.intra_op_threads,
            max_candidates=self.cfg.inference.max_candidates,
        )

    @staticmethod
    def fine_tuned_model_dir(version_dir: Path) -> Path:
        """Where a fine-tune's model sits in its registry version: a directory of its own,
        since the model's version is a hash of its files and its fold scores (cross_fit)
        sit beside it."""
        return version_dir / "model"

    def load_fine_tuned(self, version_dir: Path) -> CrossEncoderRuntime:
        """The registry's loader for a tenant's promoted cross-encoder (and the trainer's for
        a candidate). Its ONNX export is made inside its version, so that discarding or
        pruning the version removes it too: in the shared cache every fine-tune, kept or
        not, left ~144 MB behind (probe: 452 MB for three discarded ones)."""
        return self.load_cross_encoder(
            self.fine_tuned_model_dir(version_dir), version_dir / "onnx", fine_tuned=True
        )

    def prune_onnx_cache(self) -> list[Path]:
        """Remove from the shared ONNX cache all but the configured cross-encoder's export:
        exports of fine-tunes made before they moved into their versions, of cross-encoders
        configured before, and the temporary directories of exports cut short. Run at
        start-up, after warm_up has loaded (and so exported) the configured one."""
        if not self.onnx_cache.is_dir():
            return []
        keep = self._base_ce.export_dir if self._base_ce is not None else None
        removed = []
        for entry in self.onnx_cache.iterdir():
            if entry == keep:
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
        return removed

    def base_cross_encoder(self) -> CrossEncoderRuntime | None:
        """The configured cross-encoder (shared by all tenants), if any."""
        if not self.cfg.cross_encoder.path:
            return None
        with self._base_ce_lock:
            if self._base_ce is None:
                self._base_ce = self._configured_cross_encoder(Path(self.cfg.cross_encoder.path))
            return self._base_ce

    def _configured_cross_encoder(self, directory: Path) -> CrossEncoderRuntime:
        """Loaded at start-up (warm_up): a directory that holds no cross-encoder is the
        setting's fault, one line (it was the loader's whole traceback)."""
        try:
            return self.load_cross_encoder(directory)
        except Exception as exc:  # any loader's: a truncated safetensors raises its own type
            lines = str(exc).strip().splitlines()
            raise FailedPrecondition(
                f"cross_encoder.path {str(directory)!r} holds no cross-encoder that loads: "
                f"{lines[0] if lines else type(exc).__name__}",
                reason="BAD_CONFIG",
            ) from None

    def cross_encoder(self, tenant: str) -> tuple[CrossEncoderRuntime | None, str]:
        """The tenant's fine-tuned cross-encoder, loaded if need be, else the configured one;
        and its source. For training, which may wait for a load."""
        return self._or_configured(self.registry.current(tenant, CE, self.load_fine_tuned))

    def serving_cross_encoder(self, tenant: str) -> tuple[CrossEncoderRuntime | None, str]:
        """As `cross_encoder`, without waiting: a fine-tune not in memory (see
        cross_encoder.max_resident) loads in the background and the configured one serves
        meanwhile. For Rerank and Score, whose deadlines a load would overrun."""
        return self._or_configured(self.registry.serving(tenant, CE, self.load_fine_tuned))

    def resident_cross_encoder(self, tenant: str) -> tuple[CrossEncoderRuntime | None, str]:
        """As `cross_encoder`, loading nothing: what would serve the tenant now."""
        return self._or_configured(self.registry.resident(tenant, CE))

    def cross_encoder_name(self, tenant: str, ce: CrossEncoderRuntime) -> tuple[str, int]:
        """(version, promote time in ns or 0) naming `ce` as the rest of the sidecar does: a
        tenant's fine-tune by its registry version, as its pointer, directory and training
        outcome name it; the configured one by the hash of its files (never promoted)."""
        own = self.registry.resident(tenant, CE)
        if own is not None and own.model is ce:
            return own.version, own.promote_time_ns
        return ce.version, 0

    def _or_configured(
        self, own: Promoted[CrossEncoderRuntime] | None
    ) -> tuple[CrossEncoderRuntime | None, str]:
        if own is not None:
            return own.model, own.source
        base = self.base_cross_encoder()
        return base, (f"configured: {self.cfg.cross_encoder.path}" if base else "")

    def load_ranker(self, directory: Path) -> RankerModel:
        return RankerModel.load(directory, self.cfg.inference.intra_op_threads)

    def ranker(self, tenant: str) -> Promoted[RankerModel] | None:
        return self.registry.current(tenant, ModelKind.RANKER, self.load_ranker)

    def _loaders(self) -> dict[ModelKind, Callable[[Path], Any]]:
        return {ModelKind.CROSS_ENCODER: self.load_fine_tuned, ModelKind.RANKER: self.load_ranker}

    def reload(self, tenant: str, kind: ModelKind) -> None:
        """Serve the version of the tenant's model that a training process promoted on disk."""
        self.registry.refresh(tenant, kind, self._loaders()[kind])

    def warm_up(self) -> None:
        """The configured cross-encoder (else the embedding blend, then the fallback of every
        Rerank without one) and every tenant's promoted models, loaded now rather than by the
        first calls, which would overrun their deadlines: the blend's embedder takes ~9 s to
        prepare in a new data directory (~0.3 s after), and a load is no deadline check."""
        if self.base_cross_encoder() is None:
            self.blend.warm_up()
        self.registry.warm_up(self._loaders())

    # --- scoring -----------------------------------------------------------------------

    def ce_head_scores(
        self, ce: CrossEncoderRuntime, query: str, candidates: Sequence[Candidate], deadline: Deadline
    ) -> dict[str, float]:
        """Cross-encoder logits for the best `score_head` candidates by baseline."""
        head = sorted(candidates, key=lambda c: -c.baseline_score)[: self.cfg.cross_encoder.score_head]
        if not head:
            return {}
        logits = ce.score(query, [c.text for c in head], deadline)
        return {c.id: float(s) for c, s in zip(head, logits, strict=True)}

    def rerank(
        self, tenant: str, query: str, candidates: Sequence[Candidate], deadline: Deadline
    ) -> RerankResult:
        ce, _ = self.serving_cross_encoder(tenant)
        texts = [c.text for c in candidates]
        if ce is not None:
            return RerankResult(
                ce.score(query, texts, deadline), True, self.cross_encoder_name(tenant, ce)[0]
            )
        scores = self.blend.score(query, texts, [c.baseline_score for c in candidates], deadline)
        return RerankResult(scores, False, self.blend.version)

    def predict(
        self,
        tenant: str,
        query: str,
        names: Sequence[str],
        candidates: Sequence[Candidate],
        deadline: Deadline,
    ) -> tuple[Scores, str] | None:
        """The tenant's ranker's scores, or None in cold start."""
        ranker = self.ranker(tenant)
        if ranker is None:
            return None
        model = ranker.model
        ce_scores: dict[str, float] | None = None
        if model.uses_ce:
            ce, _ = self.serving_cross_encoder(tenant)
            # Only the cross-encoder the ranker learned from: another one's logits (one
            # promoted since, before a ranker learned from it) are on another scale. Without
            # them the feature is missing, as it is beyond the head and in older sessions.
            if ce is not None and ce.version == model.ce_version:
                ce_scores = self.ce_head_scores(ce, query, candidates, deadline)
        deadline.check("ranking")
        if any(name in TEXT_FEATURES for name in model.feature_names):
            # Pure Python over every text (~1 ms per 19,000 characters): in steps, each after
            # a look at the deadline; session_matrix then reads them from the cache.
            derive_in_steps([c.text for c in candidates], lambda: deadline.check("deriving text features"))
        session = FeedbackSession("", query, tuple(names), tuple(_unlabelled(c) for c in candidates))
        matrix = session_matrix(session, model.feature_names, ce_scores)
        deadline.check("ranking")
        scores = model.score(matrix)
        deadline.check("ranking")  # done, but too late to be of use
        return scores, ranker.version

    def score(
        self,
        tenant: str,
        query: str,
        names: Sequence[str],
        candidates: Sequence[Candidate],
        deadline: Deadline,
    ) -> ScoreResult:
        predicted = self.predict(tenant, query, names, candidates, deadline)
        if predicted is None:
            return ScoreResult(None, "", 0.0)
        scores, version = predicted
        return ScoreResult(scores, version, self.health.snapshot(tenant, has_model=True).predictor_weight)

    # --- feedback ----------------------------------------------------------------------

    def submit(self, tenant: str, session: FeedbackSession, deadline: Deadline | None = None) -> SubmitResult:
        """Store a session's feedback (idempotent by its id) and judge the current model on
        it. `deadline` bounds the judgement made in shadow (a model's scores for a session it
        did not serve): past it the session is stored unjudged, never dropped."""
        if not session.candidates:
            # Nothing to learn from or judge by (a session whose pool was empty): neither
            # stored nor counted towards health and the training trigger. Still a duplicate
            # when its id was stored before (with candidates), as the answer says.
            snapshot = self.health.snapshot(tenant, self.ranker(tenant) is not None)
            stored = self.store.has_session(tenant, session.session_id)
            return SubmitResult(stored, self.store.counts(tenant)[1], snapshot, False)
        relevance = {c.candidate.id: c.relevance for c in session.candidates}
        baseline = [
            c.candidate.id for c in sorted(session.candidates, key=lambda c: c.baseline_rank or 10**9)
        ]
        baseline_ndcg = ndcg_at(baseline, relevance)
        predictor_ndcg: float | None = None
        if session.candidates and all(c.predictor_rank for c in session.candidates):
            served = sorted(session.candidates, key=lambda c: c.predictor_rank)
            predictor_ndcg = ndcg_at([c.candidate.id for c in served], relevance)
        elif baseline_ndcg is not None:
            # Not served by the model (cold start or fallback): judge the current model in shadow.
            shadow = self._shadow(tenant, session, deadline or Deadline.none())
            if shadow is not None:
                scores = dict(
                    zip((c.candidate.id for c in session.candidates), map(float, shadow[0]), strict=True)
                )
                predictor_ndcg = ndcg_at(order_by(scores), relevance)
        win = None
        if predictor_ndcg is not None and baseline_ndcg is not None:
            win = win_of(predictor_ndcg, baseline_ndcg)
        added = self.store.add_session(tenant, session, baseline_ndcg, predictor_ndcg, win)
        if added:
            self.health.record(tenant, win)
        has_model = self.ranker(tenant) is not None
        snapshot = self.health.snapshot(tenant, has_model)
        started = (
            added
            and self._due_for_training(tenant, has_model, snapshot)
            and self.start_background_training(tenant)
        )
        return SubmitResult(not added, self.store.counts(tenant)[1], snapshot, started)

    def _shadow(self, tenant: str, session: FeedbackSession, deadline: Deadline) -> tuple[Scores, str] | None:
        """The current model's scores for a submitted session, None without a model, when
        the deadline passes first or when it fails: the judgement is lost, the feedback must
        not be (it is what trains the model that replaces a failing one). A failure is
        counted and logged; a deadline is not the model's fault."""
        try:
            return self.predict(
                tenant,
                session.query,
                session.feature_names,
                [c.candidate for c in session.candidates],
                deadline,
            )
        except (DeadlineExceeded, Cancelled) as exc:
            log.debug("session of tenant %r stored unjudged: %s", tenant, exc)
            return None
        except Exception as exc:  # any model fault; the session is stored all the same
            with self._shadow_lock:
                self.shadow_failures[tenant] += 1
                failures = self.shadow_failures[tenant]
            if failures % LOG_EVERY_FAILURES == 1:
                log.error(
                    "the shadow prediction for tenant %r failed (%d times so far); its feedback "
                    "is stored unjudged: %s: %s",
                    tenant,
                    failures,
                    type(exc).__name__,
                    exc,
                )
            return None

    def _due_for_training(self, tenant: str, has_model: bool, snapshot: Health) -> bool:
        t = self.cfg.training
        if not t.auto or snapshot.sessions < t.min_sessions:
            return False
        since = self.health.sessions_since_training(tenant)
        return (
            (not has_model and since >= t.min_sessions)
            or since >= t.retrain_every
            or (snapshot.drift and since >= t.min_sessions)
        )


def _unlabelled(c: Candidate) -> FeedbackCandidate:
    return FeedbackCandidate(c, 0.0, 0)
