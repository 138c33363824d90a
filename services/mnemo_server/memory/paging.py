"""Opaque page tokens: the position plus a fingerprint of the query they belong to, so a
token reused with a different filter is rejected instead of silently skipping rows."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from typing import Any

from mnemo_server.errors import InvalidArgument


def query_fingerprint(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def encode_token(position: Any, fingerprint: str) -> str:
    raw = json.dumps({"p": position, "f": fingerprint}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(
    token: str, fingerprint: str, valid: Callable[[Any], bool], field: str = "page_token"
) -> Any:
    """The position in `token`, None for no token. `valid` says whether a position has the
    shape this listing issues: a token edited by hand must not reach the query."""
    if not token:
        return None
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        position, fp = data["p"], data["f"]
    except (ValueError, KeyError, TypeError):
        raise InvalidArgument(field, "is not a token this server issued") from None
    if fp != fingerprint:
        raise InvalidArgument(field, "belongs to a request with different parameters")
    if position is None or not valid(position):
        raise InvalidArgument(field, "is not a token this server issued")
    return position
