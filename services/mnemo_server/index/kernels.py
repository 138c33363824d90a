"""Search kernels compiled with numba that run without the GIL: BM25 over the full-text
postings (text_postings.py), and the exact scan of a scope's int8 vectors (scope_vectors.py),
each with its top k.

Why compiled: the numpy versions took many numpy calls a search (BM25: ~15 a query term;
the scan: 5 a chunk of 1,024 rows), and each call on a large array lets go of the GIL and
must wait to take it back. Beside one busy Python thread, BM25 searches at 100k rows fell
from ~820/s on two threads to ~30/s, scope scans of 12.5k rows from ~300/s to ~12/s
(issue 3, stop 49's note). A kernel lets go of the GIL once a search, and its loops cost
less than the numpy calls: BM25 0.4 ms against 1.1.

The BM25 arithmetic is numpy's, operation for operation (float32 a posting, float64 sums in
term order), so its scores equal the numpy version's bit for bit, and LanceDB's up to its
own rounding (tests/unit/test_text_postings.py). The scan's dot products add in any order
(fastmath reassociation, so they vectorise): float32 rounding differs from BLAS's by ~1e-7.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit
from numba.typed import List

log = logging.getLogger(__name__)

K1, B = 1.2, 0.75

# A source of postings: (slots, term frequencies, each query term's start, its end).
Source = tuple[npt.NDArray[np.int32], npt.NDArray[np.uint16], npt.NDArray[np.int64], npt.NDArray[np.int64]]
# A query's postings: (folded source, buffered source, each term's repeats in the query).
Query = tuple[Source, Source, npt.NDArray[np.int64]]
# What BM25 reads of the table: (each slot's length, alive, check_alive, scope code,
# wanted_scope (by scope code), check_scope, live rows, average live length).
Table = tuple[
    npt.NDArray[np.float32],
    npt.NDArray[np.bool_],
    bool,
    npt.NDArray[np.int32],
    npt.NDArray[np.bool_],
    bool,
    int,
    float,
]


def _compile(fn: Callable[..., Any], **options: Any) -> Any:
    """njit with an on-disk cache (a later process loads it in ~0.1 s instead of compiling
    for ~1 s), or without one where no cache directory is writable: numba refuses to cache
    then, and compiling once a process is only slower."""
    try:
        return njit(cache=True, **options)(fn)
    except RuntimeError as e:
        log.warning("search kernel not cached on disk (%s): it is compiled once a process", e)
        return njit(cache=False, **options)(fn)


# A kernel offers each candidate to its heap in its own loop, comparing with the root
# inline: through a helper function (even one numba inlines) the 20k offers of a common
# term's hits took BM25 at 100k rows from 0.5 to 0.9-1.1 ms a search.
def _ranks_below(score: float, slot: int, other_score: float, other_slot: int) -> bool:
    """Whether (score, slot) ranks below (other_score, other_slot): equal scores rank by slot."""
    return score < other_score or (score == other_score and slot > other_slot)


_worse = _compile(_ranks_below, inline="always")


@_compile
def _sift_down(
    slots: npt.NDArray[np.int32], scores: npt.NDArray[np.float64], size: int, slot: int, score: float
) -> None:
    """Put (slot, score) in the root's place of the min-heap slots/scores[:size] (the root
    ranks worst), moving it down past every child that ranks below it."""
    at = 0
    while True:
        child = 2 * at + 1
        if child >= size:
            break
        right = child + 1
        if right < size and _worse(scores[right], slots[right], scores[child], slots[child]):
            child = right
        if not _worse(scores[child], slots[child], score, slot):
            break
        slots[at], scores[at] = slots[child], scores[child]
        at = child
    slots[at], scores[at] = slot, score


@_compile
def _sift_up(
    slots: npt.NDArray[np.int32], scores: npt.NDArray[np.float64], at: int, slot: int, score: float
) -> None:
    """Put (slot, score) at the heap's new end `at`, moving it up past every parent that
    ranks above it."""
    while at > 0:
        up = (at - 1) // 2
        if not _worse(score, slot, scores[up], slots[up]):
            break
        slots[at], scores[at] = slots[up], scores[up]
        at = up
    slots[at], scores[at] = slot, score


@_compile
def _sort_best(slots: npt.NDArray[np.int32], scores: npt.NDArray[np.float64], kept: int) -> None:
    """Heap sort the min-heap slots/scores[:kept] in place, best first: the worst moves to
    the end each time."""
    for end in range(kept - 1, 0, -1):
        slot, score = slots[end], scores[end]
        slots[end], scores[end] = slots[0], scores[0]
        _sift_down(slots, scores, end, slot, score)


@_compile
def _sum_scores(
    query: Query, table: Table, sums: npt.NDArray[np.float64], hits: npt.NDArray[np.int32]
) -> int:
    """Adds each query term's BM25 score into sums[slot] for the slots its postings name,
    writes each slot hit once to `hits`, and returns how many. See bm25_top."""
    folded, buffered, repeats = query
    lengths, alive, check_alive, scope_of, wanted_scope, check_scope, rows, average = table
    c1 = np.float32(K1 * B / average)
    c2 = np.float32(K1 * (1.0 - B))
    hit = 0
    for t in range(len(repeats)):
        live = 0
        for docs, _, starts, ends in (folded, buffered):
            if not check_alive:
                live += ends[t] - starts[t]
            else:
                for p in range(starts[t], ends[t]):
                    live += alive[docs[p]]
        if live == 0:
            continue
        idf = repeats[t] * math.log(1.0 + (rows - live + 0.5) / (live + 0.5))
        weight = np.float32(idf * (K1 + 1.0))
        for docs, tfs, starts, ends in (folded, buffered):
            for p in range(starts[t], ends[t]):
                slot = docs[p]
                if (check_alive and not alive[slot]) or (check_scope and not wanted_scope[scope_of[slot]]):
                    continue
                tf = np.float32(tfs[p])
                # idf x tf (k1 + 1) / (tf + k1 (1 - b + b len / avg)), in float32 as numpy did
                score = (tf * weight) / (lengths[slot] * c1 + c2 + tf)
                if sums[slot] == 0.0:  # every term score is positive: a first hit
                    hits[hit] = slot
                    hit += 1
                sums[slot] += score
    return hit


def _bm25_top(
    query: Query,
    table: Table,
    k: int,
    sums: npt.NDArray[np.float64],
    out_slots: npt.NDArray[np.int32],
    out_scores: npt.NDArray[np.float64],
) -> int:
    """Scores the slots that the query's terms' postings name, and writes the k best to
    out_*, best first, equal scores in slot order; returns how many it wrote.

    Term t's postings are those of each of the query's sources, folded then buffered:
    docs/tfs[starts[t]:ends[t]]; a term repeated in the query counts `repeats[t]` times.
    From the table: with check_alive, postings of slots not `alive` are skipped; with
    check_scope, slots whose scope code `wanted_scope` does not mark, after the term's
    document frequency is counted, as for any filter (BM25's statistics, `rows` and the
    `average` length, are over the tenant's live rows). `sums` is a zeroed scratch array
    over all slots and is left zeroed; out_* hold at least as many entries as there are
    postings (out_slots first lists the slots hit)."""
    hit = _sum_scores(query, table, sums, out_slots)
    # The k best in out_*[:kept], a heap. Slots hit are read from out_slots[i], i >= kept:
    # the heap never overtakes them.
    kept = 0
    for i in range(hit):
        slot = out_slots[i]
        score = sums[slot]
        sums[slot] = 0.0
        if kept < k:
            _sift_up(out_slots, out_scores, kept, slot, score)
            kept += 1
        elif _worse(out_scores[0], out_slots[0], score, slot):
            _sift_down(out_slots, out_scores, kept, slot, score)
    _sort_best(out_slots, out_scores, kept)
    return kept


bm25_top = _compile(_bm25_top, nogil=True)


def _row_cosines(
    codes: npt.NDArray[np.int8], query: npt.NDArray[np.float32], out: npt.NDArray[np.float32]
) -> None:
    """out[i] = codes[i] . query, in float32 (added in any order: vectorised)."""
    for i in range(codes.shape[0]):
        total = np.float32(0.0)
        for j in range(codes.shape[1]):
            total += np.float32(codes[i, j]) * query[j]
        out[i] = total


_cosines = _compile(_row_cosines, fastmath={"reassoc", "contract", "nsz"})


def _scan_top(
    codes: Any,  # a numba typed List of int8 (rows x dimension) arrays, one a chunk
    scales: Any,  # a typed List of float32 arrays: each chunk's rows' scales
    query: npt.NDArray[np.float32],
    allowed: npt.NDArray[np.bool_] | None,
    k: int,
    row_cosines: npt.NDArray[np.float32],
    out_rows: npt.NDArray[np.int32],
    out_scores: npt.NDArray[np.float64],
) -> int:
    """The k rows of the chunks with the highest cosine (codes . unit query x scale) to
    out_*, best first, equal cosines in row order; returns how many. Rows are numbered
    through the chunks in order; with `allowed`, only rows it marks. row_cosines holds a
    chunk's rows; out_* hold k."""
    kept = 0
    base = 0
    for n in range(len(codes)):
        chunk, chunk_scales = codes[n], scales[n]
        _cosines(chunk, query, row_cosines)
        for i in range(chunk.shape[0]):
            if allowed is None or allowed[base + i]:
                row, score = base + i, np.float64(row_cosines[i] * chunk_scales[i])
                if kept < k:
                    _sift_up(out_rows, out_scores, kept, row, score)
                    kept += 1
                elif _worse(out_scores[0], out_rows[0], score, row):
                    _sift_down(out_rows, out_scores, kept, row, score)
        base += chunk.shape[0]
    _sort_best(out_rows, out_scores, kept)
    return kept


scan_top = _compile(_scan_top, nogil=True)


def compile_now() -> None:
    """Compile (or load from the cache) before the first search needs them: ~10 s, ~1 s
    from the cache. The scan with and without `allowed` are two specialisations."""
    none = np.zeros(0, np.int64)
    empty: Source = (np.zeros(0, np.int32), np.zeros(0, np.uint16), none, none)
    mask = np.ones(1, np.bool_)
    slots, scores = np.zeros(1, np.int32), np.zeros(1, np.float64)
    table: Table = (np.ones(1, np.float32), mask, True, np.zeros(1, np.int32), mask, True, 1, 1.0)
    bm25_top((empty, empty, none), table, 1, np.zeros(1, np.float64), slots, scores)
    codes, scales = typed_list([np.zeros((1, 1), np.int8)]), typed_list([np.ones(1, np.float32)])
    for allowed in (None, mask):
        scan_top(codes, scales, np.ones(1, np.float32), allowed, 1, np.zeros(1, np.float32), slots, scores)


def typed_list(arrays: Sequence[npt.NDArray[Any]]) -> Any:
    """Arrays as a numba typed List, which a kernel takes (a few us an array)."""
    out = List()
    for a in arrays:
        out.append(a)
    return out
