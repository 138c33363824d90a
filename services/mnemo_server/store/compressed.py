"""zlib values the store writes (session candidates, outbox payloads), read back with a bound.

A stored value is data, not trust: a damaged or hostile one must fail as a ValueError
naming what it was, not make zlib allocate without limit (a few KB can inflate to
gigabytes) nor pass with bytes missing or left over."""

from __future__ import annotations

import zlib


def deflate(body: bytes) -> bytes:
    # Level 1: these values are written inside request paths, where level 6's extra ~10 %
    # smaller output costs 2-3x the time.
    return zlib.compress(body, 1)


def inflate(data: bytes, max_bytes: int, what: str) -> bytes:
    """The body of one whole zlib stream of at most max_bytes; ValueError naming `what`
    when it does not decompress, is longer, ends early or has bytes after its end."""
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(data, max_bytes)
    except zlib.error as exc:
        raise ValueError(f"{what} do not decompress: {exc}") from None
    if inflater.unconsumed_tail:
        raise ValueError(f"{what} decompress past {max_bytes} bytes")
    if not inflater.eof:
        raise ValueError(f"{what} end early")
    if inflater.unused_data:
        raise ValueError(f"{what} hold trailing bytes")
    return body
