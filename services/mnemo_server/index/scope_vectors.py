"""Each scope's vectors in memory, for exact vector search within scopes.

LanceDB's ANN search pays for a selective filter: at 100k rows, a search limited to one
project of ~5k rows (StartSession's pool: k 100 within the workspace, session and project
scopes) took 9.7–12.5 ms of CPU with the bitmap prefilter, where an exact scan of those
rows' vectors in memory took 0.6 ms (float32) and found the exact top 50 where the ANN
search found 99.5 % of it. So the index keeps every row's unit vector here, grouped by
scope, and a search filtered by scopes alone that covers few rows is answered from memory;
with the vector graph (which is built from these codes) there is no ANN index, and every
filtered search is answered here, limited to the ids that pass the rest of the filter
(`allowed`) when it filters on more than scopes (lance_index.py, _search_in_memory).

Vectors are kept as int8 with a scale per row (the unit vector / its largest component x
127: 388 bytes a row, ~37 MB per 100k rows, a quarter of float32). With MiniLM's vectors
(largest component ~0.16) one scale for all rows used ~5 bits: cosine error up to 0.012 and
recall@10 against exact search 0.966; a scale per row keeps the error under 0.0025 (mean
0.0003) and recall@10 at 0.993. Rows are kept in chunks of up to `CHUNK`: a write copies
one chunk at most. A search scans the chunks in one compiled call that holds no GIL
(kernels.py).

Writers (the index worker, under the table lock) build new chunk tuples and replace the
whole scope -> chunks mapping at once, so a search reads one consistent state without a
lock: a row changing scope is seen in one of them, never in both or neither.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from mnemo_server.index.kernels import scan_top, typed_list
from mnemo_server.index.scratch import ScratchArrays

CHUNK = 1024
_SCALE = 127.0
# A chunk's cosines during a search, shared by every tenant: one per search at once.
_ROW_COSINES = ScratchArrays(np.float32, kept=4)


# Row numbers shared by every chunk's position map (ints past 256 are objects of their own).
_ROW_NUMBERS = tuple(range(CHUNK))


@dataclass(frozen=True)
class _Chunk:
    ids: tuple[str, ...]
    codes: npt.NDArray[np.int8]  # len(ids) x dimension
    scales: npt.NDArray[np.float32]  # len(ids): a row's cosine = codes @ unit query x scale
    # id -> row, for the cosines of given rows (~40 bytes a row; ~0.03 ms a chunk to build).
    rows: Mapping[str, int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", dict(zip(self.ids, _ROW_NUMBERS, strict=False)))


def quantize(vectors: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float32]]:
    """Rows scaled to unit length, then to int8 codes and a scale per row."""
    matrix = np.asarray(vectors, dtype=np.float32).reshape(len(vectors), -1)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    unit = matrix / norms
    peak = np.abs(unit).max(axis=1, keepdims=True)
    peak[peak == 0] = 1.0
    codes: npt.NDArray[np.int8] = np.rint(unit / peak * _SCALE).astype(np.int8)
    scales: npt.NDArray[np.float32] = (peak[:, 0] / _SCALE).astype(np.float32)
    return codes, scales


def _chunked(
    ids: Sequence[str], codes: npt.NDArray[np.int8], scales: npt.NDArray[np.float32]
) -> list[_Chunk]:
    return [
        _Chunk(
            tuple(ids[start : start + CHUNK]),
            codes[start : start + CHUNK].copy(),
            scales[start : start + CHUNK].copy(),
        )
        for start in range(0, len(ids), CHUNK)
    ]


class ScopeVectors:
    """A tenant's indexed vectors by scope key. Not `loaded` until filled from the table
    (then kept by the index's own writes); searches must not use it before."""

    def __init__(self, dimension: int):
        self.dimension = dimension
        self.loaded = False
        self._state: Mapping[str, tuple[_Chunk, ...]] = {}

    def rows(self) -> int:
        return sum(len(c.ids) for chunks in self._state.values() for c in chunks)

    def rows_in(self, scopes: Iterable[str]) -> int:
        state = self._state
        return sum(len(c.ids) for s in set(scopes) for c in state.get(s, ()))

    def nbytes(self) -> int:
        return sum(c.codes.nbytes + c.scales.nbytes for chunks in self._state.values() for c in chunks)

    def snapshot(self) -> Iterator[tuple[tuple[str, ...], npt.NDArray[np.int8]]]:
        """Every row's int8 codes as (ids, codes) chunks, as the state is now (later writes
        are not in it). The cosine of two rows' codes is within ~0.0025 of their vectors'."""
        chunks = [c for chunks in self._state.values() for c in chunks]
        return ((c.ids, c.codes) for c in chunks)

    # --- writes (one writer at a time) -----------------------------------------------

    def load(self, batches: Iterable[tuple[Sequence[str], Sequence[str], npt.NDArray[np.float32]]]) -> None:
        """Fill from (ids, scopes, vectors) batches of the whole table, replacing any state."""
        ids_by: dict[str, list[str]] = {}
        codes_by: dict[str, list[npt.NDArray[np.int8]]] = {}
        scales_by: dict[str, list[npt.NDArray[np.float32]]] = {}
        for ids, scopes, vectors in batches:
            codes, scales = quantize(vectors)
            scope_arr = np.asarray(scopes, dtype=object)
            for scope in set(scopes):
                rows = np.flatnonzero(scope_arr == scope)
                ids_by.setdefault(scope, []).extend(ids[int(i)] for i in rows)
                codes_by.setdefault(scope, []).append(codes[rows])
                scales_by.setdefault(scope, []).append(scales[rows])
        self._state = {
            s: tuple(_chunked(ids_by[s], np.concatenate(codes_by[s]), np.concatenate(scales_by[s])))
            for s in ids_by
            if ids_by[s]
        }
        self.loaded = True

    def put(
        self,
        rows: Sequence[tuple[str, str, npt.NDArray[np.float32]]],
        previous_scopes: Mapping[str, str],
    ) -> None:
        """Write (id, scope, vector) rows; previous_scopes names the scope each id already
        present was in (its old copy is removed from there)."""
        state = dict(self._state)
        self._remove_from(state, previous_scopes)
        rows = list({r[0]: r for r in rows}.values())  # an id written twice: its last copy
        if not rows:
            self._state = state
            return
        by_scope: dict[str, list[int]] = {}
        for i, (_, scope, _) in enumerate(rows):
            by_scope.setdefault(scope, []).append(i)
        codes, scales = quantize(np.stack([v for _, _, v in rows]))
        for scope, positions in by_scope.items():
            ids = [rows[i][0] for i in positions]
            new, new_scales = codes[positions], scales[positions]
            chunks = list(state.get(scope, ()))
            if chunks and len(chunks[-1].ids) < CHUNK:
                last = chunks.pop()
                ids = [*last.ids, *ids]
                new = np.concatenate([last.codes, new])
                new_scales = np.concatenate([last.scales, new_scales])
            state[scope] = tuple(chunks + _chunked(ids, new, new_scales))
        self._state = state

    def remove(self, scopes_of: Mapping[str, str]) -> None:
        """Remove rows, given each id's scope."""
        state = dict(self._state)
        self._remove_from(state, scopes_of)
        self._state = state

    @staticmethod
    def _remove_from(state: dict[str, tuple[_Chunk, ...]], scopes_of: Mapping[str, str]) -> None:
        gone_by: dict[str, set[str]] = {}
        for mid, scope in scopes_of.items():
            gone_by.setdefault(scope, set()).add(mid)
        for scope, gone in gone_by.items():
            kept: list[_Chunk] = []
            for c in state.get(scope, ()):
                if gone.isdisjoint(c.ids):
                    kept.append(c)
                    continue
                keep = [i for i, mid in enumerate(c.ids) if mid not in gone]
                if keep:
                    kept.append(_Chunk(tuple(c.ids[i] for i in keep), c.codes[keep], c.scales[keep]))
            if kept:
                state[scope] = tuple(kept)
            else:
                state.pop(scope, None)

    # --- search ----------------------------------------------------------------------

    def cosines(self, vector: npt.NDArray[np.float32], scope_of: Mapping[str, str]) -> dict[str, float]:
        """The cosine of each given row (id -> its scope) with vector; rows not held are left
        out. A few dictionary lookups a row: for candidates another search found."""
        state = self._state
        held: list[tuple[str, _Chunk, int]] = []
        for mid, scope in scope_of.items():
            for c in state.get(scope, ()):
                row = c.rows.get(mid)
                if row is not None:
                    held.append((mid, c, row))
                    break
        if not held:
            return {}
        unit = np.asarray(vector, dtype=np.float32) / (float(np.linalg.norm(vector)) or 1.0)
        # One array from the rows' views: np.stack then a cast took twice as long (~33 us
        # against ~18 for 60 rows), a third of this call.
        codes = np.array([c.codes[row] for _, c, row in held], dtype=np.float32)
        scales = np.array([c.scales[row] for _, c, row in held], dtype=np.float32)
        cosines = (codes @ unit) * scales
        return {mid: float(cos) for (mid, _, _), cos in zip(held, cosines.tolist(), strict=True)}

    def search(
        self,
        vector: npt.NDArray[np.float32],
        k: int,
        scopes: Iterable[str] | None,
        allowed: AbstractSet[str] | None = None,
    ) -> list[tuple[str, float]]:
        """The k rows of these scopes (None: of every scope) most similar to vector, only
        rows whose ids are in `allowed` if given: (id, cosine), best first (equal cosines
        in the order of the scopes asked, then of the rows in them)."""
        state = self._state
        keys = state.keys() if scopes is None else dict.fromkeys(scopes)
        chunks = [c for s in keys for c in state.get(s, ())]
        if not chunks or k <= 0:
            return []
        norm = float(np.linalg.norm(vector)) or 1.0
        query = np.asarray(vector, dtype=np.float32) / norm
        # Rows are numbered through the chunks: a row's chunk is the last that starts at or
        # before it (no list of every id: 12.5k of them cost ~0.3 ms a search).
        starts = list(itertools.accumulate((len(c.ids) for c in chunks), initial=0))
        passing = None
        if allowed is not None:
            marks = (mid in allowed for c in chunks for mid in c.ids)
            passing = np.fromiter(marks, np.bool_, count=starts[-1])
        k = min(k, starts[-1])
        rows, cosines = np.empty(k, np.int32), np.empty(k, np.float64)
        row_cosines = _ROW_COSINES.take(CHUNK)
        kept = scan_top(
            typed_list([c.codes for c in chunks]), typed_list([c.scales for c in chunks]), query, passing, k,
            row_cosines, rows, cosines,
        )  # fmt: skip
        _ROW_COSINES.give_back(row_cosines)
        found = []
        for row, cosine in zip(rows[:kept].tolist(), cosines[:kept].tolist(), strict=True):
            n = bisect.bisect_right(starts, row) - 1
            found.append((chunks[n].ids[row - starts[n]], cosine))
        return found
