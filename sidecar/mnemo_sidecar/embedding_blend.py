"""The reranker used when no cross-encoder is loaded (Signet's embedding reranker):
0.7 x the caller's first-stage score + 0.3 x cosine(query, text), with the bundled MiniLM.
Text embeddings are cached (the same memories come back across calls), and embedding
stops at the deadline: texts are cut to what the model reads (readable.py) and embedded in
steps sized to the time left, the deadline checked between them. A step of 16 texts near
inference.max_text_chars took ~0.9 s, which expired Reranks spent holding an inference
slot that live ones waited for. A step the time left cannot hold at the best pace seen is
refused, not run (deadlines.refuse_if_late). The cache is keyed by a digest of the text
(text_key.py)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from mnemo_server.config import EmbeddingConfig
from mnemo_server.embed.embedder import Embedder
from mnemo_server.embed.factory import build_embedder
from mnemo_sidecar.deadlines import Deadline, refuse_if_late, step_size
from mnemo_sidecar.readable import readable_prefix
from mnemo_sidecar.text_key import text_key

FIRST_STAGE_WEIGHT = 0.7
BATCH = 16
# Tokens the blend's model reads of a text ([CLS] and [SEP] included): no text is cut
# shorter than that many words (readable.py).
MAX_TOKENS = EmbeddingConfig().max_seq_length
# A text's cost to embed, in characters of its readable part plus this much for the run's
# fixed cost per text (a short memory alone costs about what 250 more characters do).
_TEXT_OVERHEAD_CHARS = 256


class EmbeddingBlend:
    def __init__(self, cache_dir: Path, capacity: int = 20_000, threads: int = 1):
        self._cache_dir = cache_dir
        self._capacity = capacity
        self._threads = threads
        self._embedder: Embedder | None = None
        self._vectors: OrderedDict[bytes, npt.NDArray[np.float32]] = OrderedDict()  # by text_key
        self._lock = threading.Lock()
        # The best pace seen, in seconds per unit of _cost (0: none yet), to size steps.
        self._seconds_per_unit = 0.0

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
        query_part = readable_prefix(query, MAX_TOKENS)
        with self._lock:
            pace = self._seconds_per_unit
        refuse_if_late(deadline, pace * _cost(query_part), "embedding the query")
        q = model.embed([query_part])[0]
        keys = [text_key(t) for t in texts]
        with self._lock:
            missing = [
                (k, t) for k, t in dict(zip(keys, texts, strict=True)).items() if k not in self._vectors
            ]
        # Keyed by the whole text, embedded as the part the model reads (the same vector).
        readable = [readable_prefix(t, MAX_TOKENS) for _, t in missing]
        costs = [_cost(t) for t in readable]
        start = 0
        while start < len(missing):
            deadline.check("embedding candidates")
            with self._lock:
                pace = self._seconds_per_unit
            end = start + step_size(costs[start : start + BATCH], pace, deadline)
            refuse_if_late(deadline, pace * sum(costs[start:end]), "embedding candidates")
            began = time.perf_counter()
            vectors = model.embed(readable[start:end])
            self._observe((time.perf_counter() - began) / sum(costs[start:end]))
            with self._lock:
                for (k, _), v in zip(missing[start:end], vectors, strict=True):
                    self._vectors[k] = v
                while len(self._vectors) > self._capacity:
                    self._vectors.popitem(last=False)
            start = end
        deadline.check("embedding candidates")  # done, but too late to be of use
        with self._lock:
            cos = np.array(
                [float(self._vectors[k] @ q) if k in self._vectors else 0.0 for k in keys], dtype=np.float32
            )
        first = np.asarray(first_stage, dtype=np.float32)
        out: npt.NDArray[np.float32] = FIRST_STAGE_WEIGHT * first + (1 - FIRST_STAGE_WEIGHT) * cos
        return out

    def _observe(self, seconds_per_unit: float) -> None:
        with self._lock:
            # The fastest pace seen: a stall (GC, a busy core) never shrinks later steps for
            # good, and step_size leaves room for running at half this pace.
            previous = self._seconds_per_unit
            self._seconds_per_unit = seconds_per_unit if previous == 0 else min(previous, seconds_per_unit)


def _cost(readable: str) -> float:
    return float(len(readable) + _TEXT_OVERHEAD_CHARS)
