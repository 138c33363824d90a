"""The one place domain errors become gRPC statuses, with google.rpc details:
ErrorInfo (UPPER_SNAKE reason, domain, metadata) always, BadRequest for field violations."""

from __future__ import annotations

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


def to_rpc_status(exc: errors.MnemoError) -> grpc.Status:
    code = status_code_for(exc)
    details = [
        _pack(error_details_pb2.ErrorInfo(reason=exc.reason, domain=ERROR_DOMAIN, metadata=exc.metadata))
    ]
    if isinstance(exc, errors.InvalidArgument):
        details.append(
            _pack(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
                        for v in exc.violations
                    ]
                )
            )
        )
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=exc.message, details=details)
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
