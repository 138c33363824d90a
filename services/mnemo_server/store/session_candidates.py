"""A session's candidates packed into one value of its `sessions` row.

StartSession records every candidate of its pool (~60) with its features, so that the
session's end can turn them into training pairs. As rows of their own (a table with an
index on the session, the features as JSON) that record was ~40 % of a StartSession's CPU
in-process at 100k memories: building the rows 1.3 ms, inserting 60 of them and COMMIT
2.4 ms, and EndSession read them back in 2.0 ms. Packed into one BLOB of the session's
row, the insert and COMMIT take 1.2 ms, packing 0.06 ms and reading back 0.5 ms (DuckDB
1.4 on this machine, a copy of the bench's settled store).

The layout is columnar: a header (magic, candidate count, features per candidate), the
integer columns as int32, the scores as float32, the features as one float32 matrix, then
the memory ids and origins as UTF-8 with their byte lengths. Scores and features were
FLOAT columns or reach the sidecar as protobuf `float` anyway, so float32 loses nothing the
ranker sees. A blob that does not parse raises ValueError: it is never guessed at.

Since "MSC2" everything after the header is zlib-compressed (level 1), with the feature
matrix stored feature by feature (a feature's values across candidates repeat: types,
flags, zeros): 13.3 KB a session becomes 3.4 KB (3.9x). Packing takes ~0.23 ms and
reading ~0.15 ms in all (compressing ~0.1 ms and decompressing 0.05 ms of that). Why it
matters: these blobs were two thirds of what DuckDB's write-ahead log took in under the
bench's mix (~0.45 MB/s), and every 16 MB of log DuckDB checkpoints inside a COMMIT,
stopping every read and write of the store for 0.3-0.6 s (1.6 s seen after a fresh 100k
load); a smaller log means rarer, shorter stops, and a smaller file. "MSC1"
values (uncompressed, features candidate by candidate) written before are still read."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mnemo_server.store.compressed import deflate, inflate

_MAGIC_PLAIN, _MAGIC = b"MSC1", b"MSC2"
_HEADER = struct.Struct("<4sII")  # magic, candidates, features per candidate
_INTS = ("candidate_ord", "injected_rank", "baseline_rank", "predictor_rank", "tokens")
_FLOATS = ("baseline_score", "predictor_score", "final_score")
# Far above any session's (60 candidates x 100 features is ~30 KB): a bound on what a
# damaged value can make zlib allocate.
_MAX_BODY_BYTES = 64 << 20


@dataclass
class SessionMemoryRow:
    memory_id: str
    candidate_ord: int
    injected_rank: int  # 0: a candidate that was not injected
    origin: str
    baseline_score: float
    baseline_rank: int
    predictor_score: float
    predictor_rank: int
    final_score: float
    tokens: int
    features: list[float]
    relevance: float | None = None
    relevance_source: str = ""


def _strings(values: Sequence[str]) -> bytes:
    encoded = [v.encode() for v in values]
    return np.array([len(e) for e in encoded], dtype="<u4").tobytes() + b"".join(encoded)


def pack(members: Sequence[SessionMemoryRow]) -> bytes:
    """The candidates (in order) as bytes; relevance is not part of it (it comes later)."""
    n, width = len(members), len(members[0].features) if members else 0
    if any(len(m.features) != width for m in members):
        raise ValueError("every candidate of a session has the same features")
    ints = np.array([[getattr(m, c) for c in _INTS] for m in members], dtype="<i4").reshape(n, len(_INTS))
    floats = np.array([[getattr(m, c) for c in _FLOATS] for m in members], dtype="<f4").reshape(
        n, len(_FLOATS)
    )
    features = np.array([m.features for m in members], dtype="<f4").reshape(n, width)
    parts = [np.ascontiguousarray(ints.T).tobytes()]  # column by column
    parts.append(np.ascontiguousarray(floats.T).tobytes())
    parts.append(np.ascontiguousarray(features.T).tobytes())  # feature by feature
    parts.append(_strings([m.memory_id for m in members]))
    parts.append(_strings([m.origin for m in members]))
    return _HEADER.pack(_MAGIC, n, width) + deflate(b"".join(parts))


class _Reader:
    def __init__(self, blob: bytes, at: int = 0):
        self.blob = blob
        self.at = at

    def array(self, dtype: str, count: int) -> np.ndarray:
        size = np.dtype(dtype).itemsize * count
        if self.at + size > len(self.blob):
            raise ValueError("packed session candidates end early")
        out = np.frombuffer(self.blob, dtype=dtype, count=count, offset=self.at)
        self.at += size
        return out

    def strings(self, count: int) -> list[str]:
        lengths = self.array("<u4", count).tolist()
        out = []
        for n in lengths:
            if self.at + n > len(self.blob):
                raise ValueError("packed session candidates end early")
            out.append(self.blob[self.at : self.at + n].decode())
            self.at += n
        return out


def unpack(blob: bytes | None) -> list[SessionMemoryRow]:
    """The candidates `pack` wrote (None: a session recorded without any)."""
    if blob is None:
        return []
    if len(blob) < _HEADER.size:
        raise ValueError("packed session candidates end early")
    magic, n, width = _HEADER.unpack_from(blob)
    if magic == _MAGIC:
        r = _Reader(inflate(blob[_HEADER.size :], _MAX_BODY_BYTES, "packed session candidates"))
    elif magic == _MAGIC_PLAIN:
        r = _Reader(blob, _HEADER.size)
    else:
        raise ValueError(f"not packed session candidates (magic {magic!r})")
    ints = r.array("<i4", n * len(_INTS)).reshape(len(_INTS), n).T.tolist()
    floats = r.array("<f4", n * len(_FLOATS)).reshape(len(_FLOATS), n).T.tolist()
    if magic == _MAGIC:
        features = r.array("<f4", n * width).reshape(width, n).T.tolist()
    else:
        features = r.array("<f4", n * width).reshape(n, width).tolist()
    ids, origins = r.strings(n), r.strings(n)
    if r.at != len(r.blob):
        raise ValueError("packed session candidates hold trailing bytes")
    return [
        SessionMemoryRow(
            memory_id=ids[i],
            candidate_ord=ints[i][0],
            injected_rank=ints[i][1],
            origin=origins[i],
            baseline_score=floats[i][0],
            baseline_rank=ints[i][2],
            predictor_score=floats[i][1],
            predictor_rank=ints[i][3],
            final_score=floats[i][2],
            tokens=ints[i][4],
            features=features[i],
        )
        for i in range(n)
    ]
