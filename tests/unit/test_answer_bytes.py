"""A memory's size in an answer is estimated from above, whatever its fields hold: pages
and export batches are cut by the estimate to fit a default 4 MiB client (memory/paging.py)."""

from __future__ import annotations

import uuid

import pytest

from mnemo_server.api.convert import memory_to_pb
from mnemo_server.config import LimitsConfig
from mnemo_server.memory.model import Memory, MemoryType, Scope, ScopeKind, Source
from mnemo_server.memory.paging import largest_memory_bytes, memory_bytes

_WIDE = "\U0001f600"  # 4 bytes of UTF-8


def _memory(**fields: object) -> Memory:
    base: dict[str, object] = {
        "id": str(uuid.uuid4()),
        "tenant_id": "t",
        "scope": Scope(ScopeKind.PROJECT, "p"),
        "type": MemoryType.SEMANTIC,
        "category": "c",
        "content": "x",
        "content_hash": "h" * 64,
        "event_time_ns": 1 << 62,
        "create_time_ns": 1 << 62,
        "update_time_ns": 1 << 62,
        "delete_time_ns": 1 << 62,
    }
    return Memory(**(base | fields))  # type: ignore[arg-type]


CASES = {
    "plain": _memory(),
    # 2 bytes of JSON a number, up to 11 as a protobuf Value: 44 KB against 8 KB of JSON.
    "numbers in a list": _memory(metadata={"l": [0] * 4000}),
    "nested lists": _memory(metadata={"a": [[[[]]]] * 500}),
    "many small keys": _memory(metadata={str(i): i % 2 == 0 for i in range(1500)}),
    "nulls and floats": _memory(metadata={"n": [None, 1.5e300, -0.0, True] * 500}),
    # Each text at its limit, in 4-byte characters: 6 KB beside the content (probe: a page
    # of 1,000 such memories, without content or metadata, was 4.9 MB).
    "wide texts, no metadata": _memory(
        category=_WIDE * 64,
        external_id=_WIDE * 256,
        scope=Scope(ScopeKind.PROJECT, _WIDE * 256),
        source=Source(_WIDE * 256, _WIDE * 256, _WIDE * 256, _WIDE * 256),
    ),
    "wide texts everywhere": _memory(
        content=_WIDE * 20_000,
        category=_WIDE * 64,
        external_id=_WIDE * 256,
        scope=Scope(ScopeKind.PROJECT, _WIDE * 256),
        source=Source(_WIDE * 256, _WIDE * 256, _WIDE * 256, _WIDE * 256),
        supersedes_id=str(uuid.uuid4()),
        superseded_by_id=str(uuid.uuid4()),
        metadata={_WIDE * 10: _WIDE * 1000},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_estimate_is_never_below_the_memorys_size_on_the_wire(name: str) -> None:
    m = CASES[name]
    sent = memory_to_pb(m).ByteSize()
    estimate = memory_bytes(m)
    assert sent <= estimate, (sent, estimate)
    assert estimate < 2 * sent + 1024  # and not so far above that pages shrink for nothing


def test_the_largest_memory_the_limits_allow_is_within_the_bound() -> None:
    limits = LimitsConfig()
    widest = CASES["wide texts everywhere"]
    assert memory_to_pb(widest).ByteSize() <= largest_memory_bytes(limits)
    # Metadata at its limit, made of the values that grow most as a Struct.
    listed = _memory(metadata={"l": [0] * (limits.max_metadata_bytes // 2 - 4)})
    assert memory_to_pb(listed).ByteSize() <= largest_memory_bytes(limits)
