"""What Recall reads out of a query and out of candidate texts: speakers, dates, "when"
questions, time expressions. Plain regexes, deterministic and cheap (English only: in
other languages these rules simply do not fire)."""

from __future__ import annotations

import calendar
import datetime as dt
import re
from dataclasses import dataclass

MONTHS = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
_M = "|".join(MONTHS)
_DATE_PATTERNS = [
    (re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({_M}),?\s+((?:19|20)\d{{2}})\b", re.I), "dmy"),
    (re.compile(rf"\b({_M})\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+((?:19|20)\d{{2}})\b", re.I), "mdy"),
    (re.compile(rf"\b({_M}),?\s+((?:19|20)\d{{2}})\b", re.I), "my"),
    (re.compile(r"\b((?:19|20)\d{2})\b"), "y"),
]
TIME_EXPRESSION = re.compile(
    r"\b(yesterday|today|tonight|tomorrow|last|next|ago|recently|weekend|weeks?|months?|years?|"
    rf"monday|tuesday|wednesday|thursday|friday|saturday|sunday|{_M}|(?:19|20)\d{{2}})\b",
    re.I,
)
# "Name: text" - an attributed utterance (chat turn, transcript line).
SPEAKER_PREFIX = re.compile(r"^([A-Z][\w'’.-]*(?: [A-Z][\w'’.-]*){0,2}):\s")
# Capitalised labels that are not speakers (Signet's labelled lines and similar).
NOT_SPEAKERS = frozenset(
    {
        "Fact",
        "Preference",
        "Decision",
        "Note",
        "Notes",
        "Todo",
        "TODO",
        "Summary",
        "Question",
        "Answer",
        "Q",
        "A",
        "Update",
        "Warning",
        "Error",
        "Info",
        "Action",
        "Context",
        "Task",
    }
)
_WORD = re.compile(r"[A-Za-z0-9]+")

Interval = tuple[dt.date, dt.date]


def speaker_of(content: str) -> str:
    m = SPEAKER_PREFIX.match(content)
    return m.group(1) if m and m.group(1) not in NOT_SPEAKERS else ""


def body_of(content: str) -> str:
    m = SPEAKER_PREFIX.match(content)
    return content[m.end() :] if m else content


_TOKEN = re.compile(r"[a-z0-9]+")
# Function words: a query or a transcript shares them with almost any text, so they say
# nothing about relevance.
STOP_WORDS = frozenset(
    re.findall(
        r"\w+",
        "a about after all also an and any are as at be been but by can could did do does for from had "
        "has have he her him his how i if in into is it its just me my no not of on or our really she "
        "should so than that the their them then there they this to up us very was we were what when "
        "where which who why will with would you your",
    )
)


def content_words(text: str) -> set[str]:
    """A text's lower-cased words without function words and single characters."""
    return {t for t in _TOKEN.findall(text.lower()) if t not in STOP_WORDS and len(t) > 1}


def content_terms(text: str) -> frozenset[str]:
    """Content words of 3+ letters cut to 5 (a crude stem: "painting" and "painted" meet)."""
    return frozenset(t[:_STEM] for t in _TOKEN.findall(text.lower()) if _is_term(t))


_STEM = 5
# Building the scan is a regex compile (Python code): ~0.3 ms for 4 terms, ~0.7 for 48.
# Over a StartSession's ~140 texts the scan then saved ~1.1 ms up to 16 terms, ~0.85 at
# 32 and ~0.7 at 48 (measured on the bench's texts): past 32 it is not worth building.
_MAX_SCANNED_TERMS = 32


def _is_term(token: str) -> bool:
    return len(token) > 2 and token not in STOP_WORDS


class TermMatcher:
    """Which of a query's content terms a text holds: `terms & content_terms(text)`, found by
    one regex scan for words that start with a term instead of a set of every word of the
    text. Why: the ranker features compare the query with ~140 texts a StartSession (the pool
    and its neighbours): a scan took 3-5 us a text, the intersection ~8. Building the scan
    costs more with every term, so past _MAX_SCANNED_TERMS (a long opening context) the
    intersection is used."""

    def __init__(self, terms: frozenset[str]):
        self.terms = terms
        self._starts: re.Pattern[str] | None = None
        if 0 < len(terms) <= _MAX_SCANNED_TERMS:
            # A match is a whole word (it starts where a word starts and runs to its end,
            # whichever term matched), as _TOKEN splits the text.
            alternatives = "|".join(map(re.escape, sorted(terms)))
            self._starts = re.compile(rf"(?<![a-z0-9])(?:{alternatives})[a-z0-9]*")

    def found(self, text: str) -> frozenset[str]:
        if not self.terms:
            return frozenset()
        if self._starts is None:
            return self.terms & content_terms(text)
        return frozenset(
            stem
            for t in self._starts.findall(text.lower())
            if _is_term(t) and (stem := t[:_STEM]) in self.terms
        )


def has_time_expression(content: str) -> bool:
    return TIME_EXPRESSION.search(body_of(content)) is not None


def query_dates(text: str) -> list[Interval]:
    """Date intervals a text mentions: a day, a month or a year each."""
    out: list[Interval] = []
    for pattern, kind in _DATE_PATTERNS:

        def take(m: re.Match[str], kind: str = kind) -> str:
            g = m.groups()
            try:
                if kind == "dmy":
                    d = dt.date(int(g[2]), MONTHS.index(g[1].lower()) + 1, int(g[0]))
                    out.append((d, d))
                elif kind == "mdy":
                    d = dt.date(int(g[2]), MONTHS.index(g[0].lower()) + 1, int(g[1]))
                    out.append((d, d))
                elif kind == "my":
                    y, mo = int(g[1]), MONTHS.index(g[0].lower()) + 1
                    out.append((dt.date(y, mo, 1), dt.date(y, mo, calendar.monthrange(y, mo)[1])))
                else:
                    out.append((dt.date(int(g[0]), 1, 1), dt.date(int(g[0]), 12, 31)))
            except ValueError:
                return m.group(0)
            return " "  # consumed, so "May 2023" does not count again as "2023"

        text = pattern.sub(take, text)
    return out


@dataclass(frozen=True)
class QueryAnalysis:
    text: str  # what the legs search with
    named_speakers: tuple[str, ...]
    dates: tuple[Interval, ...]
    when_question: bool


def analyse(question: str, speakers: list[str], *, strip: bool) -> QueryAnalysis:
    named = tuple(n for n in speakers if re.search(rf"\b{re.escape(n)}\b", question))
    text = question
    if strip and speakers:
        stripped = question
        for n in speakers:
            stripped = re.sub(rf"\b{re.escape(n)}(?:'s|’s)?\b", " ", stripped)
        stripped = re.sub(r"\s+", " ", stripped).strip()
        # Keep the original when nothing but names was asked.
        if len(_WORD.findall(stripped)) >= 2:
            text = stripped
    return QueryAnalysis(
        text, named, tuple(query_dates(question)), question.strip().lower().startswith("when")
    )
