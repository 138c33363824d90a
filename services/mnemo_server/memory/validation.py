"""Input limits and checks. Every violation names the API field it concerns, so a caller
gets INVALID_ARGUMENT with e.g. ``requests[3].memory.content`` and nothing is written."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from mnemo_server.config import LimitsConfig
from mnemo_server.errors import FieldViolation, InvalidArgument
from mnemo_server.memory.model import MemoryDraft, MemoryFilter, ScopeKind, TimeRange

_PRINTABLE_ID = re.compile(r"^[\x21-\x7e]+$")  # visible ASCII, no spaces

# Objects and lists nested in metadata. Protobuf parsers stop at 100 nested messages, each
# level of a Struct takes up to three (Struct, map entry, Value) and a memory sits a few
# messages deep in a response: past ~30 levels a stored memory would make every Recall that
# returns it unreadable to clients.
MAX_METADATA_DEPTH = 16
MAX_FILTER_VALUES = 100  # scopes, categories or source session ids in one filter


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def check_unit_interval(value: float, field: str, out: list[FieldViolation]) -> None:
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        out.append(FieldViolation(field, "must be between 0 and 1"))


def check_time_range(tr: TimeRange, field: str, out: list[FieldViolation]) -> None:
    if tr.start_ns is not None and tr.end_ns is not None and tr.end_ns < tr.start_ns:
        out.append(FieldViolation(f"{field}.end_time", "must not be before start_time"))


class Validator:
    def __init__(self, limits: LimitsConfig):
        self.limits = limits

    def draft(self, d: MemoryDraft, prefix: str) -> list[FieldViolation]:
        lim = self.limits
        out: list[FieldViolation] = []
        if not d.content.strip():
            out.append(FieldViolation(_join(prefix, "content"), "must not be empty"))
        elif len(d.content) > lim.max_content_chars:
            out.append(
                FieldViolation(
                    _join(prefix, "content"),
                    f"is {len(d.content)} characters; the limit is {lim.max_content_chars}",
                )
            )
        if "\x00" in d.content:
            out.append(FieldViolation(_join(prefix, "content"), "must not contain NUL characters"))
        self.scope_id(d.scope.kind, d.scope.id, _join(prefix, "scope.id"), out)
        if len(d.category) > lim.max_category_chars:
            out.append(
                FieldViolation(_join(prefix, "category"), f"longer than {lim.max_category_chars} characters")
            )
        if d.external_id:
            self.identifier(d.external_id, _join(prefix, "external_id"), lim.max_external_id_chars, out)
        check_unit_interval(d.importance, _join(prefix, "importance"), out)
        check_unit_interval(d.confidence, _join(prefix, "confidence"), out)
        self.metadata(d.metadata, _join(prefix, "metadata"), out)
        for name in ("who", "why", "run_id", "session_id"):
            if len(getattr(d.source, name)) > lim.max_scope_id_chars:
                out.append(
                    FieldViolation(
                        _join(prefix, f"source.{name}"), f"longer than {lim.max_scope_id_chars} characters"
                    )
                )
        return out

    def scope_id(self, kind: ScopeKind, ident: str, field: str, out: list[FieldViolation]) -> None:
        if kind is ScopeKind.WORKSPACE:
            if ident not in ("", "default"):
                out.append(FieldViolation(field, 'the workspace scope id is always "default"'))
            return
        if not ident:
            out.append(FieldViolation(field, f"is required for a {kind.value} scope"))
            return
        self.identifier(ident, field, self.limits.max_scope_id_chars, out)

    @staticmethod
    def identifier(value: str, field: str, max_len: int, out: list[FieldViolation]) -> None:
        if len(value) > max_len:
            out.append(FieldViolation(field, f"longer than {max_len} characters"))
        elif not _PRINTABLE_ID.fullmatch(value):
            out.append(FieldViolation(field, "must be visible ASCII characters without spaces"))

    def metadata(self, metadata: dict[str, Any], field: str, out: list[FieldViolation]) -> None:
        size = len(json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
        if size > self.limits.max_metadata_bytes:
            out.append(
                FieldViolation(
                    field, f"is {size} bytes as JSON; the limit is {self.limits.max_metadata_bytes}"
                )
            )
        elif _depth(metadata) > MAX_METADATA_DEPTH:
            out.append(
                FieldViolation(field, f"nests objects and lists deeper than {MAX_METADATA_DEPTH} levels")
            )

    def request_id(self, request_id: str, field: str = "request_id") -> None:
        if request_id:
            out: list[FieldViolation] = []
            self.identifier(request_id, field, self.limits.max_request_id_chars, out)
            if out:
                raise InvalidArgument.many(out)

    def filter(self, f: MemoryFilter, prefix: str = "filter") -> list[FieldViolation]:
        out: list[FieldViolation] = []
        for i, scope in enumerate(f.scopes):
            self.scope_id(scope.kind, scope.id, f"{prefix}.scopes[{i}].id", out)
        check_time_range(f.create_time, f"{prefix}.create_time", out)
        check_time_range(f.event_time, f"{prefix}.event_time", out)
        for name in ("scopes", "categories", "source_session_ids"):
            if len(getattr(f, name)) > MAX_FILTER_VALUES:
                out.append(FieldViolation(f"{prefix}.{name}", f"holds more than {MAX_FILTER_VALUES} values"))
        return out

    def page_size(self, page_size: int, default: int = 50, field: str = "page_size") -> int:
        if page_size < 0 or page_size > self.limits.max_page_size:
            raise InvalidArgument(field, f"must be between 0 and {self.limits.max_page_size}")
        # 0 asks for the default page, which must fit the operator's limit too: a client that
        # does not know the limit can always page with 0.
        return page_size or min(default, self.limits.max_page_size)

    def top_k(self, top_k: int, field: str = "top_k") -> int:
        if top_k < 0 or top_k > self.limits.max_top_k:
            raise InvalidArgument(field, f"must be between 1 and {self.limits.max_top_k}")
        return top_k or 10


def _depth(value: Any) -> int:
    """Levels of objects and lists in a JSON value (a flat object is 1)."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def raise_if(violations: list[FieldViolation]) -> None:
    if violations:
        raise InvalidArgument.many(violations)
