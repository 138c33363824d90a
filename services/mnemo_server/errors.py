"""The domain's error hierarchy.

Domain code raises these; exactly one place (``api.errors``) maps them to gRPC status codes
with ``google.rpc`` details. Messages are written for the API's users: they name the field
or resource and never carry Python class names or stack traces.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


class MnemoError(Exception):
    """Base class. ``reason`` is an UPPER_SNAKE identifier clients can switch on."""

    default_reason = "ERROR"

    def __init__(self, message: str, *, reason: str | None = None, metadata: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata = dict(metadata or {})


class InvalidArgument(MnemoError):
    default_reason = "INVALID_ARGUMENT"

    def __init__(self, field: str, description: str, *, reason: str | None = None):
        super().__init__(f"{field}: {description}", reason=reason, metadata={"field": field})
        self.violations = [FieldViolation(field, description)]

    @classmethod
    def many(cls, violations: list[FieldViolation]) -> InvalidArgument:
        first = violations[0]
        err = cls(first.field, first.description)
        err.violations = list(violations)
        if len(violations) > 1:
            err.message = "; ".join(f"{v.field}: {v.description}" for v in violations)
            err.args = (err.message,)
        return err


class NotFound(MnemoError):
    default_reason = "NOT_FOUND"

    def __init__(self, resource: str, ident: str, field: str = ""):
        """`field`: the request field that named it, when that is not the call's own subject."""
        super().__init__(
            f"{field + ': ' if field else ''}{resource} {ident!r} not found",
            reason=f"{resource.upper()}_NOT_FOUND",
            metadata={"resource": resource, "id": ident, **({"field": field} if field else {})},
        )


class AlreadyExists(MnemoError):
    default_reason = "ALREADY_EXISTS"


class FailedPrecondition(MnemoError):
    default_reason = "FAILED_PRECONDITION"


class Unauthenticated(MnemoError):
    default_reason = "UNAUTHENTICATED"


class PermissionDenied(MnemoError):
    default_reason = "PERMISSION_DENIED"


class ResourceExhausted(MnemoError):
    default_reason = "RESOURCE_EXHAUSTED"


class Unavailable(MnemoError):
    default_reason = "UNAVAILABLE"


class DeadlineExceeded(MnemoError):
    default_reason = "DEADLINE_EXCEEDED"


class Cancelled(MnemoError):
    """The caller cancelled the call (or went away): its work stops, and nobody reads this."""

    default_reason = "CANCELLED"


class Aborted(MnemoError):
    """A concurrent write won: nothing of this one was written, and a retry is safe."""

    default_reason = "ABORTED"


class EmbeddingModelMismatch(FailedPrecondition):
    """The store was embedded with another model; `mnemo reembed` resolves it."""

    default_reason = "EMBEDDING_MODEL_MISMATCH"


# How a full disk reads in the stores' own errors: DuckDB and LanceDB report the OS's words
# in their messages (no errno), SQLite (the sidecar's pair store) its own.
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_WORDS = ("No space left on device", "Disk quota exceeded", "database or disk is full")


def is_storage_full(exc: BaseException) -> bool:
    """Whether an error, or one in its chain, says the disk is full."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _FULL_ERRNOS:
            return True
        if any(words in str(seen) for words in _FULL_WORDS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
