"""Opaque page tokens: the position plus a fingerprint of the query they belong to, so a
token reused with a different filter is rejected instead of silently skipping rows."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from mnemo_server.config import LimitsConfig
from mnemo_server.errors import InvalidArgument

T = TypeVar("T")


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


# What one answer of a listing or an export carries at most, estimated. gRPC clients receive
# at most 4 MiB a message unless told otherwise (Node's and Python's defaults): a page of
# 1,000 memories, or an export batch of 500, of the 20,000 characters a memory may hold
# failed RESOURCE_EXHAUSTED in them though the server sent it (probe). Such a page holds
# fewer memories, with a token for the rest, as a page may.
ANSWER_BYTES = 3 << 20
_PER_MEMORY_BYTES = 512  # ids, times, numbers and field tags
_ID_CHARS = 36  # a memory id: a UUID


def largest_memory_bytes(limits: LimitsConfig) -> int:
    """What one memory may take in an answer at most, by the server's limits: 4 bytes a
    character of UTF-8 in each text (content, category, external id, scope id, the four of
    its source), and metadata at 6 bytes a byte of its limit (a number in a list: 2 bytes
    of JSON, up to 11 as a protobuf Value)."""
    texts = (
        limits.max_content_chars
        + limits.max_category_chars
        + limits.max_external_id_chars
        + 5 * limits.max_scope_id_chars  # the scope's id and the source's four fields
        + 2 * _ID_CHARS  # supersedes_id, superseded_by_id
    )
    return 4 * texts + 6 * limits.max_metadata_bytes + _PER_MEMORY_BYTES


def memory_bytes(m: Any) -> int:
    """A memory's size in an answer (a `Memory`), estimated from above: its texts in UTF-8,
    its metadata as the protobuf Struct it is sent as, and the fixed fields. The metadata's
    JSON length was the estimate, but a list of small numbers takes up to 5.5 times that as
    a Struct: a page of 100 memories with 8 KB of such JSON each was 4.4 MB (probe)."""
    source = m.source
    texts = (
        m.content,
        m.category,
        m.external_id,
        m.scope.id,
        source.who,
        source.why,
        source.run_id,
        source.session_id,
        m.supersedes_id,
        m.superseded_by_id,
    )
    meta = _value_bytes(m.metadata) if m.metadata else 0
    return sum(map(_text_bytes, texts)) + meta + _PER_MEMORY_BYTES


def _text_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


# Around each value, key and entry of a Struct: a field tag and a length, at most 4 bytes
# for anything under 2 MiB (a metadata's limit keeps it far under).
_WRAP = 4


def _value_bytes(value: Any) -> int:
    """A JSON-like value's size as a protobuf Value, from above (google.protobuf.Struct:
    a map entry holds its key and a Value; a number is a 9-byte double)."""
    if isinstance(value, str):
        return _text_bytes(value) + _WRAP
    if value is None or isinstance(value, bool):
        return 2 + _WRAP
    if isinstance(value, (int, float)):
        return 9 + _WRAP
    if isinstance(value, dict):
        return _WRAP + sum(_text_bytes(str(k)) + 3 * _WRAP + _value_bytes(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return _WRAP + sum(_value_bytes(v) + _WRAP for v in value)
    return _text_bytes(str(value)) + _WRAP


def row_bytes(row: Any) -> int:
    """A row's size in an answer, estimated from every text and value it holds (a
    dataclass, or lists and mappings of them), for listings whose rows have no estimate of
    their own. Cheap enough for a page: a field walk, no serialization but of mappings."""
    if isinstance(row, str):
        return _text_bytes(row)
    if isinstance(row, bytes):
        return len(row)
    if isinstance(row, (list, tuple, set, frozenset)):
        return sum(row_bytes(v) for v in row) + 2 * len(row)
    if isinstance(row, dict):
        return len(json.dumps(row, separators=(",", ":"), default=str))
    if dataclasses.is_dataclass(row) and not isinstance(row, type):
        return sum(row_bytes(getattr(row, f.name)) + 4 for f in dataclasses.fields(row))
    return 8  # a number, a flag, None


def fitting(items: Sequence[T], size_of: Callable[[T], int], largest: int, budget: int = ANSWER_BYTES) -> int:
    """How many of `items`, from the first, fit `budget` (at least one: a single memory fits
    any client that takes the memory's own limits). `largest`, what one item may take at
    most, spares the estimate when all of them cannot pass the budget (the usual page)."""
    if len(items) * largest <= budget:
        return len(items)
    used = 0
    for n, item in enumerate(items):
        used += size_of(item)
        if used > budget:
            return max(1, n)
    return len(items)
