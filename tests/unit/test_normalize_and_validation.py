"""Content normalisation, category sanitising, validation limits, page tokens, filters."""

from __future__ import annotations

import hashlib

import pytest

from mnemo_server.config import LimitsConfig
from mnemo_server.errors import InvalidArgument
from mnemo_server.index.lance_index import filter_sql
from mnemo_server.memory.model import MemoryDraft, MemoryFilter, MemoryType, Scope, ScopeKind, TimeRange
from mnemo_server.memory.normalize import normalize_content, sanitize_category
from mnemo_server.memory.paging import decode_token, encode_token
from mnemo_server.memory.validation import Validator


def test_normalize_collapses_whitespace_and_keeps_case() -> None:
    n = normalize_content("  Deployed\tv2.1 \n\n to Staging!!  ")
    assert n.storage == "Deployed v2.1 to Staging!!"
    assert n.normalized == "deployed v2.1 to staging"
    assert n.hash == hashlib.sha256(b"deployed v2.1 to staging").hexdigest()


def test_trailing_punctuation_and_case_do_not_change_the_hash() -> None:
    assert normalize_content("User likes tea.").hash == normalize_content("user likes tea").hash
    assert normalize_content("User likes tea").hash != normalize_content("User likes coffee").hash


def test_punctuation_only_content_hashes_its_storage_form() -> None:
    n = normalize_content("?!")
    assert n.normalized == ""
    assert n.hash == hashlib.sha256(b"?!").hexdigest()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("Prefs", "prefs"), ("UI Prefs!", "ui_prefs_"), ("", "general"), ("a-b.c", "a_b_c"), ("ok_1", "ok_1")],
)
def test_sanitize_category(raw: str, expected: str) -> None:
    assert sanitize_category(raw) == expected


def _fields(d: MemoryDraft) -> list[str]:
    return [
        v.field
        for v in Validator(LimitsConfig(max_content_chars=50, max_metadata_bytes=40)).draft(d, "memory")
    ]


def test_validator_names_each_bad_field() -> None:
    assert _fields(MemoryDraft(content="ok")) == []
    assert _fields(MemoryDraft(content="   ")) == ["memory.content"]
    assert _fields(MemoryDraft(content="x" * 51)) == ["memory.content"]
    assert _fields(MemoryDraft(content="ok", importance=1.5)) == ["memory.importance"]
    assert _fields(MemoryDraft(content="ok", confidence=float("nan"))) == ["memory.confidence"]
    assert _fields(MemoryDraft(content="ok", scope=Scope(ScopeKind.PROJECT, ""))) == ["memory.scope.id"]
    assert _fields(MemoryDraft(content="ok", scope=Scope(ScopeKind.WORKSPACE, "other"))) == [
        "memory.scope.id"
    ]
    assert _fields(MemoryDraft(content="ok", external_id="has space")) == ["memory.external_id"]
    assert _fields(MemoryDraft(content="ok", external_id="trailing-newline\n")) == ["memory.external_id"]
    assert _fields(MemoryDraft(content="ok", metadata={"k": "v" * 50})) == ["memory.metadata"]
    assert _fields(MemoryDraft(content="a\x00b")) == ["memory.content"]


def test_page_size_and_top_k_bounds() -> None:
    v = Validator(LimitsConfig())
    assert v.page_size(0) == 50 and v.top_k(0) == 10
    with pytest.raises(InvalidArgument):
        v.page_size(1001)
    with pytest.raises(InvalidArgument):
        v.top_k(101)
    with pytest.raises(InvalidArgument):
        v.top_k(-1)


def _is_int(position: object) -> bool:
    return type(position) is int


def test_page_tokens_are_bound_to_their_query() -> None:
    token = encode_token(42, "fp1")
    assert decode_token(token, "fp1", _is_int) == 42
    assert decode_token("", "fp1", _is_int) is None
    with pytest.raises(InvalidArgument, match="different parameters"):
        decode_token(token, "fp2", _is_int)
    with pytest.raises(InvalidArgument, match="not a token"):
        decode_token("garbage!!", "fp1", _is_int)


@pytest.mark.parametrize("position", [None, True, "42", [42], {"p": 1}, 4.2])
def test_page_tokens_with_positions_of_another_shape_are_refused(position: object) -> None:
    with pytest.raises(InvalidArgument, match="not a token"):
        decode_token(encode_token(position, "fp1"), "fp1", _is_int)


def test_filter_sql_quotes_values_and_matches_python() -> None:
    f = MemoryFilter(
        scopes=(Scope(ScopeKind.PROJECT, "o'brien"),),
        types=(MemoryType.EPISODIC,),
        event_time=TimeRange(10, 20),
    )
    sql = filter_sql(f)
    assert sql == (
        "scope IN ('project:o''brien') AND type IN ('episodic') AND event_time_ns >= 10 "
        "AND event_time_ns < 20"
    )
    assert filter_sql(MemoryFilter()) is None
