"""Which content hashes may be stored in `memories`: a filter that spares most creates the
duplicate check's query.

Every CreateMemory looks up live memories with its content's hash before inserting. At 100k
rows that query was ~22 % of a lone create in-process (pyinstrument, 300 creates), paid
under the memories write lock, and almost every create is new content, so the query finds
nothing. A Bloom filter (two bits per hash in a fixed 2 MiB bitmap) answers "certainly never
stored" for those without a query; "may be stored" still goes to DuckDB, which decides.

It must never say "never stored" for a hash that is: every statement that stores a content
hash (`memory_repo.insert_many`, `memory_repo.update_columns`) adds it, inside the write
transaction, before COMMIT. A hash added by a transaction that rolls back, or one whose
memories were deleted since, stays: the filter only grows, and a false "may be stored" costs
only the query. With 2^24 bits and two bits per hash, 100k hashes give ~0.01 % false
positives and 1M ~1.3 %.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable

import duckdb
import numpy as np

_BITS = 24  # 2^24 bits = 2 MiB
_MASK = (1 << _BITS) - 1
_READ_BATCH = 20_000


def join_key(parts: Iterable[str]) -> str:
    """One filter key of several strings (a scope's parts, a tenant and a request id)."""
    return "\x1f".join(parts)


def _positions(content_hash: str) -> tuple[int, int]:
    # Any string works (stored hashes are SHA-256 hex, tests may store others); blake2b
    # spreads them evenly whatever their form.
    d = int.from_bytes(hashlib.blake2b(content_hash.encode(), digest_size=8).digest(), "little")
    return d & _MASK, (d >> _BITS) & _MASK


class ContentHashFilter:
    def __init__(self, *, saturated: bool = False):
        self._bits = np.zeros(1 << (_BITS - 3), dtype=np.uint8)
        # Saturated: says "may be stored" for everything (a read-only store, which never
        # inserts and so keeps no filter).
        self._saturated = saturated
        self._lock = threading.Lock()

    @classmethod
    def of_table(cls, con: duckdb.DuckDBPyConnection) -> ContentHashFilter:
        """A filter of every hash stored in `memories` (deleted rows too: cheaper than
        telling them apart, and harmless)."""
        return cls.of_query(con, "SELECT content_hash FROM memories")

    @classmethod
    def of_query(cls, con: duckdb.DuckDBPyConnection, sql: str) -> ContentHashFilter:
        """A filter of every row `sql` reads, each as `join_key` of its (string) columns."""
        f = cls()
        cur = con.cursor()
        try:
            cur.execute(sql)
            while batch := cur.fetchmany(_READ_BATCH):
                f.add(join_key(row) for row in batch)
        finally:
            cur.close()
        return f

    def add(self, hashes: Iterable[str]) -> None:
        spots = [p for h in hashes for p in _positions(h)]
        if not spots:
            return
        at = np.asarray(spots, dtype=np.int64)
        with self._lock:
            np.bitwise_or.at(self._bits, at >> 3, (1 << (at & 7)).astype(np.uint8))

    def may_contain(self, content_hash: str) -> bool:
        if self._saturated:
            return True
        bits = self._bits
        return all(bits[p >> 3] & (1 << (p & 7)) for p in _positions(content_hash))
