"""Out-of-fold cross-encoder scores for the sessions a fine-tune learned from.

The ranker takes the cross-encoder's score as a feature. Scored by a cross-encoder that was
fine-tuned on them, a session's memories get scores it has memorised: the used ones far
above the rest, which no new session's scores will be. A ranker fitted on those learns to
trust the feature more than it should (measured: a fine-tune promoted on 44 held-back
sessions as the ranker's feature, 0.7310 against 0.7239, then scored 0.6703 against 0.6760
on the other LoCoMo split). So the fine-tune's own training sessions are scored by fold
models instead: one fine-tune per fold on the other folds' sessions, each scoring only the
fold it did not see. The served cross-encoder is still the one fitted on all of them; the
fold models are thrown away, their scores kept beside it (`OOF_FILE`) for every later
ranker fitted on those sessions."""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from mnemo_sidecar.crossencoder.runtime import CrossEncoderRuntime
from mnemo_sidecar.learning.model import FeedbackSession

OOF_FILE = "oof_scores.json"

SessionScores = dict[str, dict[str, float]]  # session id -> candidate id -> score
# Fine-tune on sessions into a dir; False when they hold nothing to learn from (no pairs).
FitFold = Callable[[Sequence[FeedbackSession], Path], bool]
LoadModel = Callable[[Path, Path], CrossEncoderRuntime]  # (model dir, ONNX cache dir)
ScoreSession = Callable[[CrossEncoderRuntime, FeedbackSession], dict[str, float]]


def fold_of(session_id: str, folds: int) -> int:
    """A session's fold: fixed by its id, so a re-run splits the same way."""
    return int.from_bytes(hashlib.sha256(session_id.encode()).digest()[:8], "big") % folds


def out_of_fold_scores(
    sessions: Sequence[FeedbackSession],
    folds: int,
    fit: FitFold,
    load: LoadModel,
    score: ScoreSession,
    progress: Callable[[float, str], None] = lambda _f, _m: None,
    scratch: Path | None = None,
    scored: Collection[str] | None = None,
) -> SessionScores:
    """Every session (of those whose ids are in `scored`, if given) scored by a model
    fine-tuned on the other folds' sessions (kept in `scratch`, or the system's temp, until it
    has scored). A fold with none to score, or whose complement has none or nothing to learn
    from, is skipped (its sessions get no scores)."""
    out: SessionScores = {}
    for k in range(folds):
        held = [s for s in sessions if fold_of(s.session_id, folds) == k]
        rest = [s for s in sessions if fold_of(s.session_id, folds) != k]
        if scored is not None:
            held = [s for s in held if s.session_id in scored]
        if not held or not rest:
            continue
        progress(k / folds, f"fold {k + 1}/{folds}: fine-tuning on {len(rest)} sessions")
        with tempfile.TemporaryDirectory(prefix="ce-fold-", dir=scratch) as tmp:
            if not fit(rest, Path(tmp) / "model"):
                continue
            model = load(Path(tmp) / "model", Path(tmp) / "onnx")
            for s in held:
                out[s.session_id] = score(model, s)
    progress(1.0, f"{len(out)} sessions scored out of fold")
    return out


def save(version_dir: Path, scores: SessionScores) -> None:
    """Beside the model (not in its directory: the model's version is a hash of that)."""
    tmp = version_dir / f".{OOF_FILE}.tmp"
    tmp.write_text(json.dumps(scores, sort_keys=True))
    tmp.replace(version_dir / OOF_FILE)


def load(ce: CrossEncoderRuntime) -> SessionScores:
    """The out-of-fold scores kept beside a cross-encoder ({} for one not fine-tuned here)."""
    path = ce.model_dir.parent / OOF_FILE
    if not path.is_file():
        return {}
    data: SessionScores = json.loads(path.read_text())
    return data
