"""A batch create whose answer, the memories it carries back, would not fit a message is
refused and writes nothing: within every limit a batch could be written and its answer then
refused by gRPC, the retry replaying the same unsendable answer (memory/creates.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo_server.app import Core
from mnemo_server.errors import InvalidArgument
from mnemo_server.memory.model import MemoryDraft, MemoryFilter
from tests.conftest import TenantClient, error_info, make_config


@pytest.fixture
def core(tmp_path: Path, model_cache: Path) -> Iterator[Core]:
    opened = Core(make_config(tmp_path / "data", model_cache))
    opened.tenants.ensure_tenant("t")
    try:
        yield opened
    finally:
        opened.close()


def _live(core: Core) -> list[str]:
    listed, _ = core.memories.list_memories(
        "t", MemoryFilter(), page_size=100, page_token="", show_deleted=False
    )
    return sorted(m.content for m in listed)


def test_a_batch_whose_answer_would_pass_the_limit_is_refused_and_writes_nothing(core: Core) -> None:
    drafts = [MemoryDraft(f"note {i} " + "x" * 2_000) for i in range(10)]
    with pytest.raises(InvalidArgument) as err:
        core.memories.batch_create("t", drafts, answer_bytes=20_000)
    assert err.value.reason == "ANSWER_TOO_LARGE" and err.value.violations[0].field == "requests"
    assert _live(core) == []
    assert len(core.memories.batch_create("t", drafts, answer_bytes=40_000)) == 10


def test_a_duplicate_answers_with_the_stored_memory_and_is_measured_as_such(core: Core) -> None:
    """A duplicate is answered with the memory already stored, whose metadata the request
    does not carry: the answer is measured from what it holds, not from the request."""
    core.memories.batch_create("t", [MemoryDraft("the office moved", metadata={"floor": "x" * 8_000})])
    with pytest.raises(InvalidArgument) as err:
        core.memories.batch_create(
            "t", [MemoryDraft("The office moved."), MemoryDraft("new")], answer_bytes=5_000
        )
    assert err.value.reason == "ANSWER_TOO_LARGE"
    assert _live(core) == ["the office moved"]


def test_a_batch_within_the_message_limit_whose_answer_is_not_is_refused_over_grpc(
    tenant_a: TenantClient,
) -> None:
    """419 memories of ~20,000 four-byte characters: a 33.5 MB request, under the server's
    32 MiB, was written and answered RESOURCE_EXHAUSTED (its answer 33.6 MB), every retry too."""
    wide = "\U0001f600" * 19_990
    request = pb.BatchCreateMemoriesRequest(
        requests=[
            pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=f"m{i} {wide}")) for i in range(419)
        ],
        request_id="too-large-to-answer",
    )
    assert request.ByteSize() < 32 << 20
    stub = tenant_a.memory()
    with pytest.raises(grpc.RpcError) as err:
        stub.BatchCreateMemories(request, metadata=tenant_a.md, timeout=120)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert error_info(err.value) == ("ANSWER_TOO_LARGE", ["requests"])
    listed = stub.ListMemories(pb.ListMemoriesRequest(page_size=10), metadata=tenant_a.md, timeout=10)
    assert list(listed.memories) == []
