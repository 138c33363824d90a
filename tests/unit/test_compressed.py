"""store.compressed: what the store deflates comes back whole, and a stored value that is
not one whole stream within its bound is a ValueError naming it."""

from __future__ import annotations

import zlib

import pytest

from mnemo_server.store.compressed import deflate, inflate

BODY = b"the deploy pipeline runs on Thursdays " * 200


def test_what_is_deflated_inflates_back() -> None:
    packed = deflate(BODY)
    assert len(packed) < len(BODY) / 10
    assert inflate(packed, len(BODY), "the test's bytes") == BODY


@pytest.mark.parametrize(
    ("stored", "bound", "message"),
    [
        (deflate(BODY), len(BODY) - 1, "the test's bytes decompress past 7599 bytes"),
        (deflate(BODY)[:-6], len(BODY), "the test's bytes end early"),
        (deflate(BODY) + b"\0", len(BODY), "the test's bytes hold trailing bytes"),
        (b"not zlib at all", len(BODY), "the test's bytes do not decompress"),
        (b"", len(BODY), "the test's bytes end early"),
    ],
)
def test_a_value_that_is_not_one_whole_stream_within_the_bound_is_refused(
    stored: bytes, bound: int, message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        inflate(stored, bound, "the test's bytes")


def test_a_small_value_cannot_make_it_allocate_past_the_bound() -> None:
    bomb = zlib.compress(b"\0" * (64 << 20), 9)  # 64 MB of zeros in ~64 KB
    assert len(bomb) < 100_000
    with pytest.raises(ValueError, match="decompress past 1048576 bytes"):
        inflate(bomb, 1 << 20, "a bomb's bytes")
