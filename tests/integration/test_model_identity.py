"""The store records its embedding model; another model is a clear error until `reembed`."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo_server.app import Core
from mnemo_server.embed.embedder import bundled_model_path
from mnemo_server.errors import EmbeddingModelMismatch
from tests.conftest import LiveServer, TenantClient, make_config, provision


def test_changed_model_refuses_to_start_until_reembedded(
    start_server: Callable[..., LiveServer], tmp_path: Path, model_cache: Path
) -> None:
    data = tmp_path / "store"
    live = start_server(data_dir=data)
    t = TenantClient(provision(live, "t"), live.channel())
    t.memory().CreateMemory(
        pb.CreateMemoryRequest(
            memory=memory_pb2.Memory(content="the staging database is db-7"), wait_for_index=True
        ),
        metadata=t.md,
        timeout=30,
    )
    live.close()

    other_dir = tmp_path / "other-model"
    shutil.copytree(bundled_model_path(), other_dir)
    other = {"embedding": {"model": "local/minilm-copy", "model_path": str(other_dir)}}
    with pytest.raises(EmbeddingModelMismatch, match="mnemo reembed") as err:
        start_server(data_dir=data, **other)
    assert "sentence-transformers/all-MiniLM-L6-v2#int8" in str(err.value) and err.value.reason == (
        "EMBEDDING_MODEL_MISMATCH"
    )

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
