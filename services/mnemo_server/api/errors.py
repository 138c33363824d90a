"""The one place domain errors become gRPC statuses, with google.rpc details:
ErrorInfo (UPPER_SNAKE reason, domain, metadata) always, BadRequest for field violations."""

from __future__ import annotations

import duckdb
import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from mnemo_server import errors

ERROR_DOMAIN = "mnemo.dev"

_CODES: list[tuple[type[errors.MnemoError], grpc.StatusCode]] = [
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.Aborted, grpc.StatusCode.ABORTED),
    (errors.Cancelled, grpc.StatusCode.CANCELLED),
]


def status_code_for(exc: errors.MnemoError) -> grpc.StatusCode:
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def _pack(msg: object) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(msg)  # type: ignore[arg-type]
    return packed


# A status travels in the response's trailers, which clients refuse past 8-16 KB: an id or
# a list of violations echoed whole (a 10,000-character id, an import of 500 bad entries) would
# turn the intended error into RESOURCE_EXHAUSTED on the client. The limits are UTF-8 bytes,
# not characters: the message goes out percent-encoded (3 bytes for each non-ASCII byte) and
# again inside the base64 status, so 1,000 emoji (4 bytes each) came to 17 KB of trailers.
MAX_MESSAGE_BYTES = 1_000
MAX_DETAIL_BYTES = 200
MAX_VIOLATIONS = 20


def _cut(text: str, limit: int) -> str:
    """Text within `limit` UTF-8 bytes, cut at a character, saying how much was left out."""
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= limit:
        return text
    kept = encoded[:limit].decode("utf-8", "ignore")  # a character cut in two is dropped
    return f"{kept}… ({len(text) - len(kept)} more characters)"


def to_rpc_status(exc: errors.MnemoError) -> grpc.Status:
    code = status_code_for(exc)
    metadata = {k: _cut(v, MAX_DETAIL_BYTES) for k, v in exc.metadata.items()}
    details = [_pack(error_details_pb2.ErrorInfo(reason=exc.reason, domain=ERROR_DOMAIN, metadata=metadata))]
    message = exc.message
    if isinstance(exc, errors.InvalidArgument):
        shown = exc.violations[:MAX_VIOLATIONS]
        if len(exc.violations) > len(shown):
            listed = "; ".join(f"{v.field}: {v.description}" for v in shown)
            message = f"{len(exc.violations)} fields are invalid, the first {len(shown)}: {listed}"
        details.append(
            _pack(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(
                            field=_cut(v.field, MAX_DETAIL_BYTES),
                            description=_cut(v.description, MAX_DETAIL_BYTES),
                        )
                        for v in shown
                    ]
                )
            )
        )
    status = status_pb2.Status(
        code=getattr(code_pb2, code.name), message=_cut(message, MAX_MESSAGE_BYTES), details=details
    )
    result: grpc.Status = rpc_status.to_status(status)
    return result


def internal_status(incident: str) -> grpc.Status:
    status = status_pb2.Status(
        code=code_pb2.INTERNAL,
        message=f"internal error (incident {incident}; details are in the server log)",
        details=[
            _pack(
                error_details_pb2.ErrorInfo(
                    reason="INTERNAL", domain=ERROR_DOMAIN, metadata={"incident": incident}
                )
            )
        ],
    )
    result: grpc.Status = rpc_status.to_status(status)
    return result


def storage_full(exc: BaseException, incident: str) -> errors.ResourceExhausted | None:
    """The error for a call that failed because the server's disk is full, or DuckDB's
    memory limit was reached, else None. A client can tell it from a bug (INTERNAL) and
    retry: once space is freed, or once the queries beside it are done. The write that
    failed was rolled back (a streamed import keeps the batches committed before it)."""
    if _store_out_of_memory(exc):
        # Queries of several calls at once past storage.duckdb_memory_limit (probe: four
        # exports of large memories, and another tenant's exports and lists failed INTERNAL).
        return errors.ResourceExhausted(
            "the store's memory limit was reached by the queries running at once; retry "
            f"shortly (incident {incident})",
            reason="STORE_MEMORY_LIMIT",
            metadata={"incident": incident},
        )
    if not errors.is_storage_full(exc):
        return None
    return errors.ResourceExhausted(
        "the server's storage is full: the write in progress was rolled back; "
        f"retry once space is freed (incident {incident})",
        reason="STORAGE_FULL",
        metadata={"incident": incident},
    )


def _store_out_of_memory(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, duckdb.OutOfMemoryException):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
