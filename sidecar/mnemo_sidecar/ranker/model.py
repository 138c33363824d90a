"""The learned ranker: LightGBM lambdarank over per-candidate features, exported to ONNX
and served with onnxruntime. Features are matched by name, so a model keeps working when
the server adds features (unknown ones are ignored, missing ones are NaN, which the trees
route like LightGBM's own missing-value handling). Besides the server's features and the
cross-encoder's score, it reads columns it derives itself from the texts (text_features.py)."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from mnemo_server.errors import FailedPrecondition
from mnemo_sidecar.config import RankerConfig
from mnemo_sidecar.learning.model import FeedbackSession
from mnemo_sidecar.ranker.text_features import TEXT_FEATURES, text_feature_matrix

# Added by the sidecar itself: the cross-encoder's score for the candidate (head only).
CE_FEATURE = "ce_score"
Matrix = npt.NDArray[np.float32]
# A model failing every Score logs its first failure, then one line per this many.
LOG_EVERY_FAILURES = 100
log = logging.getLogger(__name__)


class RankerFailed(FailedPrecondition):
    """The tenant's ranker failed to score (its ONNX session raised). The sidecar itself is
    fine: FAILED_PRECONDITION, which the server's ranking client takes as a fallback to its
    own order without counting it against the sidecar's health (ranking/client.py)."""

    default_reason = "RANKER_FAILED"


def relevance_label(relevance: float) -> int:
    """Graded label for lambdarank: unused/harmful 0, then 1..3 by strength."""
    return 0 if relevance <= 0 else min(3, max(1, math.ceil(relevance * 3)))


def feature_row(
    names: Sequence[str], values: Sequence[float], model_names: Sequence[str], extra: Mapping[str, float]
) -> list[float]:
    """One candidate's values in the model's order (a repeated name: its last value)."""
    by_name = dict(zip(names, values, strict=False))
    by_name.update(extra)
    return [float(by_name.get(n, math.nan)) for n in model_names]


def session_matrix(s: FeedbackSession, model_names: Sequence[str], ce: Mapping[str, float] | None) -> Matrix:
    """The session's candidates' features in the model's order, one row each, the
    cross-encoder's scores (where given) as CE_FEATURE, and the text features the model
    asks for derived from the query and the texts (ranker/text_features.py)."""
    out = _sent_features(s, model_names, ce)
    wanted = [(j, TEXT_FEATURES.index(name)) for j, name in enumerate(model_names) if name in TEXT_FEATURES]
    if wanted and out.shape[0]:
        derived = text_feature_matrix(s.query, [c.candidate.text for c in s.candidates])
        for j, i in wanted:
            out[:, j] = derived[:, i]
    return out


def _sent_features(s: FeedbackSession, model_names: Sequence[str], ce: Mapping[str, float] | None) -> Matrix:
    """The features the server sent, and the cross-encoder's scores. Column by column: row
    by row it was ~0.6 ms of the sidecar's ~2.8 ms of CPU per Score."""
    n, width = len(s.candidates), len(s.feature_names)
    features = [c.candidate.features for c in s.candidates]
    if any(len(f) != width for f in features):
        # Never from the wire, which checks every length: the row-by-row rules, exactly.
        rows = [
            feature_row(
                s.feature_names,
                c.candidate.features,
                model_names,
                {CE_FEATURE: ce[c.candidate.id]} if ce and c.candidate.id in ce else {},
            )
            for c in s.candidates
        ]
        return np.asarray(rows, dtype=np.float32).reshape(n, len(model_names))
    values = np.asarray(features, dtype=np.float32).reshape(n, width)
    column = {name: i for i, name in enumerate(s.feature_names)}  # the last of a repeated name
    out = np.full((n, len(model_names)), np.nan, dtype=np.float32)
    for j, name in enumerate(model_names):
        i = column.get(name)
        if i is not None:
            out[:, j] = values[:, i]
    if ce and CE_FEATURE in model_names:
        j = list(model_names).index(CE_FEATURE)
        for row, c in enumerate(s.candidates):
            if c.candidate.id in ce:
                out[row, j] = ce[c.candidate.id]
    return out


@dataclass
class RankerModel:
    version: str
    feature_names: tuple[str, ...]
    uses_ce: bool
    path: Path
    _session: object
    # The sessions it was fitted on, so a later candidate is compared with it only on
    # sessions neither has seen.
    trained_sessions: frozenset[str] = frozenset()
    # The cross-encoder whose scores it learned from (another one's scores mean something else).
    ce_version: str | None = None
    # Scores that failed (see `score`).
    failures: int = field(default=0, compare=False)
    _failures_lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @classmethod
    def load(cls, directory: Path, threads: int = 1) -> RankerModel:
        """The ranker in `directory`, refused (ValueError) when its two files disagree: the
        feature names of ranker.json must be the columns ranker.onnx takes, and the model
        must score a row of them. Else a version mixed up or half restored would load, be
        served, and fail every Score and every shadow prediction."""
        import onnxruntime as ort

        meta = json.loads((directory / "ranker.json").read_text())
        names = _feature_names(meta, directory)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        # Idle pool threads would spin between calls, burning a core the server needs.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(str(directory / "ranker.onnx"), opts, providers=["CPUExecutionProvider"])
        _check_agrees(sess, names, directory)
        return cls(
            str(meta["version"]),
            names,
            bool(meta["uses_ce"]),
            directory,
            sess,
            frozenset(meta.get("session_ids", ())),
            meta.get("ce_version"),
        )

    def score(self, matrix: Matrix) -> npt.NDArray[np.float32]:
        if matrix.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        try:
            out = self._session.run(None, {"features": matrix})[0]  # type: ignore[attr-defined]
        except Exception as exc:  # onnxruntime's errors share no base class nearer than this
            raise self._failed(exc) from exc
        result: npt.NDArray[np.float32] = np.asarray(out, dtype=np.float32).reshape(-1)
        return result

    def _failed(self, exc: Exception) -> RankerFailed:
        """Count and log a failed score (the first, then one in LOG_EVERY_FAILURES); the
        error for the caller."""
        with self._failures_lock:
            self.failures += 1
            failures = self.failures
        lines = str(exc).strip().splitlines()
        why = f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]
        if failures % LOG_EVERY_FAILURES == 1:
            log.error("the ranker in %s failed to score (%d times so far): %s", self.path, failures, why)
        return RankerFailed(f"the ranker {self.version} failed to score: {why}")


def _feature_names(meta: Any, directory: Path) -> tuple[str, ...]:
    names = meta["feature_names"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{directory}/ranker.json: feature_names is not a list of names")
    return tuple(names)


def _check_agrees(sess: Any, names: Sequence[str], directory: Path) -> None:
    """ranker.onnx takes one float matrix, `features`, of exactly these columns, and scores
    a row of them (every value missing) into one score."""
    inputs = sess.get_inputs()
    shape = inputs[0].shape if len(inputs) == 1 else []
    if (
        len(inputs) != 1
        or inputs[0].name != "features"
        or inputs[0].type != "tensor(float)"
        or len(shape) != 2
    ):
        taken = ", ".join(f"{i.name} {i.type} {i.shape}" for i in inputs)
        raise ValueError(
            f"{directory}/ranker.onnx takes {taken or 'nothing'}, not one float matrix `features`"
        )
    if shape[1] != len(names):
        raise ValueError(
            f"{directory}/ranker.onnx takes {shape[1]} features a row; its ranker.json names {len(names)}"
        )
    try:
        out = sess.run(None, {"features": np.full((1, len(names)), np.nan, dtype=np.float32)})
    except Exception as exc:  # onnxruntime's errors share no base class nearer than this
        raise ValueError(f"{directory}/ranker.onnx does not score a row of its features: {exc}") from exc
    if not out or np.asarray(out[0]).size != 1:
        raise ValueError(f"{directory}/ranker.onnx does not give one score a row")


def train_ranker(
    sessions: Sequence[FeedbackSession],
    ce_scores: Mapping[str, Mapping[str, float]] | None,
    cfg: RankerConfig,
    out_dir: Path,
    version: str,
    seed: int = 0,
    ce_version: str | None = None,
) -> tuple[RankerModel, int]:
    """Fit lambdarank on the sessions and write ranker.onnx + ranker.json into out_dir.
    Returns the loaded model and the number of training rows."""
    import lightgbm as lgb
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    names: list[str] = []
    for s in sessions:
        names.extend(n for n in s.feature_names if n not in names and n not in TEXT_FEATURES)
    if cfg.text_features:
        names.extend(TEXT_FEATURES)
    uses_ce = bool(ce_scores)
    if uses_ce:
        names.append(CE_FEATURE)
    blocks: list[Matrix] = []
    labels: list[int] = []
    groups: list[int] = []
    for s in sessions:
        if not s.candidates:
            continue
        blocks.append(session_matrix(s, names, ce_scores.get(s.session_id) if ce_scores else None))
        labels.extend(relevance_label(c.relevance) for c in s.candidates)
        groups.append(len(s.candidates))
    x = np.vstack(blocks)
    started = time.perf_counter()
    model = lgb.LGBMRanker(
        objective="lambdarank",
        n_estimators=cfg.n_estimators,
        num_leaves=cfg.num_leaves,
        learning_rate=cfg.learning_rate,
        min_child_samples=cfg.min_child_samples,
        colsample_bytree=cfg.colsample_bytree,
        reg_lambda=cfg.reg_lambda,
        random_state=seed,
        n_jobs=1,
        verbose=-1,
        deterministic=True,
        force_row_wise=True,
    )
    model.fit(x, np.asarray(labels), group=groups, feature_name=[f"f{i}" for i in range(len(names))])
    onx = convert_lightgbm(
        model.booster_,
        initial_types=[("features", FloatTensorType([None, len(names)]))],
        target_opset=15,
        zipmap=False,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ranker.onnx").write_bytes(onx.SerializeToString())
    (out_dir / "ranker.json").write_text(
        json.dumps(
            {
                "version": version,
                "feature_names": names,
                "uses_ce": uses_ce,
                "ce_version": ce_version if uses_ce else None,
                "rows": len(labels),
                "sessions": len(groups),
                "session_ids": [s.session_id for s in sessions if s.candidates],
                "fit_seconds": round(time.perf_counter() - started, 2),
                "params": {
                    "num_leaves": cfg.num_leaves,
                    "n_estimators": cfg.n_estimators,
                    "learning_rate": cfg.learning_rate,
                    "min_child_samples": cfg.min_child_samples,
                    "colsample_bytree": cfg.colsample_bytree,
                    "reg_lambda": cfg.reg_lambda,
                    "text_features": cfg.text_features,
                },
            },
            indent=1,
        )
    )
    return RankerModel.load(out_dir), len(labels)
