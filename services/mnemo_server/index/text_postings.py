"""Full-text search (BM25) over one tenant's indexed texts, in memory.

LanceDB's full-text search costs ~4.4 ms of CPU per Recall at 100k rows and ~7.7 ms per
StartSession (its scope prefilter adds ~2.8), almost none of it the query's words: per-query
set-up in Lance. The same BM25 over postings held here costs ~0.4 ms, scored by a compiled
kernel that holds no GIL (kernels.py; figures in issue 3's notes). With these postings kept
(index.memory_text_search) LanceDB has no full-text index: a search filtered on more than
scopes is limited to the ids LanceDB finds passing the filter (`allowed`), and a restart
reads the texts back from the table.

Terms are made as LanceDB's default full-text index makes them (the "simple" tokenizer:
runs of letters and digits; tokens over 40 characters dropped; lower case; accents and
letters such as ł, ø, æ folded; Snowball English stems; English stop words removed), and
scored with BM25 (k1 1.2, b 0.75; document frequencies and the average length over the
tenant's rows, whatever the filter), so scores match LanceDB's up to its own rounding.

Rows live in slots; a row written again takes a new slot and its old one is marked dead.
New postings collect in a small per-term buffer that is folded into compact arrays (one
sorted run per term) every `MERGE_EVERY` new rows; dead slots, their postings and the terms
only they held are dropped once they are a tenth of the rows.
"""

from __future__ import annotations

import itertools
import re
import sys
import threading
import unicodedata
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet

import numpy as np
import Stemmer

from mnemo_server.index.kernels import Source, bm25_top
from mnemo_server.index.scratch import ScratchArrays

MAX_TOKEN_CHARS = 40

# LanceDB's English stop words (NLTK's list, apostrophe forms left out: they never survive
# the tokenizer), removed after stemming as LanceDB does ("having" -> "have" is dropped,
# "very" -> "veri" is kept). tests/unit/test_text_postings.py checks this against LanceDB.
_STOP_WORDS_TEXT = """
    i me my myself we our ours ourselves you your yours yourself yourselves he him his himself
    she her hers herself it its itself they them their theirs themselves what which who whom
    this that these those am is are was were be been being have has had having do does did
    doing a an the and but if or because as until while of at by for with about against between
    into through during before after above below to from up down in out on off over under again
    further then once here there when where why how all any both each few more most other some
    such no nor not only own same so than too very s t can will just don should now d ll m o re
    ve y ain aren couldn didn doesn hadn hasn haven isn ma mightn mustn needn shan shouldn wasn
    weren won wouldn
"""
STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())

_TOKEN = re.compile(r"[^\W_]+")
_local = threading.local()


# Lower-case letters that carry no combining accent to drop, folded as LanceDB's ASCII
# folding folds them (checked against it in tests/unit/test_text_postings.py): without these,
# "Lodz" did not find "Łódź" nor "Tromso" "Tromsø", which LanceDB's own index finds.
_LETTER_FOLDS = str.maketrans(
    {"ł": "l", "ø": "o", "æ": "ae", "œ": "oe", "đ": "d", "ð": "d", "þ": "th", "ß": "ss"}
    | {"ſ": "s", "ı": "i", "ħ": "h", "ŧ": "t", "ŋ": "n", "ĸ": "k"}
)


def _fold(text: str) -> str:
    if text.isascii():
        return text
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).translate(_LETTER_FOLDS)


def terms(text: str) -> list[str]:
    """The index terms of a text, in order (repeats kept)."""
    words = [w for w in _TOKEN.findall(_fold(text.lower())) if len(w) <= MAX_TOKEN_CHARS]
    # PyStemmer objects are not thread-safe: one per thread.
    stemmer: Stemmer.Stemmer | None = getattr(_local, "stemmer", None)
    if stemmer is None:
        stemmer = _local.stemmer = Stemmer.Stemmer("english")
    stems: list[str] = stemmer.stemWords(words)
    return [t for t in stems if t not in STOP_WORDS]


class _Flat:
    """Postings as three compact columns (term number, slot, term frequency)."""

    def __init__(self) -> None:
        self.tids = array("i")
        self.docs = array("i")
        self.tfs = array("H")

    def add(self, tid: int, slot: int, tf: int) -> None:
        self.tids.append(tid)
        self.docs.append(slot)
        self.tfs.append(min(tf, 65535))


_SIZE_SAMPLE = 256


def _strings_bytes(sample: Sequence[str], count: int) -> int:
    """The size of `count` strings, estimated from a sample of them."""
    return 0 if not sample else sum(sys.getsizeof(x) for x in sample) * count // len(sample)


class TextPostings:
    """BM25 postings of one tenant's rows. Thread-safe: writers and searches take a lock,
    searches only to take their postings."""

    MERGE_EVERY = 4096  # new rows between folds of the buffer into the arrays

    def __init__(self) -> None:
        self.loaded = False
        self._lock = threading.Lock()
        self._ids: list[str] = []
        self._slot_of: dict[str, int] = {}
        self._lengths = np.zeros(1024, np.float32)
        self._scope = np.zeros(1024, np.int32)
        self._alive = np.zeros(1024, np.bool_)
        self._scope_code: dict[str, int] = {}
        self._scope_names: list[str] = []  # scope by code
        self._alive_rows = 0
        self._alive_length = 0.0
        self._dead_rows = 0  # since dead slots' postings were last dropped
        # Terms by number; folded postings sorted by term number, then slot: term t's are
        # _docs/_tfs[_offsets[t]:_offsets[t + 1]] (6 bytes a posting: ~11 MB at 100k bench rows).
        self._term_ids: dict[str, int] = {}
        self._offsets = np.zeros(1, np.int64)
        self._docs = np.zeros(0, np.int32)
        self._tfs = np.zeros(0, np.uint16)
        # Postings not folded yet: term number -> ([slot], [tf]).
        self._buffer: dict[int, tuple[list[int], list[int]]] = {}
        self._buffered_rows = 0
        # Score arrays over all slots, reused by searches and kept zeroed (bm25_top), and
        # the kernel's output, as long as a query's postings; as many as searches run at
        # once (the server's compute slots).
        self._sums = ScratchArrays(np.float64, kept=4)
        self._out_slots = ScratchArrays(np.int32, kept=4)
        self._out_scores = ScratchArrays(np.float64, kept=4)

    def rows(self) -> int:
        with self._lock:
            return self._alive_rows

    def nbytes(self) -> int:
        """Bytes held, estimated: the arrays, the id list and dictionaries, and their strings
        from a sample of them (GetStatus asks every second under the bench; a full walk of
        100k strings would hold searches off this lock for milliseconds). The unfolded
        buffer, at most MERGE_EVERY rows' postings, is not counted."""
        with self._lock:
            arrays = (self._lengths, self._scope, self._alive, self._offsets, self._docs, self._tfs)
            held = sum(a.nbytes for a in arrays)
            held += sum(pool.held_bytes() for pool in (self._sums, self._out_slots, self._out_scores))
            held += sys.getsizeof(self._ids) + sys.getsizeof(self._slot_of) + sys.getsizeof(self._term_ids)
            held += _strings_bytes(self._ids[:: max(1, len(self._ids) // _SIZE_SAMPLE)], len(self._ids))
            held += _strings_bytes(list(itertools.islice(self._term_ids, _SIZE_SAMPLE)), len(self._term_ids))
            return held

    # --- writes --------------------------------------------------------------------------

    def load(self, rows: Iterable[tuple[str, str, str]]) -> None:
        """(id, scope, text) of every row, at start-up; then searches may use it. Postings go
        straight into flat arrays and are folded once (through put()'s per-term buffer,
        100k rows took ~7 s and ~130 MB more)."""
        flat = _Flat()
        with self._lock:
            for mid, scope, text in rows:
                counts = Counter(terms(text))
                slot = self._add_row(mid, scope, counts)
                for term, tf in counts.items():
                    flat.add(self._term_ids.setdefault(term, len(self._term_ids)), slot, tf)
            self._fold(flat)
        self.loaded = True

    def put(self, rows: Iterable[tuple[str, str, str]]) -> None:
        """Rows written (new or again) with their scope and text."""
        made = [(mid, scope, Counter(terms(text))) for mid, scope, text in rows]  # outside the lock
        with self._lock:
            for mid, scope, counts in made:
                slot = self._add_row(mid, scope, counts)
                for term, tf in counts.items():
                    tid = self._term_ids.setdefault(term, len(self._term_ids))
                    slots, tfs = self._buffer.setdefault(tid, ([], []))
                    slots.append(slot)
                    tfs.append(min(tf, 65535))
            self._buffered_rows += len(made)
            if self._buffered_rows >= self.MERGE_EVERY:
                self._fold(_Flat())

    def _add_row(self, mid: str, scope: str, counts: Counter[str]) -> int:
        """A new slot for a row (its older one, if any, dies); under the lock."""
        self._kill(mid)
        slot = len(self._ids)
        self._grow(slot + 1)
        self._ids.append(mid)
        self._slot_of[mid] = slot
        length = float(sum(counts.values()))
        self._lengths[slot] = length
        code = self._scope_code.get(scope)
        if code is None:
            code = self._scope_code[scope] = len(self._scope_names)
            self._scope_names.append(scope)
        self._scope[slot] = code
        self._alive[slot] = True
        self._alive_rows += 1
        self._alive_length += length
        return slot

    def scopes_of(self, ids: Iterable[str]) -> dict[str, str]:
        """The scope of each of these ids held (once loaded, every row of the table is)."""
        with self._lock:
            slots = ((mid, self._slot_of.get(mid)) for mid in ids)
            return {mid: self._scope_names[self._scope[slot]] for mid, slot in slots if slot is not None}

    def remove(self, ids: Iterable[str]) -> None:
        with self._lock:
            for mid in ids:
                self._kill(mid)

    def _kill(self, mid: str) -> None:
        slot = self._slot_of.pop(mid, None)
        if slot is not None and self._alive[slot]:
            self._alive[slot] = False
            self._alive_rows -= 1
            self._alive_length -= float(self._lengths[slot])
            self._dead_rows += 1

    def _grow(self, size: int) -> None:
        if size <= len(self._lengths):
            return
        new = max(size, 2 * len(self._lengths))
        # New arrays, not resized ones: a search may still hold the old ones.
        self._lengths = np.concatenate([self._lengths, np.zeros(new - len(self._lengths), np.float32)])
        self._scope = np.concatenate([self._scope, np.zeros(new - len(self._scope), np.int32)])
        self._alive = np.concatenate([self._alive, np.zeros(new - len(self._alive), np.bool_)])

    def _fold(self, flat: _Flat) -> None:
        """Fold the buffer and `flat` into the arrays (under the lock). Slots only grow, so a
        term's new postings go after its folded ones: the new ones are sorted (a stable sort
        by term keeps each term's slots in order) and inserted, the folded ones are not
        sorted again. Sorting all 1.8M postings of a 100k bench tenant at every fold raised
        the bench's high-water mark by ~50 MB. Dead slots' postings are dropped once they
        are a tenth of the rows."""
        for tid, (slots, counts) in self._buffer.items():
            for slot, tf in zip(slots, counts, strict=True):
                flat.add(tid, slot, tf)
        new_tids = np.frombuffer(flat.tids, np.int32)
        order = np.argsort(new_tids, kind="stable")
        new_tids = new_tids[order]
        folded_terms, terms_count = len(self._offsets) - 1, len(self._term_ids)
        ends = np.append(self._offsets[1:], self._offsets[-1])  # past the last folded term: the end
        at = ends[np.minimum(new_tids, folded_terms)]
        self._docs = np.insert(self._docs, at, np.frombuffer(flat.docs, np.int32)[order])
        self._tfs = np.insert(self._tfs, at, np.frombuffer(flat.tfs, np.uint16)[order])
        per_term = np.bincount(new_tids, minlength=terms_count)
        per_term[:folded_terms] += np.diff(self._offsets)
        self._offsets = np.concatenate([[0], np.cumsum(per_term)]).astype(np.int64)
        self._buffer = {}
        self._buffered_rows = 0
        if self._dead_rows > max(1024, self._alive_rows // 10):
            self._drop_dead()

    def _drop_dead(self) -> None:
        """Drop dead slots' postings, then the slots themselves and the terms only they held
        (under the lock, the buffer folded). Slots are numbered afresh in their order, so
        equal scores keep their order. Without this a tenant's id list, its per-slot and
        per-search score arrays and its term dictionary grew with every write ever made, not
        with its rows (probe: 17.5x the bytes after 3,000 writes at 40 rows). New objects
        throughout: a search may still hold the old ones."""
        keep = self._alive[self._docs]
        tids = np.repeat(np.arange(len(self._offsets) - 1, dtype=np.int32), np.diff(self._offsets))[keep]
        live = np.flatnonzero(self._alive[: len(self._ids)])
        renumbered = np.full(len(self._ids), -1, np.int32)
        renumbered[live] = np.arange(len(live), dtype=np.int32)
        self._docs, self._tfs = renumbered[self._docs[keep]], self._tfs[keep]
        per_term = np.bincount(tids, minlength=len(self._offsets) - 1)
        held = per_term > 0
        term_number = np.cumsum(held) - 1
        self._term_ids = {term: int(term_number[t]) for term, t in self._term_ids.items() if held[t]}
        self._offsets = np.concatenate([[0], np.cumsum(per_term[held])]).astype(np.int64)
        capacity = max(1024, 2 * len(live))
        for name in ("_lengths", "_scope", "_alive"):
            old = getattr(self, name)
            fresh = np.zeros(capacity, old.dtype)
            fresh[: len(live)] = old[live]
            setattr(self, name, fresh)
        self._ids = [self._ids[slot] for slot in live.tolist()]
        self._slot_of = {mid: slot for slot, mid in enumerate(self._ids)}
        for pool in (self._sums, self._out_slots, self._out_scores):
            pool.clear()  # sized to the slots there were
        self._dead_rows = 0

    def _sources(self, wanted: list[tuple[str, int]]) -> tuple[Source, Source]:
        """The query terms' postings, folded and buffered, as the kernel reads them: the
        folded arrays themselves (no copy) and the buffered ones gathered, with each term's
        range in each (under the lock: writers append to the buffer's lists)."""
        starts, ends = np.zeros(len(wanted), np.int64), np.zeros(len(wanted), np.int64)
        b_starts, b_ends = np.zeros(len(wanted), np.int64), np.zeros(len(wanted), np.int64)
        b_docs: list[int] = []
        b_tfs: list[int] = []
        folded_terms = len(self._offsets) - 1
        for n, (term, _) in enumerate(wanted):
            tid = self._term_ids.get(term)
            if tid is None:
                continue
            if tid < folded_terms:
                starts[n], ends[n] = self._offsets[tid], self._offsets[tid + 1]
            if tid in self._buffer:
                slots, counts = self._buffer[tid]
                b_starts[n] = len(b_docs)
                b_docs += slots
                b_tfs += counts
                b_ends[n] = len(b_docs)
        folded = (self._docs, self._tfs, starts, ends)
        buffered = (np.asarray(b_docs, np.int32), np.asarray(b_tfs, np.uint16), b_starts, b_ends)
        return folded, buffered

    # --- search --------------------------------------------------------------------------

    def search(
        self,
        query: str,
        k: int,
        scopes: Sequence[str] | None = None,
        allowed: AbstractSet[str] | None = None,
    ) -> list[tuple[str, float]]:
        """The k best (id, BM25 score) for the query's terms, within `scopes` if given and
        among the ids in `allowed` if given; equal scores in slot order."""
        # A term repeated in the query counts each time, as in LanceDB.
        wanted = sorted(Counter(terms(query)).items())
        if not wanted or k <= 0:
            return []
        with self._lock:
            folded, buffered = self._sources(wanted)
            lengths, scope_of, alive = self._lengths, self._scope, self._alive
            # Unchecked when every slot is alive (no row written again or removed since the
            # load): the bench's mix then skips a third of the kernel's reads.
            check_alive = self._alive_rows < len(self._ids)
            rows, total = self._alive_rows, self._alive_length
            codes = None if scopes is None else [self._scope_code[s] for s in scopes if s in self._scope_code]
            wanted_scope = np.zeros(max(1, len(self._scope_names)), np.bool_)
            ids = self._ids
        if rows == 0 or (codes is not None and not codes):
            return []
        if codes is not None:
            wanted_scope[codes] = True
        postings = int(folded[3].sum() - folded[2].sum()) + len(buffered[0])
        # With `allowed`, every hit in order, then those allowed: the filter does not change
        # scores, and a set of ids cannot go into the kernel.
        best = k if allowed is None else postings
        sums = self._sums.take(len(lengths))
        slots, scores = self._out_slots.take(postings), self._out_scores.take(postings)
        query_postings = (folded, buffered, np.asarray([r for _, r in wanted], np.int64))
        table = (lengths, alive, check_alive, scope_of, wanted_scope, codes is not None, rows, total / rows)
        kept = bm25_top(query_postings, table, best, sums, slots, scores)
        self._sums.give_back(sums)  # not after an error: it may hold partial sums
        found = [
            (ids[slot], score)
            for slot, score in zip(slots[:kept].tolist(), scores[:kept].tolist(), strict=True)
        ]
        self._out_slots.give_back(slots)
        self._out_scores.give_back(scores)
        if allowed is not None:
            found = [hit for hit in found if hit[0] in allowed][:k]
        return found
