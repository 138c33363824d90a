"""mnemo_client: the typed client and the InitRunner-shaped agent tools, on a live server."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from mnemo.v1 import memory_service_pb2 as pb
from mnemo_client import MemoryTools, MnemoClient, MnemoError
from mnemo_client.client import scope
from tests.conftest import LiveServer, TenantClient


@pytest.fixture
def client(server: LiveServer, tenant_a: TenantClient) -> MnemoClient:
    c = MnemoClient(server.address, tenant_a.token, timeout_s=30)
    yield c  # type: ignore[misc]
    c.close()


def _wait_indexed(client: MnemoClient) -> None:
    deadline = time.monotonic() + 30
    while client.status().pending_index_count:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_client_round_trip_and_errors(client: MnemoClient) -> None:
    r = client.create_memory(
        client.new_memory("Staging DB is db-7", category="infra", importance=0.8, metadata={"owner": "ops"}),
        wait_for_index=True,
        request_id="c-1",
    )
    assert not r.deduplicated and r.memory.importance == pytest.approx(0.8)
    again = client.create_memory(
        client.new_memory("Staging DB is db-7", category="infra", importance=0.8, metadata={"owner": "ops"}),
        request_id="c-1",
    )
    assert again.memory.id == r.memory.id
    updated = client.update_memory(r.memory.id, importance=0.3, pinned=True)
    assert updated.pinned and updated.importance == pytest.approx(0.3)
    assert [m.id for m in client.list_memories(limit=5)] == [r.memory.id]
    history = list(client.memory_history(r.memory.id, page_size=1))  # one entry a page
    assert [(e.action, sorted(e.details["paths"]) if e.action == "update" else None) for e in history] == [
        ("create", None),
        ("update", ["importance", "pinned"]),
    ]
    assert client.recall("which database is staging on", top_k=1)[0].memory.id == r.memory.id
    with pytest.raises(MnemoError) as err:
        client.create_memory(client.new_memory("", category="x"))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.fields == ["memory.content"]
    with pytest.raises(MnemoError) as err:
        client.get_memory("00000000-0000-0000-0000-000000000000")
    assert err.value.reason == "MEMORY_NOT_FOUND"
    assert client.status().memory_count == 1


def test_unreachable_server_is_retried_then_reported() -> None:
    with MnemoClient("127.0.0.1:1", timeout_s=0.5) as c, pytest.raises(MnemoError) as err:
        c.status()
    assert err.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_agent_tools_return_prompt_text(client: MnemoClient) -> None:
    tools = MemoryTools(client, scope=scope("project", "website"))
    assert tools.remember("The user prefers dark mode.", category="Prefs").startswith("Remembered (semantic")
    assert tools.remember("the user prefers dark mode").startswith("Already remembered")
    assert "procedural" in tools.learn_procedure("Always run tests before deploying", category="deploy")
    assert "episodic" in tools.record_episode("Deployed v2.1; rollback needed", category="deploy")
    _wait_indexed(client)  # the tools do not wait for indexing
    text = tools.recall("what theme does the user want?", top_k=2)
    first = text.split("\n\n---\n\n")[0]
    assert first.startswith("[Type: semantic | Category: prefs | Score: ")
    assert first.endswith("The user prefers dark mode.")
    listing = tools.list_memories(memory_type="procedural")
    assert listing.startswith("[procedural:deploy] (") and listing.endswith(
        "Always run tests before deploying"
    )
    assert tools.recall("x", memory_types=["bogus"]).startswith("Error: unknown memory types")
    assert tools.remember("").startswith("Error: could not store")
    assert set(tools.tool_functions()) == {s["function"]["name"] for s in MemoryTools.tool_schemas()}
    # Scoped tools see only their scope.
    other = MemoryTools(client, scope=scope("project", "elsewhere"))
    assert other.recall("dark mode") == "No relevant memories found."


def test_agent_tools_answer_bad_arguments_and_a_closed_client_with_an_error_line(
    server: LiveServer, tenant_a: TenantClient
) -> None:
    """README: the tools never raise. A model's arguments can be of any JSON type, and its
    text can hold half an emoji (a lone surrogate, from JSON's "\\ud83d")."""
    client = MnemoClient(server.address, tenant_a.token, timeout_s=30)
    tools = MemoryTools(client)
    assert tools.remember("the standup is at 9:30").startswith("Remembered")
    calls: list[tuple[Callable[..., str], dict[str, Any], str]] = [
        (tools.remember, {"content": "half an emoji \ud83d"}, "content is not valid Unicode text"),
        (tools.remember, {"content": 12345}, "content must be a string, not int"),
        (tools.record_episode, {"content": "ok", "category": ["a"]}, "category must be a string, not list"),
        (tools.recall, {"query": "\ud83d"}, "query is not valid Unicode text"),
        (tools.recall, {"query": "standup", "top_k": "many"}, "top_k must be an integer, not str"),
        (tools.recall, {"query": "standup", "memory_types": 7}, "memory_types must be a list of strings"),
        (tools.list_memories, {"limit": 0}, "limit must be at least 1"),
        (tools.list_memories, {"limit": "3x"}, "limit must be an integer, not str"),
        (tools.list_memories, {"memory_type": ["semantic"]}, "unknown memory type"),
    ]
    for tool, kwargs, reason in calls:
        answer = tool(**kwargs)
        assert answer.startswith("Error: ") and reason in answer, (kwargs, answer)
    _wait_indexed(client)  # the tools do not wait for indexing
    # What models send that can be taken as meant: a count as a string, one type as a string.
    assert "standup" in tools.recall("standup", top_k="3", memory_types="semantic")
    assert tools.list_memories(limit="1").count("\n") == 0
    assert list(client.list_memories(limit=0)) == []
    client.close()
    for tool, args in (
        (tools.remember, ("after close",)),
        (tools.recall, ("standup",)),
        (tools.list_memories, ()),
    ):
        answer = tool(*args)
        assert answer.startswith("Error: "), answer


def test_listing_pages_within_a_server_page_limit_below_what_the_client_asks(
    start_server: Callable[..., LiveServer],
) -> None:
    """An operator's limits.max_page_size of 10: the default page (page_size 0) fits it, and
    the client, which asks for 100 a page, pages with the server's default instead of failing."""
    live = start_server(limits={"max_page_size": 10})
    from tests.conftest import provision

    with MnemoClient(live.address, provision(live, "paged"), timeout_s=30) as c:
        created = c.batch_create_memories([c.new_memory(f"note number {i}", category="n") for i in range(25)])
        assert len(created) == 25
        default_page = c.call(c.memory.ListMemories, pb.ListMemoriesRequest())
        assert len(default_page.memories) == 10 and default_page.next_page_token
        with pytest.raises(MnemoError) as err:
            c.call(c.memory.ListMemories, pb.ListMemoriesRequest(page_size=11))
        assert err.value.fields == ["page_size"]
        assert len({m.id for m in c.list_memories(limit=23)}) == 23
        assert len(list(c.list_memories())) == 25
        note = created[0].memory.id
        for _ in range(12):
            c.update_memory(note, importance=0.4)
        assert len(list(c.memory_history(note))) == 13


def test_answers_fit_a_clients_default_message_limit_and_the_client_takes_a_large_batch(
    client: MnemoClient, server: LiveServer, tenant_a: TenantClient
) -> None:
    """250 memories of 19,000 characters: a batch create answered with them (4.8 MB) reached
    this client as RESOURCE_EXHAUSTED though written, and a page of them or an export message
    failed so in any client at gRPC's default 4 MiB (Node's, Python's)."""
    memories = [client.new_memory(f"note {n} " + "word " * 3_800, category="big") for n in range(250)]
    assert len(client.batch_create_memories(memories, timeout_s=120)) == 250
    plain = grpc.insecure_channel(server.address)  # gRPC's default limits, as any client's
    stub = TenantClient(tenant_a.token, plain).memory()
    listed: list[str] = []
    token, pages = "", 0
    while True:
        page = stub.ListMemories(
            pb.ListMemoriesRequest(page_size=1000, page_token=token), metadata=tenant_a.md
        )
        listed += [m.id for m in page.memories]
        pages, token = pages + 1, page.next_page_token
        if not token:
            break
    assert len(set(listed)) == 250 and pages > 1
    exported = [
        m.id
        for msg in stub.ExportMemories(pb.ExportMemoriesRequest(), metadata=tenant_a.md)
        for m in msg.memories
    ]
    assert sorted(exported) == sorted(listed)
    plain.close()
