"""Builds the configured embedder (ONNX first, torch as the fallback)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from mnemo_server.config import EmbeddingConfig
from mnemo_server.embed.embedder import Embedder, OnnxEmbedder, TorchEmbedder, bundled_model_path
from mnemo_server.embed.fingerprint import model_fingerprint
from mnemo_server.embed.onnx_export import (
    export_dir_for,
    export_to_onnx,
    quantize_int8,
    remove_stale_exports,
)
from mnemo_server.errors import FailedPrecondition

log = logging.getLogger(__name__)


def model_identity(cfg: EmbeddingConfig) -> str:
    """What the store records: the model, plus the precision when it changes the vectors."""
    return cfg.model if cfg.backend == "torch" or cfg.precision == "fp32" else f"{cfg.model}#{cfg.precision}"


def model_dir(cfg: EmbeddingConfig) -> Path:
    """The configured sentence-transformers directory (embedding.model_path, else the bundled one)."""
    return Path(cfg.model_path) if cfg.model_path else bundled_model_path()


def build_embedder(
    cfg: EmbeddingConfig,
    cache_root: Path,
    *,
    threads: int | None = None,
    batch_size: int | None = None,
    concurrent_runs: int = 1,
) -> Embedder:
    """threads and batch_size override cfg's; concurrent_runs > 1 embeds a call's
    micro-batches side by side (the index worker's settings)."""
    source = model_dir(cfg)
    if not (source / "config.json").exists():
        raise FailedPrecondition(
            f"embedding model directory {source} has no config.json", reason="EMBEDDING_MODEL_MISSING"
        )
    if cfg.precision not in ("fp32", "int8"):
        raise FailedPrecondition(
            f"embedding.precision must be 'fp32' or 'int8', not {cfg.precision!r}", reason="BAD_CONFIG"
        )
    if cfg.backend == "onnx":
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the exporter's tracer warnings are noise here
                fingerprint = model_fingerprint(source, cache_root)
                target = export_dir_for(cache_root, cfg.model, source, fingerprint)
                onnx_file = export_to_onnx(source, target, fingerprint)
                for stale in remove_stale_exports(cache_root, source, fingerprint):
                    log.info("removed %s, the ONNX export of %s's earlier weights", stale, source)
                if cfg.precision == "int8":
                    onnx_file = quantize_int8(onnx_file)
            return OnnxEmbedder(
                model_identity(cfg),
                onnx_file,
                onnx_file.parent / "tokenizer.json",
                max_seq_length=cfg.max_seq_length,
                intra_op_threads=threads or cfg.intra_op_threads,
                batch_size=batch_size or cfg.batch_size,
                concurrent_runs=concurrent_runs,
            )
        except Exception as exc:  # the fallback is the point: any export/runtime failure
            if cfg.precision != "fp32":
                # torch would produce other vectors than the int8 model the store expects.
                raise FailedPrecondition(
                    f"ONNX int8 embedding unavailable: {exc}; set embedding.precision "
                    "= 'fp32' to allow the torch fallback",
                    reason="EMBEDDER_UNAVAILABLE",
                ) from exc
            log.warning("ONNX embedding unavailable (%s); falling back to sentence-transformers", exc)
    elif cfg.backend != "torch":
        raise FailedPrecondition(
            f"embedding.backend must be 'onnx' or 'torch', not {cfg.backend!r}", reason="BAD_CONFIG"
        )
    return TorchEmbedder(
        cfg.model, source, batch_size=batch_size or cfg.batch_size, max_seq_length=cfg.max_seq_length
    )
