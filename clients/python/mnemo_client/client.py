"""MnemoClient: the generated stubs with authentication, deadlines and safe retries.

Every write carries a request_id (generated when the caller gives none) and a retry reuses
it, so a write retried after a lost response takes effect exactly once on the server."""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import grpc
from google.protobuf import field_mask_pb2, struct_pb2, timestamp_pb2

from mnemo.v1 import admin_service_pb2 as admin_pb
from mnemo.v1 import admin_service_pb2_grpc as admin_grpc
from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo.v1 import memory_service_pb2_grpc as pb_grpc

T = TypeVar("T")
MAX_ANSWER_BYTES = 32 << 20  # the server's limit on a message (mnemo_server.api.server)

MEMORY_TYPES = {
    "semantic": common_pb2.MEMORY_TYPE_SEMANTIC,
    "episodic": common_pb2.MEMORY_TYPE_EPISODIC,
    "procedural": common_pb2.MEMORY_TYPE_PROCEDURAL,
    "document_chunk": common_pb2.MEMORY_TYPE_DOCUMENT_CHUNK,
}
TYPE_NAMES = {v: k for k, v in MEMORY_TYPES.items()}
SCOPE_KINDS = {
    "session": common_pb2.SCOPE_KIND_SESSION,
    "persona": common_pb2.SCOPE_KIND_PERSONA,
    "project": common_pb2.SCOPE_KIND_PROJECT,
    "workspace": common_pb2.SCOPE_KIND_WORKSPACE,
}

# CANCELLED too: this client never cancels a unary call of its own, and a server that
# stops ends the calls it has not yet handed to a handler with CANCELLED (gRPC core,
# grpc/grpc#41785), which agents saw as errors at every restart under load (probe).
_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED})
# RESOURCE_EXHAUSTED is retried only as load shedding, told by the ErrorInfo reason Mnemo sets
# on it (the sidecar's admission gate, the server's compute queue). The others do not pass in
# a retry's second: Mnemo's STORAGE_FULL lasts until space is freed, and gRPC's own (a message
# or trailers past a limit, which carry no reason) come back the same on every attempt.
_SHED_REASONS = frozenset(
    {"SIDECAR_OVERLOADED", "COMPUTE_QUEUE_FULL", "TOO_MANY_STREAMS", "STORE_MEMORY_LIMIT"}
)


class MnemoError(Exception):
    """A failed call: the status code, message and ErrorInfo reason; for a write, the
    request_id it was sent with (generated when the caller gave none), so that the same
    request sent again with it takes effect once, whether or not the failed call had."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str = "", fields: Sequence[str] = ()):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.reason = reason
        self.fields = list(fields)
        self.request_id = ""

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own pickling calls __init__ with self.args (the one formatted string):
        # unpickling failed, and a ProcessPoolExecutor whose worker raised one broke.
        return (_rebuilt_error, (self.code, self.message, self.reason, tuple(self.fields), self.request_id))

    @classmethod
    def from_rpc(cls, err: grpc.RpcError) -> MnemoError:
        from google.rpc import error_details_pb2
        from grpc_status import rpc_status

        reason, fields = "", []
        try:
            status = rpc_status.from_call(err)  # type: ignore[arg-type]
        except ValueError:
            # A status proto whose code is not the call's (gRPC failed the call itself, e.g.
            # trailers past its limit, after the server's status): it does not describe what
            # happened, so the call's own code and details stand alone.
            status = None
        for detail in status.details if status else []:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason = info.reason
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                fields = [v.field for v in bad.field_violations]
        return cls(err.code(), err.details() or "", reason, fields)

    @property
    def transient(self) -> bool:
        """Whether the same call may succeed if sent again shortly."""
        if self.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return self.reason in _SHED_REASONS
        return self.code in _RETRYABLE


def _rebuilt_error(
    code: grpc.StatusCode, message: str, reason: str, fields: Sequence[str], request_id: str
) -> MnemoError:
    error = MnemoError(code, message, reason, fields)
    error.request_id = request_id
    return error


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0


def _named(names: Mapping[str, T], name: str, what: str) -> T:
    """The value `name` stands for, or a ValueError listing the valid names."""
    if name not in names:
        raise ValueError(f"{what} must be one of {sorted(names)}, not {name!r}")
    return names[name]


def scope(kind: str, ident: str = "") -> common_pb2.Scope:
    return common_pb2.Scope(kind=_named(SCOPE_KINDS, kind, "scope kind"), id=ident)


def memory_type(name: str) -> common_pb2.MemoryType:
    return _named(MEMORY_TYPES, name, "memory type")


def timestamp(when: datetime | None) -> timestamp_pb2.Timestamp | None:
    if when is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(when)
    return ts


def _sendable(api_key: str) -> str:
    """The key as it can travel in gRPC metadata: surrounding whitespace dropped, as the
    server does (a key read from a file ends in a newline, and every call failed INTERNAL
    "Invalid metadata"); any other character metadata cannot carry is the caller's error."""
    key = api_key.strip()
    if not key or any(not " " <= ch <= "~" for ch in key):
        raise ValueError(
            "api_key: must be printable ASCII (as the server issued it); check it for stray characters"
        )
    return key


class MnemoClient:
    """Use as a context manager, or call close()."""

    def __init__(
        self,
        address: str = "127.0.0.1:50051",
        api_key: str | None = None,
        *,
        timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
        root_certificates: bytes | None = None,
        tls: bool = False,
    ):
        # Answers as large as the server sends (32 MiB): a batch of 500 memories of 20,000
        # characters is answered with them, past gRPC's default 4 MiB a message.
        options = [
            ("grpc.max_receive_message_length", MAX_ANSWER_BYTES),
            # gRPC's reconnect backoff grows to 120 s: after a server restart, a client made
            # before it failed every call for 6-21 s while the server was back (client
            # probe), past what its retries wait. Capped at 1 s, it finds the server by then.
            # (Not min_reconnect_backoff_ms: gRPC also takes it as the time a connection
            # attempt may take, and at 100 ms a busy server's handshake failed UNAVAILABLE.)
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1_000),
        ]
        if tls or root_certificates:
            credentials = grpc.ssl_channel_credentials(root_certificates)
            self.channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self.channel = grpc.insecure_channel(address, options=options)
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self._metadata = (("authorization", f"Bearer {_sendable(api_key)}"),) if api_key else ()
        self.memory = pb_grpc.MemoryServiceStub(self.channel)
        self.admin = admin_grpc.AdminServiceStub(self.channel)

    def __enter__(self) -> MnemoClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    # --- plumbing --------------------------------------------------------------------

    def call(
        self, method: Callable[..., T], request: Any, *, timeout_s: float | None = None, retry: bool = True
    ) -> T:
        """One unary call with the client's credentials and deadline; transient failures
        are retried with jittered exponential backoff (the request, request_id included,
        is sent unchanged)."""
        attempts = self.retry.attempts if retry else 1
        backoff = self.retry.initial_backoff_s
        for attempt in range(1, attempts + 1):
            try:
                return method(request, metadata=self._metadata, timeout=timeout_s or self.timeout_s)
            except grpc.RpcError as err:
                error = MnemoError.from_rpc(err)
                if not error.transient or attempt == attempts:
                    error.request_id = getattr(request, "request_id", "")
                    raise error from None
                time.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, self.retry.max_backoff_s)
        raise AssertionError("unreachable")

    # --- memories --------------------------------------------------------------------

    @staticmethod
    def new_memory(
        content: str,
        *,
        type: str = "semantic",
        category: str = "general",
        scope: common_pb2.Scope | None = None,
        importance: float | None = None,
        confidence: float | None = None,
        pinned: bool = False,
        metadata: dict[str, Any] | None = None,
        external_id: str = "",
        event_time: datetime | None = None,
        source: common_pb2.Source | None = None,
    ) -> memory_pb2.Memory:
        m = memory_pb2.Memory(
            content=content,
            type=memory_type(type),
            category=category,
            pinned=pinned,
            external_id=external_id,
        )
        if scope is not None:
            m.scope.CopyFrom(scope)
        if importance is not None:
            m.importance = importance
        if confidence is not None:
            m.confidence = confidence
        if metadata:
            m.metadata.update(metadata)
        if event_time is not None:
            m.event_time.FromDatetime(event_time)
        if source is not None:
            m.source.CopyFrom(source)
        return m

    def create_memory(
        self, memory: memory_pb2.Memory, *, wait_for_index: bool = False, request_id: str | None = None
    ) -> pb.CreateMemoryResponse:
        req = pb.CreateMemoryRequest(
            memory=memory, wait_for_index=wait_for_index, request_id=request_id or uuid.uuid4().hex
        )
        return self.call(self.memory.CreateMemory, req)

    def batch_create_memories(
        self,
        memories: Sequence[memory_pb2.Memory],
        *,
        wait_for_index: bool = False,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> list[pb.CreateMemoryResponse]:
        req = pb.BatchCreateMemoriesRequest(
            requests=[pb.CreateMemoryRequest(memory=m) for m in memories],
            wait_for_index=wait_for_index,
            request_id=request_id or uuid.uuid4().hex,
        )
        return list(self.call(self.memory.BatchCreateMemories, req, timeout_s=timeout_s).results)

    def get_memory(self, memory_id: str) -> memory_pb2.Memory:
        return self.call(self.memory.GetMemory, pb.GetMemoryRequest(id=memory_id)).memory

    def memory_history(self, memory_id: str, *, page_size: int = 100) -> Iterator[pb.MemoryHistoryEntry]:
        """What happened to a memory, oldest first, across pages (also a deleted one's)."""
        for page in self._pages(
            self.memory.GetMemoryHistory, pb.GetMemoryHistoryRequest(id=memory_id), page_size
        ):
            yield from page.entries

    def list_memories(
        self,
        filter: memory_pb2.MemoryFilter | None = None,
        *,
        page_size: int = 100,
        limit: int | None = None,
        show_deleted: bool = False,
    ) -> Iterator[memory_pb2.Memory]:
        """Newest first, across pages, up to limit (a limit below 1 lists nothing)."""
        if limit is not None and limit < 1:
            return
        req = pb.ListMemoriesRequest(show_deleted=show_deleted)
        if filter is not None:
            req.filter.CopyFrom(filter)
        n = 0
        for page in self._pages(self.memory.ListMemories, req, page_size):
            for m in page.memories:
                yield m
                n += 1
                if limit is not None and n >= limit:
                    return

    def _pages(self, rpc: Callable[..., Any], first: Any, page_size: int) -> Iterator[Any]:
        """Each page of a paged call, `first` carrying everything but the size and token."""
        token = ""
        while True:
            req = type(first)()
            req.CopyFrom(first)
            req.page_size, req.page_token = page_size, token
            try:
                page = self.call(rpc, req)
            except MnemoError as err:
                # A server whose limits.max_page_size is below the size asked for: its default
                # page (page_size 0) always fits it, so page with that instead of failing.
                if token or not page_size or "page_size" not in err.fields:
                    raise
                page_size = 0
                continue
            yield page
            token = page.next_page_token
            if not token:
                return

    def update_memory(
        self, memory_id: str, *, request_id: str | None = None, wait_for_index: bool = False, **fields: Any
    ) -> memory_pb2.Memory:
        """update_memory(id, importance=0.9, pinned=True, content="...", metadata={...})"""
        m = memory_pb2.Memory(id=memory_id)
        for name, value in fields.items():
            if name == "metadata":
                m.metadata.update(value)
            elif name == "event_time":
                m.event_time.FromDatetime(value)
            else:
                setattr(m, name, value)
        req = pb.UpdateMemoryRequest(
            memory=m,
            update_mask=field_mask_pb2.FieldMask(paths=sorted(fields)),
            request_id=request_id or uuid.uuid4().hex,
            wait_for_index=wait_for_index,
        )
        return self.call(self.memory.UpdateMemory, req).memory

    def delete_memory(self, memory_id: str, *, request_id: str | None = None) -> memory_pb2.Memory:
        req = pb.DeleteMemoryRequest(id=memory_id, request_id=request_id or uuid.uuid4().hex)
        return self.call(self.memory.DeleteMemory, req).memory

    def purge_memories(
        self,
        filter: memory_pb2.MemoryFilter | None = None,
        *,
        force: bool = False,
        all_memories: bool = False,
        snapshot_token: str = "",
        request_id: str | None = None,
    ) -> int:
        """How many memories were deleted (without force: how many would be). With a
        snapshot_token from count_purge, only memories stored by that count are deleted.
        request_id: the one a failed purge's MnemoError carries, to finish it and get its
        whole count (a new one is made when none is given)."""
        return self._purge(filter, force, all_memories, snapshot_token, request_id).purge_count

    def count_purge(
        self, filter: memory_pb2.MemoryFilter | None = None, *, all_memories: bool = False
    ) -> pb.PurgeMemoriesResponse:
        """A dry run: purge_count, and the snapshot_token that bounds a forced purge to the
        memories counted here (what arrives while a user confirms is then kept)."""
        return self._purge(filter, False, all_memories, "", None)

    def _purge(
        self,
        filter: memory_pb2.MemoryFilter | None,
        force: bool,
        all_memories: bool,
        snapshot_token: str,
        request_id: str | None,
    ) -> pb.PurgeMemoriesResponse:
        req = pb.PurgeMemoriesRequest(
            force=force,
            all_memories=all_memories,
            snapshot_token=snapshot_token,
            request_id=request_id or uuid.uuid4().hex,
        )
        if filter is not None:
            req.filter.CopyFrom(filter)
        response: pb.PurgeMemoriesResponse = self.call(self.memory.PurgeMemories, req)
        return response

    def recall(
        self,
        query: str,
        *,
        top_k: int = 10,
        types: Iterable[str] = (),
        scopes: Iterable[common_pb2.Scope] = (),
        categories: Iterable[str] = (),
        explain: bool = False,
        timeout_s: float | None = None,
    ) -> list[pb.RecallHit]:
        req = pb.RecallRequest(query=query, top_k=top_k, options=pb.RecallOptions(explain=explain))
        req.filter.types.extend(memory_type(t) for t in types)
        req.filter.scopes.extend(scopes)
        req.filter.categories.extend(categories)
        return list(self.call(self.memory.Recall, req, timeout_s=timeout_s).hits)

    def export_memories(
        self,
        filter: memory_pb2.MemoryFilter | None = None,
        *,
        include_deleted: bool = False,
        timeout_s: float | None = None,
        idle_timeout_s: float | None = None,
    ) -> Iterator[pb.ExportMemoriesResponse]:
        """`timeout_s` bounds the whole stream (None, the default: no overall deadline, as an
        export of any size takes as long as it takes); `idle_timeout_s` bounds each wait for
        the server's next message, so that a server or connection that stops answering ends
        the call with DEADLINE_EXCEEDED. It defaults to the client's `timeout_s`; pass
        `math.inf` for no bound. Time the caller spends on a message does not count."""
        req = pb.ExportMemoriesRequest(include_deleted=include_deleted)
        if filter is not None:
            req.filter.CopyFrom(filter)
        watch = _IdleWatch(self.timeout_s if idle_timeout_s is None else idle_timeout_s)
        call = self.memory.ExportMemories(req, metadata=self._metadata, timeout=timeout_s)
        yield from watch.messages(call)

    def import_memories(
        self,
        batches: Iterable[Sequence[memory_pb2.Memory]],
        *,
        timeout_s: float | None = None,
        idle_timeout_s: float | None = None,
    ) -> Iterator[pb.ImportMemoriesResponse]:
        """As export_memories: `idle_timeout_s` (by default the client's `timeout_s`; `math.inf`
        for none) bounds each wait for the server's next progress message. Time the caller
        spends on a message, or in `batches` making the next batch, does not count."""
        watch = _IdleWatch(self.timeout_s if idle_timeout_s is None else idle_timeout_s)

        def requests() -> Iterator[pb.ImportMemoriesRequest]:
            source = iter(batches)
            while True:
                with watch.paused():
                    try:
                        batch = next(source)
                    except StopIteration:
                        return
                yield pb.ImportMemoriesRequest(memories=list(batch))

        call = self.memory.ImportMemories(requests(), metadata=self._metadata, timeout=timeout_s)
        yield from watch.messages(call)

    def status(self) -> pb.GetStatusResponse:
        return self.call(self.memory.GetStatus, pb.GetStatusRequest())

    # --- admin -----------------------------------------------------------------------

    def create_tenant(
        self, tenant_id: str, display_name: str = "", *, request_id: str | None = None
    ) -> admin_pb.Tenant:
        """request_id: the one a failed call's MnemoError carries, to send it again."""
        req = admin_pb.CreateTenantRequest(
            tenant=admin_pb.Tenant(id=tenant_id, display_name=display_name),
            request_id=request_id or uuid.uuid4().hex,
        )
        return self.call(self.admin.CreateTenant, req).tenant

    def create_api_key(self, tenant_id: str, description: str = "") -> admin_pb.CreateApiKeyResponse:
        # Not retried: a replay cannot return the secret again.
        return self.call(
            self.admin.CreateApiKey,
            admin_pb.CreateApiKeyRequest(tenant_id=tenant_id, description=description),
            retry=False,
        )

    def list_api_keys(self, tenant_id: str) -> list[admin_pb.ApiKey]:
        return list(
            self.call(self.admin.ListApiKeys, admin_pb.ListApiKeysRequest(tenant_id=tenant_id)).api_keys
        )

    def revoke_api_key(self, key_id: str) -> admin_pb.ApiKey:
        return self.call(self.admin.RevokeApiKey, admin_pb.RevokeApiKeyRequest(id=key_id)).api_key


def metadata_dict(m: memory_pb2.Memory) -> dict[str, Any]:
    from google.protobuf import json_format

    out: dict[str, Any] = json_format.MessageToDict(m.metadata) if m.HasField("metadata") else {}
    return out


def empty_struct() -> struct_pb2.Struct:
    return struct_pb2.Struct()


class _IdleWatch:
    """Cancels a streaming call once the server has sent nothing for `limit` seconds (an
    infinite limit: never). Time while paused does not count: a message out with the caller,
    the caller's own iterable making the next request. The wait starts again on resuming."""

    def __init__(self, limit: float):
        self.limit = limit
        self._lock = threading.Lock()
        self._pauses = 0
        self._since = time.monotonic()
        self._done = threading.Event()
        self._fired = False

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            self._pauses += 1
        try:
            yield
        finally:
            with self._lock:
                self._pauses -= 1
                self._since = time.monotonic()

    def _idle(self) -> bool:
        with self._lock:
            self._fired = not self._pauses and time.monotonic() - self._since > self.limit
            return self._fired

    def _watch(self, call: Any) -> None:
        while not self._done.wait(min(0.2, max(self.limit, 0.01))):
            if self._idle():
                call.cancel()
                return

    def messages(self, call: Any) -> Iterator[Any]:
        """The call's messages, each handed to the caller with the watch paused."""
        if math.isfinite(self.limit):
            threading.Thread(target=self._watch, args=(call,), name="mnemo-stream-watch", daemon=True).start()
        try:
            for message in call:
                with self.paused():
                    yield message
        except grpc.RpcError as err:
            if self._fired:
                raise MnemoError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, f"the server sent nothing for {self.limit:g} s"
                ) from None
            raise MnemoError.from_rpc(err) from None
        finally:
            self._done.set()
