"""Serving a cross-encoder through onnxruntime.

Any Hugging Face sequence-classification directory works (ms-marco-MiniLM, bge-reranker,
or what finetune() writes). It is exported to ONNX once — fp32, plus int8 on request — into
a cache directory keyed by the model's content, so a changed model is re-exported and an
unchanged one is only loaded. Scoring tokenises (query, text) pairs without padding, runs
length-sorted micro-batches and checks the request's deadline between them: an answer is
on time or DeadlineExceeded, never late. Texts are cut to what the model reads before they
are tokenised (readable.py), and a micro-batch is split when the time left cannot take it
whole, so the deadline is checked often enough: 100 texts near inference.max_text_chars
were ~0.8 s of tokenising alone, and a micro-batch of 16 of them ran ~0.8 s."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from mnemo_server.embed.batching import MAX_PADDING, length_buckets
from mnemo_server.errors import DeadlineExceeded
from mnemo_server.store.durable import rename_tree
from mnemo_sidecar.crossencoder.finetune import CARD_NAME, quiet_transformers, read_card
from mnemo_sidecar.deadlines import Deadline, refuse_if_late, step_size
from mnemo_sidecar.readable import readable_prefix

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

Scores = npt.NDArray[np.float32]

DEFAULT_MAX_LENGTH = 256
PRECISIONS = ("fp32", "int8")
_EXPORT_INFO = "export.json"
# Files that never change what the model computes; editing them must not force a re-export.
_NOT_HASHED = {CARD_NAME, "README.md"}


def model_version(model_dir: Path) -> str:
    """Content hash of the files that define the model's scores: the top-level files (weights,
    config, tokenizer), plus the card's max_length, which changes truncation. Subdirectories
    (some hub snapshots carry onnx/ or openvino/ copies) and the card's other fields are
    ignored."""
    digest = hashlib.sha256()
    for path in sorted(model_dir.iterdir()):
        if not path.is_file() or path.name.startswith(".") or path.name in _NOT_HASHED:
            continue
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    digest.update(f"max_length={read_card(model_dir).get('max_length')}".encode())
    return digest.hexdigest()[:16]


def _export_fp32(model_dir: Path, target: Path) -> None:
    """model.onnx (logits for input_ids/attention_mask[/token_type_ids]), tokenizer.json and
    export.json, written to a temp dir and renamed into place."""
    import torch
    from torch.jit._trace import TracerWarning
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with quiet_transformers():
        model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    # RoBERTa/XLM-R rerankers (bge-reranker) take no token_type_ids; BERT ones do.
    with_types = "token_type_ids" in tokenizer.model_input_names

    class Logits(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> torch.Tensor:
            out: torch.Tensor = self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).logits
            return out

    class LogitsNoTypes(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.inner(input_ids=input_ids, attention_mask=attention_mask).logits
            return out

    # The sample pairs differ in length so the traced graph contains the padding-mask path;
    # traced on an unpadded batch, the mask handling could be folded away as a constant.
    sample = tokenizer(
        ["an example query", "q"], ["a passage", "another passage here"], padding=True, return_tensors="pt"
    )
    names = ["input_ids", "attention_mask", *(["token_type_ids"] if with_types else [])]
    module = Logits(model) if with_types else LogitsNoTypes(model)
    dynamic = {0: "batch", 1: "tokens"}
    with torch.no_grad(), warnings.catch_warnings():
        # Understood exporter noise. dynamo=False is the exporter that handles these models
        # here (it warns that it is the legacy one). The tracer warns where transformers turns
        # shapes into Python bools (the padding length of a mask already as long as the input,
        # the is_causal flag, False for encoders); those are constant for any input, and the
        # advanced-indexing note is how the mask is lowered. test_onnx_matches_torch checks
        # the graph on other batch sizes, lengths and paddings.
        warnings.filterwarnings("ignore", category=TracerWarning)
        for message, category in (
            ("You are using the legacy TorchScript-based ONNX export", DeprecationWarning),
            ("The feature will be removed", DeprecationWarning),
            ("Exporting aten::index operator of advanced indexing", UserWarning),
        ):
            warnings.filterwarnings("ignore", message=message, category=category)
        torch.onnx.export(
            module,
            tuple(sample[n] for n in names),
            str(tmp / "model.onnx"),
            input_names=names,
            output_names=["logits"],
            dynamic_axes={**dict.fromkeys(names, dynamic), "logits": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    tokenizer.backend_tokenizer.save(str(tmp / "tokenizer.json"))
    info = {
        "model_dir": str(model_dir),
        "inputs": names,
        "num_labels": int(model.config.num_labels),
        "pad_id": int(tokenizer.pad_token_id or 0),
        "max_tokens": _token_limit(tokenizer, model.config),
    }
    (tmp / _EXPORT_INFO).write_text(json.dumps(info, indent=2), encoding="utf-8")
    try:
        rename_tree(tmp, target)
    except OSError:
        # Another process finished the same export first; theirs is as good as ours.
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / _EXPORT_INFO).exists():
            raise


def _token_limit(tokenizer: Any, config: Any) -> int | None:
    """The longest input the model can take: the tokenizer's limit (when it states a real one)
    and the position table (RoBERTa-style models spend two positions on the padding offset)."""
    limits = []
    if tokenizer.model_max_length < 100_000:  # "no limit" is stated as a huge sentinel
        limits.append(int(tokenizer.model_max_length))
    positions = getattr(config, "max_position_embeddings", None)
    if positions:
        limits.append(int(positions) - (2 if config.model_type in {"roberta", "xlm-roberta"} else 0))
    return min(limits) if limits else None


class _DropLogRecords(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def _quantize_int8(onnx_file: Path) -> Path:
    """Dynamic int8 quantisation of the MatMul weights per output channel (the variant that
    kept the embedder's quality; whole-graph quantisation lost a lot)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target = onnx_file.with_name("model.int8.onnx")
    if target.exists():
        return target
    tmp = onnx_file.with_name(f"model.int8.onnx.tmp-{os.getpid()}-{threading.get_ident()}")
    # quantize_dynamic logs a hint to pre-process (shape inference) on the root logger; for
    # dynamic MatMul quantisation it changes nothing, so it is dropped rather than shown.
    hint = _DropLogRecords("Please consider to run pre-processing before quantization")
    logging.getLogger().addFilter(hint)
    try:
        quantize_dynamic(
            str(onnx_file),
            str(tmp),
            weight_type=QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=["MatMul"],
        )
    finally:
        logging.getLogger().removeFilter(hint)
    tmp.replace(target)
    return target


def ensure_export(model_dir: Path, cache_dir: Path, precision: str = "fp32") -> Path:
    """The cached export directory for this model's content, made if missing."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    target = cache_dir / f"ce-{model_version(model_dir)}"
    if not (target / _EXPORT_INFO).exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        _export_fp32(model_dir, target)
    if precision == "int8":
        _quantize_int8(target / "model.onnx")
    return target


class CrossEncoderRuntime:
    """Scores (query, text) pairs with an ONNX cross-encoder. Thread-safe: onnxruntime
    sessions and tokenizers accept concurrent calls; only the statistics take a lock."""

    def __init__(
        self,
        model_dir: Path,
        cache_dir: Path,
        *,
        precision: str | None = None,
        intra_op_threads: int = 2,
        batch_size: int = 16,
        max_length: int | None = None,
        max_candidates: int | None = None,
    ):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.model_dir = Path(model_dir)
        self.card = read_card(self.model_dir)
        self.precision = precision or str(self.card.get("serving", {}).get("precision", "fp32"))
        self.export_dir = ensure_export(self.model_dir, Path(cache_dir), self.precision)
        self.version = self.export_dir.name.removeprefix("ce-")
        info = json.loads((self.export_dir / _EXPORT_INFO).read_text(encoding="utf-8"))
        wanted = max_length or int(self.card.get("max_length") or DEFAULT_MAX_LENGTH)
        self.max_length = min(wanted, int(info["max_tokens"])) if info.get("max_tokens") else wanted
        self.batch_size = batch_size
        self.max_candidates = max_candidates
        self.intra_op_threads = intra_op_threads
        self._inputs: list[str] = list(info["inputs"])
        self._num_labels = int(info["num_labels"])
        if self._num_labels not in (1, 2):
            raise ValueError(f"{model_dir} has {self._num_labels} labels; a reranker has 1 (or 2)")
        self._pad_id = int(info["pad_id"])

        self._tokenizer = Tokenizer.from_file(str(self.export_dir / "tokenizer.json"))
        self._tokenizer.no_padding()  # padded per micro-batch, to that batch's longest pair
        # Same strategy as the Hugging Face tokenizer used in training (truncation=True).
        self._tokenizer.enable_truncation(self.max_length, strategy="longest_first")
        # Counts a query's tokens, untruncated: how much of a text pairs with it (_readable).
        self._counter = Tokenizer.from_str(self._tokenizer.to_str())
        self._counter.no_truncation()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        # Idle pool threads would spin between calls, burning a core the server needs.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        file = "model.int8.onnx" if self.precision == "int8" else "model.onnx"
        self.onnx_file = self.export_dir / file
        self._session = ort.InferenceSession(str(self.onnx_file), opts, providers=["CPUExecutionProvider"])

        self._lock = threading.Lock()
        self._seconds_per_token = 0.0  # best rate seen, to refuse a batch that cannot finish in time
        self._calls = 0
        self._pairs = 0
        self._seconds = 0.0
        self._deadline_exceeded = 0
        # The first run of a session pays for memory planning; do it now, not in a request.
        probe = self._tokenizer.encode_batch([("warm", "up")])
        self._session.run(None, self._feed(probe, [0], len(probe[0].ids)))

    def score(
        self,
        query: str,
        texts: Sequence[str],
        deadline: Deadline | None = None,
        *,
        max_candidates: int | None = None,
    ) -> Scores:
        """Raw logits for (query, text) pairs, in the order of ``texts``. Only the first
        ``max_candidates`` texts (the call's, else the runtime's) are scored — pass them in
        first-stage order — so the result has min(len(texts), cap) entries."""
        deadline = deadline or Deadline.none()
        deadline.check("rerank (before scoring)")
        cap = max_candidates if max_candidates is not None else self.max_candidates
        chosen = list(texts) if cap is None else list(texts[: max(0, cap)])
        return self.score_pairs([(query, t) for t in chosen], deadline)

    def score_pairs(self, pairs: Sequence[tuple[str, str]], deadline: Deadline | None = None) -> Scores:
        deadline = deadline or Deadline.none()
        deadline.check("rerank (before scoring)")
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        started = time.perf_counter()
        try:
            out = self._run(pairs, deadline)
        except DeadlineExceeded:
            with self._lock:
                self._deadline_exceeded += 1
            raise
        elapsed = time.perf_counter() - started
        with self._lock:
            self._calls += 1
            self._pairs += len(pairs)
            self._seconds += elapsed
        return out

    def token_counts(self, pairs: Sequence[tuple[str, str]]) -> list[int]:
        """Tokens per pair after truncation (what a pair costs to score)."""
        return [len(e.ids) for e in self._tokenizer.encode_batch(list(pairs))]

    def _run(self, pairs: Sequence[tuple[str, str]], deadline: Deadline) -> Scores:
        encodings: list[Any] = []
        keep: dict[str, int] = {}
        for start in range(0, len(pairs), self.batch_size):
            deadline.check("rerank (tokenising)")
            encodings.extend(
                self._tokenizer.encode_batch(
                    [(q, self._readable(q, t, keep)) for q, t in pairs[start : start + self.batch_size]]
                )
            )
        out = np.zeros(len(pairs), dtype=np.float32)
        batches = length_buckets([len(e.ids) for e in encodings], self.batch_size, MAX_PADDING)
        for n, batch in enumerate(batches):
            todo = list(batch)
            while todo:
                deadline.check(f"rerank (batch {n + 1} of {len(batches)})")
                with self._lock:
                    pace = self._seconds_per_token
                # Shortest first (length_buckets): a step's width is its last pair's length.
                size = step_size([len(encodings[i].ids) for i in todo], pace, deadline)
                idx, todo = todo[:size], todo[size:]
                width = max(len(encodings[i].ids) for i in idx)
                refuse_if_late(deadline, pace * width * len(idx), f"rerank batch {n + 1} of {len(batches)}")
                feed = self._feed(encodings, idx, width)
                t0 = time.perf_counter()
                logits = self._session.run(None, feed)[0]
                self._observe((time.perf_counter() - t0) / (width * len(idx)))
                out[idx] = logits[:, 0] if self._num_labels == 1 else logits[:, 1] - logits[:, 0]
        deadline.check("rerank (after scoring)")  # finished, but too late to be of use
        return out

    def _readable(self, query: str, text: str, keep: dict[str, int]) -> str:
        """The part of `text` the model reads paired with `query` (readable.py). Pairs are cut
        longest first, so how much of the text is kept depends on the query's length and on
        which of the two is longer: the cut text keeps more words than the model reads and
        than the query has tokens, so both stay as they were."""
        if query not in keep:
            tokens = len(self._counter.encode(query, add_special_tokens=False).ids)
            keep[query] = max(self.max_length, tokens + 1)
        return readable_prefix(text, keep[query])

    def _feed(
        self, encodings: Sequence[Any], idx: Sequence[int], width: int
    ) -> dict[str, npt.NDArray[np.int64]]:
        ids = np.full((len(idx), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(idx), width), dtype=np.int64)
        types = np.zeros((len(idx), width), dtype=np.int64)
        for row, i in enumerate(idx):
            enc = encodings[i]
            n = len(enc.ids)
            ids[row, :n] = enc.ids
            mask[row, :n] = 1
            types[row, :n] = enc.type_ids
        arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {name: arrays[name] for name in self._inputs}

    def _observe(self, seconds_per_token: float) -> None:
        with self._lock:
            # The fastest rate seen so far: a lower bound on what a batch costs, so a stall
            # (GC, a busy core) never makes later batches look infeasible, and a batch is only
            # refused when even the best case cannot finish in time.
            previous = self._seconds_per_token
            self._seconds_per_token = seconds_per_token if previous == 0 else min(previous, seconds_per_token)

    def describe(self) -> dict[str, Any]:
        with self._lock:
            calls, pairs, seconds, late = self._calls, self._pairs, self._seconds, self._deadline_exceeded
        validation = (self.card.get("validation") or {}).get("overall")
        return {
            "model_dir": str(self.model_dir),
            "version": self.version,
            "precision": self.precision,
            "onnx_file": str(self.onnx_file),
            "max_length": self.max_length,
            "batch_size": self.batch_size,
            "intra_op_threads": self.intra_op_threads,
            "max_candidates": self.max_candidates,
            "base": self.card.get("base"),
            "validation": validation,
            "calls": calls,
            "pairs_scored": pairs,
            "mean_ms_per_call": round(1000 * seconds / calls, 2) if calls else None,
            "deadline_exceeded": late,
        }
