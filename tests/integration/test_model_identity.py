"""The store records its embedding model; another model is a clear error until `reembed`."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo_server.app import META_MODEL_FINGERPRINT, Core
from mnemo_server.config import EmbeddingConfig
from mnemo_server.embed.embedder import bundled_model_path
from mnemo_server.embed.factory import build_embedder
from mnemo_server.embed.fingerprint import model_fingerprint
from mnemo_server.errors import EmbeddingModelMismatch
from mnemo_server.store.database import Database
from tests.conftest import LiveServer, TenantClient, make_config, provision


def _one_memory_stored(live: LiveServer) -> TenantClient:
    t = TenantClient(provision(live, "t"), live.channel())
    t.memory().CreateMemory(
        pb.CreateMemoryRequest(
            memory=memory_pb2.Memory(content="the staging database is db-7"), wait_for_index=True
        ),
        metadata=t.md,
        timeout=30,
    )
    live.close()
    return t


def test_changed_model_refuses_to_start_until_reembedded(
    start_server: Callable[..., LiveServer], tmp_path: Path, model_cache: Path
) -> None:
    data = tmp_path / "store"
    t = _one_memory_stored(start_server(data_dir=data))

    other_dir = tmp_path / "other-model"
    shutil.copytree(bundled_model_path(), other_dir)
    other = {"embedding": {"model": "local/minilm-copy", "model_path": str(other_dir)}}
    with pytest.raises(EmbeddingModelMismatch, match="mnemo reembed") as err:
        start_server(data_dir=data, **other)
    assert "sentence-transformers/all-MiniLM-L6-v2#int8" in str(err.value) and err.value.reason == (
        "EMBEDDING_MODEL_MISMATCH"
    )

    # A reembed that ends before its rebuild (here: opened, then closed) adopts nothing: it
    # recorded the new model at once, and the store refused its original one (probe).
    Core(make_config(data, model_cache, **other), accept_model_change=True).close()
    start_server(data_dir=data).close()
    with pytest.raises(EmbeddingModelMismatch):
        start_server(data_dir=data, **other)

    core = Core(make_config(data, model_cache, **other), accept_model_change=True)
    try:
        assert core.rebuild_index() == 1
    finally:
        core.close()

    live2 = start_server(data_dir=data, **other)
    stub = t.memory().__class__(live2.channel())
    status = stub.GetStatus(pb.GetStatusRequest(), metadata=t.md, timeout=5)
    assert status.embedding_model == "local/minilm-copy#int8" and status.pending_index_count == 0
    hit = stub.Recall(
        pb.RecallRequest(query="which database does staging use"), metadata=t.md, timeout=10
    ).hits[0]
    assert hit.memory.embedding_model == "local/minilm-copy#int8" and "db-7" in hit.memory.content
    live2.close()
    with pytest.raises(EmbeddingModelMismatch):
        start_server(data_dir=data)


def test_precision_is_part_of_the_identity(start_server: Callable[..., LiveServer], tmp_path: Path) -> None:
    data = tmp_path / "store"
    start_server(data_dir=data).close()
    with pytest.raises(EmbeddingModelMismatch, match="#int8"):
        start_server(data_dir=data, embedding={"precision": "fp32"})


def test_the_length_texts_are_cut_to_is_part_of_the_identity(
    start_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    """embedding.max_seq_length gives long texts other vectors: changed, the server served
    old and new vectors side by side (maintenance probe)."""
    data = tmp_path / "store"
    start_server(data_dir=data).close()
    with pytest.raises(EmbeddingModelMismatch, match="max_seq_length 256, and 16 is configured"):
        start_server(data_dir=data, embedding={"max_seq_length": 16})
    start_server(data_dir=data).close()


@pytest.fixture
def other_weights(tmp_path: Path) -> Path:
    """Another 384-dimension model, to be configured under the bundled one's name: its token
    embeddings shuffled."""
    from safetensors.numpy import load_file, save_file

    other = tmp_path / "other-weights"
    shutil.copytree(bundled_model_path(), other)
    weights = load_file(other / "model.safetensors")
    key = "embeddings.word_embeddings.weight"
    weights[key] = np.random.default_rng(0).permutation(weights[key])
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    return other


def test_other_model_files_under_the_same_name_are_refused_until_reembedded(
    start_server: Callable[..., LiveServer], tmp_path: Path, model_cache: Path, other_weights: Path
) -> None:
    """embedding.model_path pointed at another model of the same name and dimension was
    served: the old vectors searched with the new model's queries."""
    data = tmp_path / "store"
    _one_memory_stored(start_server(data_dir=data))
    other = {"embedding": {"model_path": str(other_weights)}}
    with pytest.raises(EmbeddingModelMismatch, match="mnemo reembed") as err:
        start_server(data_dir=data, **other)
    assert str(other_weights) in str(err.value) and err.value.reason == "EMBEDDING_MODEL_MISMATCH"

    core = Core(make_config(data, model_cache, **other), accept_model_change=True)  # `mnemo reembed`
    try:
        assert core.rebuild_index() == 1
    finally:
        core.close()
    start_server(data_dir=data, **other).close()
    with pytest.raises(EmbeddingModelMismatch, match="other files"):
        start_server(data_dir=data)


def test_a_store_from_before_fingerprints_opens_with_its_model_and_records_it(
    start_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    data = tmp_path / "store"
    start_server(data_dir=data).close()
    db = Database(data / "mnemo.duckdb")
    try:
        fingerprint = db.get_meta(META_MODEL_FINGERPRINT)
        with db.transaction() as cur:  # what a server before fingerprints recorded
            db.delete_meta(cur, META_MODEL_FINGERPRINT)
    finally:
        db.close()
    start_server(data_dir=data).close()
    db = Database(data / "mnemo.duckdb")
    try:
        assert fingerprint is not None and db.get_meta(META_MODEL_FINGERPRINT) == fingerprint
    finally:
        db.close()


def test_a_fingerprint_follows_the_weights_content_not_their_kept_digest(tmp_path: Path) -> None:
    """Each file's digest is kept between starts; the same file written again with other
    bytes of the same size, even with its mtime put back, is read again."""
    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    weights.write_bytes(b"\1" * 4096)
    first = model_fingerprint(model, tmp_path / "memo")
    assert model_fingerprint(model, tmp_path / "memo") == first
    times = weights.stat()
    weights.write_bytes(b"\2" * 4096)
    os.utime(weights, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert model_fingerprint(model, tmp_path / "memo") != first
    (model / "README.md").write_text("not part of what makes the vectors")
    assert model_fingerprint(model, tmp_path / "memo") == model_fingerprint(model, tmp_path / "memo2")


def test_weights_replaced_in_place_are_exported_again_not_served_from_the_old_export(
    tmp_path: Path, other_weights: Path
) -> None:
    """An upgrade of the package that ships the model replaces its files in place: the ONNX
    export kept for the old files was reused (by name and path), so `mnemo reembed` embedded
    with the old weights while recording the new files' fingerprint."""
    model = tmp_path / "model"
    shutil.copytree(bundled_model_path(), model)
    cfg = EmbeddingConfig(model_path=str(model))
    before = build_embedder(cfg, tmp_path / "cache").embed(["release rollback"])[0]
    shutil.copy(other_weights / "model.safetensors", model / "model.safetensors")
    after = build_embedder(cfg, tmp_path / "cache").embed(["release rollback"])[0]
    assert float(np.dot(before, after)) < 0.99
