"""mnemo_client: the typed client and the InitRunner-shaped agent tools, on a live server."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo_client import MemoryTools, MnemoClient, MnemoError, RetryPolicy
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
    assert err.value.request_id == ""  # not a write


def test_a_failed_write_names_its_request_id_so_it_can_be_sent_again_once(
    server: LiveServer, tenant_a: TenantClient
) -> None:
    """Past its retries a write's outcome is unknown (it may have been stored); the error
    carries the request_id the client generated, and sending the request again with it
    stores the memory once."""
    with MnemoClient("127.0.0.1:1", timeout_s=0.5) as gone, pytest.raises(MnemoError) as err:
        gone.create_memory(gone.new_memory("sent while the server was away"))
    generated = err.value.request_id
    assert len(generated) == 32 and err.value.code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )
    with MnemoClient(server.address, tenant_a.token, timeout_s=30) as c:
        note = c.new_memory("sent while the server was away")
        first = c.create_memory(note, request_id=generated)
        again = c.create_memory(note, request_id=generated)
        assert again.memory.id == first.memory.id  # the same key answers as the first call did
        with pytest.raises(MnemoError) as refused:
            c.create_memory(c.new_memory(""), request_id="mine-1")
        assert refused.value.request_id == "mine-1"
        assert c.status().memory_count == 1


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


def _two_export_messages(client: MnemoClient) -> None:
    """501 memories: an export sends them in 2 messages (500 a message)."""
    client.batch_create_memories([client.new_memory(f"export note {i}") for i in range(500)])
    client.create_memory(client.new_memory("export note 500"))


def test_stream_idle_timeout_does_not_count_the_callers_time(client: MnemoClient) -> None:
    """idle_timeout_s bounds the server's silence: a caller that spends longer than it on a
    message (export), or on making the next batch (import), is not cut off."""
    _two_export_messages(client)
    exported = []
    for msg in client.export_memories(idle_timeout_s=0.5):
        exported += list(msg.memories)
        time.sleep(1.2)  # the caller's own work on a message
    assert len(exported) == 501

    def slow_batches() -> Iterator[list[Any]]:
        for m in exported[:2]:  # already there: each is received and skipped
            time.sleep(1.2)  # the caller's own work making a batch
            yield [m]

    progress = []
    for answer in client.import_memories(slow_batches(), idle_timeout_s=0.5):
        progress.append(answer.received_count)
        time.sleep(1.2)
    assert progress == [1, 2]


class _StallingProxy:
    """A loopback forwarder to `target` that, once `stall` is set, swallows all traffic both
    ways: a server or network that stops answering without closing the connection."""

    def __init__(self, target: str):
        self.target = target
        self.stall = False
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        host, port = self.target.rsplit(":", 1)
        while True:
            try:
                down, _ = self.sock.accept()
            except OSError:
                return
            up = socket.create_connection((host, int(port)))
            self.conns += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                if not self.stall:
                    b.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def _run_for_at_most(fn: Callable[[], object], seconds: float) -> tuple[bool, BaseException | None]:
    """(whether fn ended within `seconds`, what it raised), fn left running on a thread if not."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as err:
            raised.append(err)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive(), raised[0] if raised else None


def test_stream_calls_end_on_a_stalled_connection_by_default(
    server: LiveServer, tenant_a: TenantClient
) -> None:
    """README: the client adds a deadline to every call. A stream's default bound is an idle
    one, the client's timeout_s: over a connection that stops answering, export and import
    called with their defaults end with DEADLINE_EXCEEDED instead of waiting forever."""
    proxy = _StallingProxy(server.address)
    c = MnemoClient(proxy.address, tenant_a.token, timeout_s=1)
    try:
        c.create_memory(c.new_memory("one memory"))
        exported = [m for msg in c.export_memories() for m in msg.memories]
        proxy.stall = True
        calls: list[tuple[str, Callable[[], object]]] = [
            ("export", lambda: list(c.export_memories())),
            ("import", lambda: list(c.import_memories([exported]))),
        ]
        for name, fn in calls:
            started = time.monotonic()
            ended, error = _run_for_at_most(fn, 15)
            assert ended, f"{name} still waiting after 15 s (client timeout_s=1)"
            assert isinstance(error, MnemoError) and error.code == grpc.StatusCode.DEADLINE_EXCEEDED, (
                name,
                error,
            )
            assert time.monotonic() - started < 5, name
    finally:
        c.close()  # cancels a call still waiting
        proxy.close()
    # An explicit bound still wins: none at all (math.inf), or an overall deadline.
    with MnemoClient(server.address, tenant_a.token, timeout_s=0.01) as c:
        assert sum(len(m.memories) for m in c.export_memories(idle_timeout_s=math.inf)) == 1
    with MnemoClient(server.address, tenant_a.token, timeout_s=30) as c:
        assert sum(len(m.memories) for m in c.export_memories(timeout_s=30, idle_timeout_s=5)) == 1


class _FailedCall(grpc.RpcError):
    """A failed call as gRPC raises it (an RpcError that is also the call), its status proto
    (if any) in the trailers."""

    def __init__(self, code: grpc.StatusCode, details: str, status: status_pb2.Status | None = None):
        self._code, self._details = code, details
        self._trailers = (("grpc-status-details-bin", status.SerializeToString()),) if status else ()

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailers


def _status(code: int, message: str, reason: str) -> status_pb2.Status:
    status = status_pb2.Status(code=code, message=message)
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason=reason, domain="mnemo"))
    return status


def test_resource_exhausted_is_retried_only_as_load_shedding_and_a_mismatched_status_is_an_error(
    server: LiveServer, tenant_a: TenantClient
) -> None:
    """RESOURCE_EXHAUSTED from shedding (the sidecar's SIDECAR_OVERLOADED, the server's
    COMPUTE_QUEUE_FULL) passes and is
    retried; Mnemo's STORAGE_FULL and gRPC's own (trailers or a message past a limit, no
    reason) do not. A status proto whose code is not the call's (gRPC failed a call the server
    had answered NOT_FOUND) is a MnemoError with the call's code, never a raw ValueError."""
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    cases = [
        (
            _FailedCall(
                exhausted, "over", _status(code_pb2.RESOURCE_EXHAUSTED, "over", "SIDECAR_OVERLOADED")
            ),
            4,
        ),
        (
            _FailedCall(
                exhausted, "queue", _status(code_pb2.RESOURCE_EXHAUSTED, "queue", "COMPUTE_QUEUE_FULL")
            ),
            4,
        ),
        (_FailedCall(exhausted, "full", _status(code_pb2.RESOURCE_EXHAUSTED, "full", "STORAGE_FULL")), 1),
        (_FailedCall(exhausted, "received metadata size exceeds hard limit"), 1),
        (_FailedCall(grpc.StatusCode.UNAVAILABLE, "down"), 4),
        (_FailedCall(exhausted, "trailers", _status(code_pb2.NOT_FOUND, "no memory", "MEMORY_NOT_FOUND")), 1),
    ]
    quick = MnemoClient(server.address, tenant_a.token, retry=RetryPolicy(initial_backoff_s=0.001))
    for failure, attempts in cases:
        sent: list[object] = []

        def method(
            request: object, failure: _FailedCall = failure, sent: list[object] = sent, **kwargs: object
        ) -> None:
            sent.append(request)
            raise failure

        with pytest.raises(MnemoError) as err:
            quick.call(method, pb.GetStatusRequest())
        assert err.value.code == failure.code() and err.value.message == failure.details()
        assert len(sent) == attempts, (failure.details(), len(sent))
    quick.close()
    assert MnemoError.from_rpc(cases[0][0]).reason == "SIDECAR_OVERLOADED"
    assert MnemoError.from_rpc(cases[-1][0]).reason == ""  # the proto does not describe this call
    # On the live server: an id of 1,000 emoji is a MnemoError at once, not retried (whether
    # the server's NOT_FOUND fits the trailers or gRPC refuses them as RESOURCE_EXHAUSTED).
    slow_retries = MnemoClient(server.address, tenant_a.token, retry=RetryPolicy(initial_backoff_s=3))
    started = time.monotonic()
    with pytest.raises(MnemoError) as err:
        slow_retries.get_memory("\U0001f9e0" * 1000)
    assert err.value.code in (grpc.StatusCode.NOT_FOUND, exhausted)
    assert time.monotonic() - started < 1.5  # a retry would have slept 1.5 s at least
    slow_retries.close()


def test_an_unknown_memory_type_is_a_value_error_naming_the_valid_types() -> None:
    """As scope() for a scope kind; refused before any call (no server needed)."""
    client = MnemoClient("127.0.0.1:1", timeout_s=1)
    for make in (
        lambda: client.new_memory("x", type="fact"),
        lambda: client.recall("q", types=["semantic", "fact"]),
    ):
        with pytest.raises(ValueError, match=r"memory type must be one of \[.*'semantic'.*\], not 'fact'"):
            make()
    client.close()
    with pytest.raises(ValueError, match=r"scope kind must be one of \[.*'project'.*\], not 'bogus'"):
        scope("bogus")


def test_a_page_of_memories_with_list_heavy_metadata_fits_a_clients_default_limit(
    client: MnemoClient, server: LiveServer, tenant_a: TenantClient
) -> None:
    """Metadata of 4,000 small numbers is 8 KB of JSON, which the page estimate counted, and
    44 KB as the protobuf Struct a memory is sent with: a page of 100 such memories was 4.4 MB,
    RESOURCE_EXHAUSTED in a client at gRPC's default 4 MiB, and so was an export message."""
    meta = struct_pb2.Struct()
    meta.update({"l": [0] * 4000})
    for batch in range(5):
        memories = [client.new_memory(f"listed {batch} {n}", category="lists") for n in range(20)]
        for m in memories:
            m.metadata.CopyFrom(meta)
        assert len(client.batch_create_memories(memories, timeout_s=60)) == 20
    plain = grpc.insecure_channel(server.address)  # gRPC's default limits, as any client's
    stub = TenantClient(tenant_a.token, plain).memory()
    first = stub.ListMemories(pb.ListMemoriesRequest(page_size=100), metadata=tenant_a.md, timeout=30)
    assert 0 < len(first.memories) < 100 and first.next_page_token
    assert first.ByteSize() < 4 << 20
    exported = [
        m.id
        for msg in stub.ExportMemories(pb.ExportMemoriesRequest(), metadata=tenant_a.md)
        for m in msg.memories
    ]
    assert len(set(exported)) == 100
    plain.close()


def test_a_failed_purges_request_id_can_be_sent_again_and_finishes_it_once(client: MnemoClient) -> None:
    """The MnemoError of a failed purge carries its request_id, as for any write, but
    purge_memories took none: it could not be sent again."""
    for i in range(3):
        client.create_memory(client.new_memory(f"to purge {i}", category="old"))
    old = memory_pb2.MemoryFilter(categories=["old"])
    assert client.purge_memories(old, force=True, request_id="purge-once") == 3
    client.create_memory(client.new_memory("stored after the purge", category="old"))
    # The same request again is answered from its record and deletes nothing more.
    assert client.purge_memories(old, force=True, request_id="purge-once") == 3
    assert [m.content for m in client.list_memories()] == ["stored after the purge"]


def test_a_client_made_before_a_server_restart_reaches_it_soon_after_it_is_back(
    start_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    """gRPC's reconnect backoff grows to 120 s: a client made before a restart failed every
    call for 6-21 s while the server was back (client probe)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    first = start_server(tmp_path / "d", server={"port": port}, auth={"enabled": False})
    with MnemoClient(first.address, timeout_s=2, retry=RetryPolicy(attempts=1)) as c:
        c.status()
        first.close()
        # 1, 1.6, 2.6, 4.1, 6.6, 10.5 s between connection attempts (±20 %): after 20 s
        # down, the next came ~6 s after the server was back.
        down_until = time.monotonic() + 20
        while time.monotonic() < down_until:  # calls fail meanwhile, and the backoff grows
            with pytest.raises(MnemoError):
                c.status()
            time.sleep(0.5)
        start_server(tmp_path / "d", server={"port": port}, auth={"enabled": False})
        back = time.monotonic()
        while True:
            try:
                c.status()
                break
            except MnemoError:
                assert time.monotonic() - back < 3.0, "still failing 3 s after the server was back"
                time.sleep(0.1)


def test_a_key_read_from_a_file_works_and_an_unsendable_one_is_named(
    server: LiveServer, tenant_a: TenantClient
) -> None:
    """The trailing newline a key file ends in is dropped, as the server drops it; before,
    every call failed INTERNAL "Invalid metadata" (auth probe). A key metadata cannot carry
    is refused at once, naming api_key."""
    with MnemoClient(server.address, tenant_a.token + "\n", timeout_s=30) as c:
        assert c.status().memory_count == 0
    with pytest.raises(ValueError, match="api_key"):
        MnemoClient(server.address, tenant_a.token + "é")
