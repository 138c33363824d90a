"""The reranker used when no cross-encoder is loaded (Signet's embedding reranker):
0.7 x the caller's first-stage score + 0.3 x cosine(query, text), with the bundled MiniLM.
Text embeddings are cached (the same memories come back across calls), and embedding
stops at the deadline."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from mnemo_server.config import EmbeddingConfig
from mnemo_server.embed.embedder import Embedder
from mnemo_server.embed.factory import build_embedder
from mnemo_sidecar.deadlines import Deadline

FIRST_STAGE_WEIGHT = 0.7
BATCH = 16


class EmbeddingBlend:
    def __init__(self, cache_dir: Path, capacity: int = 20_000, threads: int = 1):
        self._cache_dir = cache_dir
        self._capacity = capacity
        self._threads = threads
        self._embedder: Embedder | None = None
        self._vectors: OrderedDict[str, npt.NDArray[np.float32]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def version(self) -> str:
        return "embedding-blend:all-MiniLM-L6-v2"

    def warm_up(self) -> None:
        self._model()

    def _model(self) -> Embedder:
        with self._lock:
            if self._embedder is None:
                self._embedder = build_embedder(EmbeddingConfig(), self._cache_dir, threads=self._threads)
            return self._embedder

    def score(
        self, query: str, texts: Sequence[str], first_stage: Sequence[float], deadline: Deadline
    ) -> npt.NDArray[np.float32]:
        model = self._model()
        deadline.check("embedding the query")
        q = model.embed([query])[0]
        with self._lock:
            missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        for start in range(0, len(missing), BATCH):
            deadline.check("embedding candidates")
            chunk = missing[start : start + BATCH]
            vectors = model.embed(chunk)
            with self._lock:
                for t, v in zip(chunk, vectors, strict=True):
                    self._vectors[t] = v
                while len(self._vectors) > self._capacity:
                    self._vectors.popitem(last=False)
        with self._lock:
            cos = np.array(
                [float(self._vectors[t] @ q) if t in self._vectors else 0.0 for t in texts], dtype=np.float32
            )
        first = np.asarray(first_stage, dtype=np.float32)
        out: npt.NDArray[np.float32] = FIRST_STAGE_WEIGHT * first + (1 - FIRST_STAGE_WEIGHT) * cos
        return out
