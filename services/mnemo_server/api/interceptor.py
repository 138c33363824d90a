"""Authentication, error mapping, call times and the slow-call log for every RPC, in one
interceptor.

The caller's principal is resolved from ``authorization: Bearer <key>`` and made available
to servicers through a context variable; any domain error raised below becomes a canonical
status with details, and anything unexpected becomes INTERNAL with an incident id (the
traceback goes to the log, never to the client). A unary call slower than `slow_call_ms`
is logged with where its time went (call_trace.py); every unary call's time is counted per
method (latency_histogram.py), for GetStatus."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from mnemo_server.api.compute_gate import COMPUTE_PRIORITY, ComputeGate
from mnemo_server.api.errors import internal_status, storage_full, to_rpc_status
from mnemo_server.call_trace import CallTrace, mark, traced
from mnemo_server.errors import InvalidArgument, MnemoError, ResourceExhausted, Unauthenticated
from mnemo_server.latency_histogram import CallTimes
from mnemo_server.tenancy.tenants import Principal

log = logging.getLogger(__name__)

_PRINCIPAL: contextvars.ContextVar[Principal] = contextvars.ContextVar("mnemo_principal")

# Served without credentials: health checks and reflection.
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def current_principal() -> Principal:
    try:
        return _PRINCIPAL.get()
    except LookupError:
        raise Unauthenticated("no authenticated caller", reason="MISSING_CREDENTIALS") from None


def bearer_token(metadata: Any) -> str:
    given = [value for key, value in metadata or () if key == "authorization"]
    if len(given) > 1:  # which one is meant? Taking the first would hide a proxy's mistake
        raise Unauthenticated("send one authorization header, not several", reason="BAD_AUTH_SCHEME")
    for value in given:
        text = value.decode() if isinstance(value, bytes) else str(value)
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == "bearer":
            return token.strip()
        raise Unauthenticated("authorization metadata must be 'Bearer <api key>'", reason="BAD_AUTH_SCHEME")
    return ""


class _Unparsed:
    """A request message protobuf could not parse, kept for the handler to refuse."""

    def __init__(self, error: DecodeError):
        self.error = error


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """gRPC answers a request its deserializer raises on with INTERNAL before any handler
    runs; a message nested deeper than protobuf's recursion limit (metadata objects within
    objects) is the caller's error, so it is handed on and refused as INVALID_ARGUMENT."""
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as exc:
            return _Unparsed(exc)

    return parse


def _parsed(request: Any) -> Any:
    if isinstance(request, _Unparsed):
        raise InvalidArgument(
            "request", "could not be parsed: malformed, or nested deeper than protobuf allows"
        ) from request.error
    if isinstance(request, Iterator):  # a client stream: each message as it is read
        return (_parsed(r) for r in request)
    return request


def _checked_each(requests: Iterator[Any], check: Callable[[], object]) -> Iterator[Any]:
    for request in requests:
        check()
        yield request


def _fail(context: grpc.ServicerContext, exc: BaseException, method: str) -> None:
    if isinstance(exc, MnemoError):
        context.abort_with_status(to_rpc_status(exc))
    if isinstance(exc, grpc.RpcError) and not context.is_active():
        # Reading a client stream the client cancelled (or whose deadline passed): nobody
        # waits for the answer and nothing failed here, so it is no incident.
        log.debug("%s ended by its client: %s", method, exc)
        context.abort(grpc.StatusCode.CANCELLED, "the call was cancelled by its client")
    incident = uuid.uuid4().hex[:12]
    log.error("incident %s in %s", incident, method, exc_info=exc)
    full = storage_full(exc, incident)
    context.abort_with_status(to_rpc_status(full) if full else internal_status(incident))


class ApiInterceptor(grpc.ServerInterceptor):
    def __init__(
        self,
        authenticate: Callable[[str], Principal],
        gate: ComputeGate | None = None,
        slow_call_ms: float = 0.0,
        call_times: CallTimes | None = None,
        max_streams: int = 8,
        max_streams_per_tenant: int = 4,
    ):
        self._authenticate = authenticate
        self._max_streams = max_streams
        self._max_streams_per_tenant = max_streams_per_tenant
        self._streams_lock = threading.Lock()
        self._streams_of: Counter[str] = Counter()  # tenant -> its streamed calls running
        # API key id -> its streamed calls running, ended when the key is revoked.
        self._streams_by_key: dict[str, set[grpc.ServicerContext]] = {}
        self._gate = gate or ComputeGate(0)
        self._slow_call_ms = slow_call_ms
        self.call_times = call_times or CallTimes()
        # Handlers still running (a call cancelled by its client keeps its thread until it
        # returns): shutdown waits for them before closing the stores under their feet.
        self._active = 0
        self._idle = threading.Condition()

    @contextmanager
    def _in_flight(self) -> Iterator[None]:
        with self._idle:
            self._active += 1
        try:
            yield
        finally:
            with self._idle:
                self._active -= 1
                self._idle.notify_all()

    @contextmanager
    def _stream_slot(self, context: grpc.ServicerContext, tenant_id: str) -> Iterator[None]:
        """One of max_streams for a streamed call, at most max_streams_per_tenant of them a
        tenant's (or one tenant's idle imports would lock every other out), else
        RESOURCE_EXHAUSTED at once."""
        with self._streams_lock:
            mine, running = self._streams_of[tenant_id], self._streams_of.total()
            free = running < self._max_streams and mine < self._max_streams_per_tenant
            if free:
                self._streams_of[tenant_id] += 1
        if not free:
            busy = ResourceExhausted(
                f"{mine} of your streamed calls (exports, imports) "
                f"and {running} in all are running (server.max_streams_per_tenant "
                f"{self._max_streams_per_tenant}, server.max_streams {self._max_streams}); "
                "retry once one ends",
                reason="TOO_MANY_STREAMS",
            )
            context.abort_with_status(to_rpc_status(busy))
        try:
            yield
        finally:
            with self._streams_lock:
                self._streams_of[tenant_id] -= 1
                if not self._streams_of[tenant_id]:
                    del self._streams_of[tenant_id]

    @contextmanager
    def _key_stream(self, context: grpc.ServicerContext, key_id: str) -> Iterator[None]:
        if not key_id:  # the admin key or local mode: nothing to revoke
            yield
            return
        with self._streams_lock:
            self._streams_by_key.setdefault(key_id, set()).add(context)
        try:
            yield
        finally:
            with self._streams_lock:
                running = self._streams_by_key.get(key_id, set())
                running.discard(context)
                if not running:
                    self._streams_by_key.pop(key_id, None)

    def end_streams_of_key(self, key_id: str) -> None:
        """Cancel the streamed calls a revoked key opened. Each message is checked against the
        key too, but an import waiting for its client's next message, or an export its client
        does not read, would keep its stream slot until the server restarted (probe)."""
        with self._streams_lock:
            running = list(self._streams_by_key.pop(key_id, ()))
        for context in running:
            context.cancel()

    def wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._active:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def _finished(self, method: str, trace: CallTrace) -> None:
        # From the handler's start: time queued for a gRPC worker thread is not in it.
        took_ms = trace.elapsed_ms()
        self.call_times.record(method, took_ms, trace.outcome == "ok")
        if self._slow_call_ms > 0 and took_ms >= self._slow_call_ms:
            log.warning("slow call %s (%s): %.0f ms: %s", method, trace.outcome, took_ms, trace.summary())

    def _streaming(self, handler: Any, method: str, principal: Callable[[], Principal]) -> Any:
        behavior = handler.unary_stream or handler.stream_stream

        def streaming(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                caller = principal()  # before a stream slot: slots are shared out by tenant
            except Exception as exc:
                _fail(context, exc, method)
                raise  # unreachable: abort raises
            with (
                self._stream_slot(context, caller.tenant_id),
                self._key_stream(context, caller.key_id),
                self._in_flight(),
            ):
                yield from guarded(request, context, caller)

        def guarded(request: Any, context: grpc.ServicerContext, caller: Principal) -> Iterator[Any]:
            try:
                token = _PRINCIPAL.set(caller)
                try:
                    # The key is checked again at every message in and out, so a stream
                    # outlives its key's revocation by one message at most (probe: an
                    # import went on importing, an export on reading).
                    requests = _parsed(request)
                    if isinstance(requests, Iterator):
                        requests = _checked_each(requests, principal)
                    for response in behavior(requests, context):
                        principal()
                        yield response
                finally:
                    _PRINCIPAL.reset(token)
            except Exception as exc:
                _fail(context, exc, method)

        factory = (
            grpc.unary_stream_rpc_method_handler
            if handler.unary_stream
            else grpc.stream_stream_rpc_method_handler
        )
        return factory(
            streaming,
            request_deserializer=_tolerant(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        method: str = details.method
        if handler is None or method.startswith(OPEN_SERVICES):
            return handler
        metadata = details.invocation_metadata

        def principal() -> Principal:
            return self._authenticate(bearer_token(metadata))

        if handler.response_streaming:
            return self._streaming(handler, method, principal)

        behavior = handler.unary_unary or handler.stream_unary
        priority = COMPUTE_PRIORITY.get(method)

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            with self._in_flight(), traced() as trace:
                try:
                    return guarded_unary(request, context, trace)
                finally:
                    self._finished(method, trace)

        def guarded_unary(request: Any, context: grpc.ServicerContext, trace: CallTrace) -> Any:
            try:
                token = _PRINCIPAL.set(principal())
                try:
                    request = _parsed(request)
                    if priority is None:
                        return behavior(request, context)
                    # Tenants take turns at the gate.
                    with self._gate.slot(context.time_remaining(), priority, _PRINCIPAL.get().tenant_id):
                        mark("gate")
                        return behavior(request, context)
                finally:
                    _PRINCIPAL.reset(token)
            except Exception as exc:
                trace.outcome = exc.reason if isinstance(exc, MnemoError) else type(exc).__name__
                _fail(context, exc, method)
                raise  # unreachable: abort raises

        factory = (
            grpc.unary_unary_rpc_method_handler
            if handler.unary_unary
            else grpc.stream_unary_rpc_method_handler
        )
        return factory(
            unary,
            request_deserializer=_tolerant(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )
