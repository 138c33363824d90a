"""Features the ranker derives itself from the query and the candidate texts it is sent:
what kind of answer the question asks for, and whether a memory's text holds that kind of
thing (a time, a count, a place, a name or a title). "When did she move?" is answered by
"we moved last spring", which shares no word with it; the retrieval legs' scores cannot
see that, the trees can learn it from these columns.

They are computed here, not sent by the server, so training and serving derive them with
the same code from the same inputs (the pair store keeps the query and every candidate's
text), and a model trained before they existed simply does not ask for them.

Measured on LoCoMo (sessions of two DEV conversations to train on, of the other two to
judge): offline, a ranker fit on one pair's sessions and judged on the other's, both ways,
lifted NDCG@10 over the baseline by +0.033 with these columns against +0.019 without (the
model's order alone; the memory-side markers carry most of it). Through `mnemo eval locomo
--train-sessions` (ranker only) the promoted rankers scored 0.718-0.744 on the held-back
sessions (mean 0.736, six runs) against 0.709-0.729 without them (mean 0.719, seven runs);
fused with the baseline at the weight a new model serves with, the judged split gained
less: NDCG@10 0.6804 against 0.6786 (means of the same runs).

Plain English regexes, like the server's query analysis: in other languages they do not
fire and the columns stay 0.
"""

from __future__ import annotations

import itertools
import math
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from mnemo_server.retrieval.query_analysis import body_of
from mnemo_sidecar.text_key import text_key


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_MONTHS = _words("January February March April May June July August September October November December")
_DAYS = _words("monday tuesday wednesday thursday friday saturday sunday")
_TIME_WORDS = _words("yesterday today tonight tomorrow ago recently since weekend") | _DAYS
# "last week", "few months": a time only as a pair.
_TIME_PAIRS = frozenset(
    (first, second)
    for first in _words("last next this past few")
    for second in _words("week month year night weekend summer winter spring fall autumn morning")
    | _words("days weeks months years")
    | _DAYS
)
_NUMBER_WORDS = _words(
    "one two three four five six seven eight nine ten eleven twelve twenty hundred "
    "once twice several couple dozen"
)
_PLACE_WORDS = _words("in at to from visited visit near")
# Words, and the marks that end a sentence or open a quote, in one pass over the text.
_TOKEN = re.compile(r"[A-Za-z0-9'’]+|[.!?\"“”]")
_SENTENCE_END = frozenset(".!?")
_QUOTES = frozenset('"“”')
_YES_NO = re.compile(
    r"^\s*(?:did|does|do|is|are|was|were|has|have|had|will|can|could|would)\b", re.IGNORECASE
)

# Question words, most specific first: "how many" is not also "how".
_QUESTION_WORDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(rf"\b{pattern}\b", re.IGNORECASE))
    for name, pattern in (
        ("how_many", r"how (?:many|often)"),
        ("how_much", r"how much"),
        ("how_long", r"how long"),
        ("how", r"how"),
        ("when", r"when"),
        ("where", r"where"),
        ("who", r"who(?:m|se)?"),
        ("what", r"what"),
        ("which", r"which"),
        ("why", r"why"),
        ("would", r"would"),
        ("likely", r"likely"),
    )
)
_CAPS_CAP = 5  # more capitalised words than this say nothing more

QUESTION_FEATURES = (*tuple(f"txt_q_{name}" for name, _ in _QUESTION_WORDS), "txt_q_yes_no")
MEMORY_FEATURES = (
    "txt_m_time",
    "txt_m_number",
    "txt_m_place",
    "txt_m_capitalised",
    "txt_m_quoted",
    "txt_m_words_log",
)
PAIR_FEATURES = (
    "txt_bigram_overlap",
    "txt_when_time",
    "txt_count_number",
    "txt_where_place",
    "txt_who_capitalised",
    "txt_what_named",
)
TEXT_FEATURES: tuple[str, ...] = QUESTION_FEATURES + MEMORY_FEATURES + PAIR_FEATURES
Matrix = npt.NDArray[np.float32]
Markers = tuple[float, float, float, float, float, float]
# Characters of text whose markers are derived between two looks at the deadline (~1 ms of
# Python here: 100 texts of 19,000 characters took ~110 ms).
STEP_CHARS = 16_000


def question_kinds(query: str) -> dict[str, float]:
    """1.0 for each kind of question the query asks (a query may ask several)."""
    kinds = dict.fromkeys(QUESTION_FEATURES, 0.0)
    specific_how = False
    for name, pattern in _QUESTION_WORDS:
        if pattern.search(query):
            if name == "how" and specific_how:
                continue
            kinds[f"txt_q_{name}"] = 1.0
            specific_how = specific_how or name.startswith("how_")
    kinds["txt_q_yes_no"] = 1.0 if _YES_NO.match(query) else 0.0
    return kinds


def _capitalised(token: str) -> bool:
    """A word like "Paris" or "Max" ("I", "I'm" and "OK" are not names)."""
    return len(token) > 1 and token[0].isupper() and token[1].islower()


Bigrams = frozenset[int]  # the text's word bigrams, hashed


def _bigram_hashes(words: Sequence[str]) -> Bigrams:
    return frozenset(map(hash, itertools.pairwise(words)))


def _size(bigrams: Bigrams) -> int:
    """Bytes a text's bigrams hold: the set's table and an int object for each."""
    return sys.getsizeof(bigrams) + 32 * len(bigrams)


class _DerivedCache:
    """A text's markers and bigrams, for the texts seen lately: the same memories come back
    session after session, and deriving them is ~30 us of Python a text. Keyed by text_key
    and holding hashed bigrams, bounded in entries and in bytes: an lru_cache keyed
    by the text and holding its words kept ~200 KB for one of 20,000 characters, ~0.8 GB
    at its 4,096 entries (sidecar probe). Python's hash of a bigram differs between
    processes, which is why only the process that hashed a query compares it."""

    def __init__(self, entries: int, max_bytes: int):
        self._entries, self._max_bytes = entries, max_bytes
        self._items: OrderedDict[bytes, tuple[Markers, Bigrams]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, text: str) -> tuple[Markers, Bigrams]:
        key = text_key(text)
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                return found
        derived = _derive(text)
        with self._lock:
            if key not in self._items:
                self._items[key] = derived
                self._bytes += _size(derived[1])
                while len(self._items) > self._entries or self._bytes > self._max_bytes:
                    self._bytes -= _size(self._items.popitem(last=False)[1][1])
        return derived


_DERIVED = _DerivedCache(entries=4096, max_bytes=32 << 20)


def _derive(text: str) -> tuple[Markers, Bigrams]:
    """The markers of memory_markers, and the hashes of the text's word bigrams (in lower
    case)."""
    time_ = number = place = quoted = 0.0
    capitalised = 0
    words: list[str] = []
    sentence_start = True
    prev = prev2 = ""
    # A chat turn's "Name: " is who speaks, not a name the text mentions.
    for token in _TOKEN.findall(body_of(text)):
        if token in _SENTENCE_END:
            sentence_start = True
            continue
        if token in _QUOTES:
            quoted = 1.0
            continue
        low = token.lower()
        if token[0] in "'’" and token[1:2].isupper():
            quoted = 1.0  # a 'Single Quoted' title
        if token in _MONTHS:
            time_ = 1.0
        elif _capitalised(token):
            if not sentence_start:
                capitalised += 1
            if prev in _PLACE_WORDS or (prev == "the" and prev2 in _PLACE_WORDS):
                place = 1.0
        if (
            low in _TIME_WORDS
            or (prev, low) in _TIME_PAIRS
            or (len(low) == 4 and low[:2] in ("19", "20") and low.isdigit())
        ):
            time_ = 1.0
        if low in _NUMBER_WORDS or low.isdigit():
            number = 1.0
        words.append(low)
        prev2, prev = prev, low
        sentence_start = False
    markers = (time_, number, place, float(min(capitalised, _CAPS_CAP)), quoted, math.log1p(len(words)))
    return markers, _bigram_hashes(words)


def memory_markers(text: str) -> Markers:
    """(time, number, place, capitalised words (capped), quoted, log word count) of a text."""
    return _DERIVED.get(text)[0]


def derive_in_steps(texts: Sequence[str], check: Callable[[], None]) -> None:
    """Derive the texts' markers ahead of text_feature_matrix, which then finds them cached,
    calling `check` (a deadline's) before each STEP_CHARS characters of them. No text is cut
    short: a time, a place or a name anywhere in it counts, and so does its every word."""
    done = STEP_CHARS
    for text in texts:
        if done >= STEP_CHARS:
            check()
            done = 0
        _DERIVED.get(text)
        done += len(text)


def text_feature_matrix(query: str, texts: Sequence[str]) -> Matrix:
    """One row per text, columns in TEXT_FEATURES' order."""
    kinds = question_kinds(query)
    q = [kinds[name] for name in QUESTION_FEATURES]
    query_bigrams = _bigram_hashes(
        [t.lower() for t in _TOKEN.findall(query) if t not in _SENTENCE_END and t not in _QUOTES]
    )
    when, where, who = kinds["txt_q_when"], kinds["txt_q_where"], kinds["txt_q_who"]
    count = kinds["txt_q_how_many"] + kinds["txt_q_how_much"] + kinds["txt_q_how_long"]
    what = kinds["txt_q_what"] + kinds["txt_q_which"]
    out = np.zeros((len(texts), len(TEXT_FEATURES)), dtype=np.float32)
    for row, text in enumerate(texts):
        (time_, number, place, capitalised, quoted, words_log), bigrams = _DERIVED.get(text)
        overlap = len(query_bigrams & bigrams) / len(query_bigrams) if query_bigrams else 0.0
        named = 1.0 if capitalised or quoted else 0.0
        out[row] = (
            *q,
            time_,
            number,
            place,
            capitalised,
            quoted,
            words_log,
            overlap,
            when * time_,
            count * number,
            where * place,
            who * capitalised,
            what * named,
        )
    return out
