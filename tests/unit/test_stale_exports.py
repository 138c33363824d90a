"""ONNX exports of a model directory's earlier weights are deleted once its current ones are
exported: each kept ~90-113 MB after every upgrade of the package that ships the model."""

from __future__ import annotations

import json
from pathlib import Path

from mnemo_server.config import EmbeddingConfig
from mnemo_server.embed.embedder import bundled_model_path
from mnemo_server.embed.factory import build_embedder, model_dir
from mnemo_server.embed.fingerprint import model_fingerprint
from mnemo_server.embed.onnx_export import remove_stale_exports


def _export_dir(cache: Path, name: str, source: dict[str, str] | str | None) -> Path:
    """A directory shaped like an export: a model file and what source.json says."""
    d = cache / name
    d.mkdir(parents=True)
    (d / "model.onnx").write_bytes(b"\0" * 64)
    if source is not None:
        (d / "source.json").write_text(source if isinstance(source, str) else json.dumps(source))
    return d


def test_only_exports_of_the_same_directorys_other_weights_are_deleted(tmp_path: Path) -> None:
    model = tmp_path / "models" / "minilm"
    model.mkdir(parents=True)
    other = tmp_path / "models" / "other"
    other.mkdir()
    link = tmp_path / "minilm-link"
    link.symlink_to(model)
    cache = tmp_path / "cache"
    current = _export_dir(cache, "onnx-current", {"model_dir": str(model), "fingerprint": "new"})
    stale = _export_dir(cache, "onnx-stale", {"model_dir": str(model), "fingerprint": "old"})
    # Named through a link: the same directory.
    stale_by_link = _export_dir(cache, "onnx-stale-link", {"model_dir": str(link), "fingerprint": "older"})
    kept = [
        current,
        _export_dir(cache, "onnx-other-dir", {"model_dir": str(other), "fingerprint": "old"}),
        _export_dir(cache, "onnx-legacy", {"model_dir": str(model)}),  # before fingerprints
        _export_dir(cache, "onnx-no-fingerprint", {"model_dir": str(model), "fingerprint": ""}),
        _export_dir(cache, "onnx-current.tmp", None),  # an export being staged
        _export_dir(cache, "onnx-garbled", "{not json"),
        _export_dir(cache, "onnx-list", "[1, 2]"),
    ]
    (cache / "digest-0123456789abcdef.json").write_text("{}")

    removed = remove_stale_exports(cache, model, "new")

    assert removed == [stale, stale_by_link]
    assert not stale.exists() and not stale_by_link.exists()
    assert all((d / "model.onnx").exists() for d in kept)
    assert (cache / "digest-0123456789abcdef.json").exists()
    assert remove_stale_exports(cache, model, "new") == []


def test_building_the_embedder_records_its_fingerprint_and_deletes_the_stale_export(
    model_cache: Path,
) -> None:
    cfg = EmbeddingConfig()
    source = model_dir(cfg)
    assert source == bundled_model_path()
    stale = _export_dir(
        model_cache, "onnx-from-earlier-weights", {"model_dir": str(source), "fingerprint": "0" * 32}
    )
    elsewhere = _export_dir(
        model_cache, "onnx-of-another-model", {"model_dir": str(model_cache / "x"), "fingerprint": "1" * 32}
    )

    embedder = build_embedder(cfg, model_cache)

    assert embedder.embed(["still embeds"]).shape == (1, embedder.dimension)
    assert not stale.exists() and (elsewhere / "model.onnx").exists()
    fingerprint = model_fingerprint(source, model_cache)
    recorded = [
        json.loads((d / "source.json").read_text())
        for d in model_cache.glob("onnx-*")
        if (d / "model.onnx").stat().st_size > 64
    ]
    assert {"model_dir": str(source), "fingerprint": fingerprint} in recorded
