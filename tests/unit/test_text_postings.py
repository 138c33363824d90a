"""The in-memory full-text postings make the terms LanceDB's index makes and score them as
LanceDB does, and follow writes, rewrites, deletes and folds.

LanceDB itself is the reference here: real tables with its default full-text index."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa
import pytest
from lancedb.index import FTS

from mnemo_server.config import IndexConfig
from mnemo_server.index.lance_index import IndexRow, LanceIndex
from mnemo_server.index.text_postings import STOP_WORDS, TextPostings, terms
from mnemo_server.memory.model import MemoryFilter, Scope, ScopeKind

_WORDS_TEXT = (
    "deploy metrics exporter weekend customers reported timeouts canary region reviewed cdn config "
    "security review database migration rollback alice bob carol running runs ran caching cached "
    "latency spike incident pager alert dashboard budget quarter planning hiring onboarding"
)
WORDS = _WORDS_TEXT.split()


def _lance_table(
    tmp_path: Path, texts: list[str], scopes: list[str] | None = None, name: str = "t"
) -> object:
    """A fresh LanceDB table of these texts with LanceDB's default full-text index."""
    db = lancedb.connect(str(tmp_path / "ref"))
    columns = {
        "id": [f"d{i}" for i in range(len(texts))],
        "text": texts,
        "scope": scopes or [""] * len(texts),
    }
    table = db.create_table(name, pa.table(columns))
    table.create_index("text", config=FTS(with_position=False))
    return table


def _lance_search(table: object, query: str, k: int, where: str | None = None) -> list[tuple[str, float]]:
    result = table.to_lance().to_table(  # type: ignore[attr-defined]
        columns=["id", "_score"], full_text_query=query, limit=k, filter=where, prefilter=True
    )
    return list(zip(result.column("id").to_pylist(), result.column("_score").to_pylist(), strict=True))


def test_terms_split_fold_stem_and_drop_stop_words() -> None:
    text = "The Caching layer, re-cached: RUNNING runs_fast!"
    assert terms(text) == ["cach", "layer", "cach", "run", "run", "fast"]
    assert terms("Café naïve") == ["cafe", "naiv"]
    assert terms("x" * 41 + " kept") == ["kept"]
    assert terms("having the very best of it") == ["veri", "best"]  # stop words after stemming


def test_letters_without_accents_fold_as_lancedb_folds_them(tmp_path: Path) -> None:
    """ł, ø, æ, ... decompose to no accent to drop: each folds to what finds its row in
    LanceDB's index, and a query in either spelling finds it here."""
    folds = {"ł": "l", "ø": "o", "æ": "ae", "œ": "oe", "đ": "d", "ð": "d", "þ": "th", "ß": "ss"}
    folds |= {"ſ": "s", "ı": "i", "ħ": "h", "ŧ": "t", "ŋ": "n", "ĸ": "k"}
    words = [f"mab{c}rot" for c in folds]
    table = _lance_table(tmp_path, words)
    postings = TextPostings()
    postings.load((f"d{i}", "s", w) for i, w in enumerate(words))
    for i, (letter, ascii_form) in enumerate(folds.items()):
        plain = f"mab{ascii_form}rot"
        assert terms(f"mab{letter}rot") == terms(plain) == [plain]
        assert f"d{i}" in [j for j, _ in _lance_search(table, plain, 5)], letter
        assert [j for j, _ in postings.search(plain, 5)] == [j for j, _ in postings.search(words[i], 5)]
    assert terms("Łódź København Ærø Œuvre Tromsø STRASSE Straße") == [
        "lodz", "kobenhavn", "aero", "oeuvr", "tromso", "strass", "strass"
    ]  # fmt: skip


def test_stop_words_are_the_words_lancedb_ignores(tmp_path: Path) -> None:
    """LanceDB finds nothing for a stop word; every other word finds its row."""
    extra = "would could also yes one two get got like make cannot ourselves heres thats"
    candidates = sorted(STOP_WORDS | set(extra.split()) | set(WORDS))
    table = _lance_table(tmp_path, [f"zebra {w}" for w in candidates])
    ignored = {w for w in candidates if not _lance_search(table, w, 5)}
    assert ignored == {w for w in candidates if not terms(w)}
    assert {"having", "heres", "thats"} <= ignored and not {"very", "would", "ourselves"} & ignored


def test_scores_and_order_match_lancedb(tmp_path: Path) -> None:
    rng = random.Random(4)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 25))) for _ in range(300)]
    table = _lance_table(tmp_path, texts)
    postings = TextPostings()
    postings.load((f"d{i}", "s", t) for i, t in enumerate(texts))
    for _ in range(25):
        query = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
        ours, theirs = postings.search(query, 10), _lance_search(table, query, 10)
        assert len(ours) == len(theirs), query
        np.testing.assert_allclose([s for _, s in ours], [s for _, s in theirs], rtol=2e-3)
        # Same ids, up to the order of (near-)ties.
        for (i, s), (j, t) in zip(ours, theirs, strict=True):
            assert i == j or abs(s - t) < 2e-3 * s, (query, ours, theirs)


def test_writes_rewrites_deletes_folds_and_scopes() -> None:
    p = TextPostings()
    p.MERGE_EVERY = 3  # fold often
    p.load([("a", "s1", "alpha beta"), ("b", "s1", "beta gamma"), ("c", "s2", "gamma delta")])
    assert [i for i, _ in p.search("gamma", 10)] in (["b", "c"], ["c", "b"])
    assert [i for i, _ in p.search("gamma", 10, ["s2"])] == ["c"]
    assert p.search("gamma", 10, ["nowhere"]) == []
    assert p.scopes_of(["a", "b", "c", "missing"]) == {"a": "s1", "b": "s1", "c": "s2"}
    p.put([("b", "s2", "epsilon")])  # rewritten: new text, new scope
    assert [i for i, _ in p.search("beta", 10)] == ["a"]
    assert [i for i, _ in p.search("epsilon", 10, ["s2"])] == ["b"]
    assert p.scopes_of(["b"]) == {"b": "s2"}
    p.remove(["a", "missing"])
    assert p.scopes_of(["a", "b"]) == {"b": "s2"}
    assert p.search("alpha beta", 10) == []
    for n in range(10):  # several folds
        p.put([(f"n{n}", "s3", f"zeta row{n}")])
    assert p.rows() == 12
    for n in range(2000):  # rewrites: dead slots' postings are dropped on the way
        p.put([(f"n{n % 10}", "s3", f"zeta row{n % 10} again{n}")])
    assert len(p._docs) < 5000  # dropped at 1,025 dead rows: not all 8,000 of 2,000 rewrites
    assert [i for i, _ in p.search("again1999", 5)] == ["n9"] and p.search("again5", 5) == []
    assert len(p.search("zeta", 100)) == 10 and len(p.search("zeta", 4)) == 4
    assert p.search("", 5) == [] and p.search("the of", 5) == []


def test_rewrites_hold_no_more_than_the_live_rows_and_score_as_a_fresh_load() -> None:
    """Dead slots were never reclaimed: the id list, per-slot and score arrays and the term
    dictionary grew with every write ever made (probe: 17.5x the bytes after 3,000 writes at
    40 rows, back to normal only when the tenant was loaded again)."""
    p = TextPostings()
    p.MERGE_EVERY = 64
    p.load([(f"r{n}", f"s{n % 3}", f"alpha row{n}") for n in range(40)])
    for n in range(3000):  # every row rewritten 75 times, each time with a word of its own
        p.put([(f"r{n % 40}", f"s{n % 3}", f"alpha beta{n % 5} row{n % 40} once{n}")])
    p.remove(["r0", "r1"])
    p.put([("late", "s0", "alpha beta1 late")])
    fresh = TextPostings()
    fresh.load(
        [
            (f"r{n}", f"s{(n + 2960) % 3}", f"alpha beta{(n + 2960) % 5} row{n} once{n + 2960}")
            for n in range(2, 40)
        ]
        + [("late", "s0", "alpha beta1 late")]
    )
    assert len(p._ids) < 40 + 1024 + 64 and len(p._term_ids) < 3 * len(fresh._term_ids) + 1024 + 3 * 64
    assert p.nbytes() < 4 * fresh.nbytes() + 200_000  # it was 17.5x and growing
    for query in ("alpha beta1", "row7", "once2999", "late", "beta3 row12"):
        for scopes in (None, ["s0"], ["s1", "s2"]):
            got, want = p.search(query, 50, scopes), fresh.search(query, 50, scopes)
            assert {i for i, _ in got} == {i for i, _ in want}
            assert dict(got) == pytest.approx(dict(want), rel=1e-5), (query, scopes)
    assert p.search("once5", 5) == [] and p.scopes_of(["r0", "r7"]) == {"r7": fresh.scopes_of(["r7"])["r7"]}


def test_a_search_limited_to_allowed_ids_keeps_the_scores_and_order() -> None:
    """`allowed` (the rows another filter passes) only removes hits: the rest keep their BM25
    scores, computed over every row as before, and their order."""
    p = TextPostings()
    p.load([(f"r{n}", "s1" if n % 2 else "s2", f"alpha {'beta ' * (n % 4)}gamma{n}") for n in range(40)])
    everything = p.search("alpha beta", 40)
    allowed = {f"r{n}" for n in range(0, 40, 3)}
    limited = p.search("alpha beta", 40, None, allowed)
    assert limited == [hit for hit in everything if hit[0] in allowed]
    in_s1 = p.search("alpha beta", 5, ["s1"], allowed)
    assert in_s1 == [hit for hit in p.search("alpha beta", 40, ["s1"]) if hit[0] in allowed][:5]
    assert p.search("alpha", 5, None, set()) == [] and p.search("alpha", 5, None, {"nope"}) == []


def test_its_size_follows_what_it_holds() -> None:
    p = TextPostings()
    p.MERGE_EVERY = 1
    p.load([("a", "s1", "alpha beta")])
    small = p.nbytes()
    ids = [f"row-{n:06d}" for n in range(3000)]
    p.put([(i, "s1", f"alpha word{n} other{n % 7}") for n, i in enumerate(ids)])
    grown = p.nbytes()
    # Per row at least its id string and its slot's entries; per term its string.
    assert grown - small > 3000 * (len(ids[0]) + 4 + 1 + 1)
    assert grown < 3000 * 1000  # an estimate, not a multiple of what is held


def test_lance_index_answers_from_postings_as_lancedb_does(tmp_path: Path) -> None:
    """Unfiltered and scope-filtered text searches come from the postings once loaded, and
    agree with LanceDB's full-text search through writes, a scope move, deletes and restarts."""
    rng = random.Random(9)
    dim = 8
    vec = np.ones(dim, np.float32) / np.sqrt(dim)

    def row(i: int, scope: str, text: str, revision: int = 1) -> IndexRow:
        return IndexRow(
            id=f"m{i}", scope=scope, type="semantic", category="c", session="", pinned=False,
            event_time_ns=0, create_time_ns=0, revision=revision, text=text, vector=vec, seq=i,
        )  # fmt: skip

    texts = {i: " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20))) for i in range(240)}
    scope_of = {i: f"project:{'ab'[i % 2]}" for i in texts}
    cfg = IndexConfig(ann_min_rows=10_000)
    index = LanceIndex(tmp_path / "lance", dim, cfg)
    index.upsert("t", [row(i, scope_of[i], texts[i]) for i in range(200)])
    for i in range(200, 240):
        index.upsert("t", [row(i, scope_of[i], texts[i])])
    texts[5], scope_of[5] = "zebra canary rollback", "project:b"
    index.upsert("t", [row(5, scope_of[5], texts[5], revision=2)])
    index.delete("t", ["m6", "m210"])
    del texts[6], texts[210]
    assert index.stats("t")["text_posting_rows"] == 238
    assert "text_idx" not in index.stats("t")["indices"]  # the postings answer every search
    off = LanceIndex(tmp_path / "lance", dim, dataclasses.replace(cfg, memory_text_search=False))
    assert off.warm("t")["text_postings"] == 0 and off.stats("t")["text_posting_rows"] is None
    assert off.text_search("t", "zebra", 3, MemoryFilter()) == []  # no full-text index yet
    # The start-up check makes it, rather than the first optimize: until then the leg found
    # nothing, and Recalls failed while the optimize made it (maintenance probe).
    assert off.drop_outdated() == []
    assert "text_idx" in off.stats("t")["indices"]
    assert off.text_search("t", "zebra", 3, MemoryFilter())[0].id == "m5"  # LanceDB's own search
    assert not off.optimize("t").get("text_index")

    # The reference: LanceDB's own search over a fresh table of the live rows (the tenant's
    # table has deleted and rewritten rows and rows outside its index, which LanceDB's
    # statistics count differently until it re-indexes).
    live = sorted(texts)
    reference = _lance_table(tmp_path, [texts[i] for i in live], [scope_of[i] for i in live], name="ref")
    name_of = {f"d{n}": f"m{i}" for n, i in enumerate(live)}

    def check(ix: LanceIndex) -> None:
        for query in ("zebra canary", "alice latency spike", "rollback", "budget planning hiring"):
            for f, where in ((MemoryFilter(), None), (_B, "scope = 'project:b'")):
                ours = [(h.id, h.score) for h in ix.text_search("t", query, 8, f)]
                theirs = [(name_of[i], s) for i, s in _lance_search(reference, query, 8, where)]
                np.testing.assert_allclose([s for _, s in ours], [s for _, s in theirs], rtol=2e-3)
                assert {i for i, _ in ours} <= {
                    f"m{i}" for i in texts if where is None or scope_of[i] == "project:b"
                }
                assert ours[0][0] == theirs[0][0]
        assert ix.text_search("t", "zebra", 3, MemoryFilter())[0].id == "m5"

    check(index)
    restarted = LanceIndex(tmp_path / "lance", dim, cfg)
    assert restarted.stats("t")["text_posting_rows"] is None  # until loaded: LanceDB answers
    assert restarted.warm("t")["text_postings"] == 238
    check(restarted)
    typed = MemoryFilter(categories=("c",))  # more than scopes: LanceDB
    assert [h.id for h in restarted.text_search("t", "zebra", 3, typed)] == ["m5"]


_B = MemoryFilter(scopes=(Scope(ScopeKind.PROJECT, "b"),))


@pytest.mark.parametrize("k", [1, 5])
def test_ties_break_by_insertion_order(k: int) -> None:
    p = TextPostings()
    p.load([(f"r{i}", "s", "same words here") for i in range(6)])
    assert [i for i, _ in p.search("same words", k)] == [f"r{i}" for i in range(k)]


def test_every_k_takes_the_best_of_one_ranking_ties_by_last_write() -> None:
    """The top k come from a bounded heap, not a sort of every hit: for each k they must be
    the first k of the full ranking, which orders equal scores by when the row was last
    written (its slot). Few words and short texts make many exact ties; rewrites kill slots
    and buffered postings sit beside folded ones."""
    rng = random.Random(3)
    p = TextPostings()
    p.MERGE_EVERY = 16
    texts = {f"r{i}": " ".join(rng.choices(WORDS[:6], k=rng.randint(1, 3))) for i in range(80)}
    written = list(texts)  # ids in the order of their last write
    p.load([(mid, "s", text) for mid, text in texts.items()])
    for mid in rng.sample(written, 20):
        written.remove(mid)
        written.append(mid)
        p.put([(mid, "s", texts[mid])])
    for query in ("deploy", "deploy metrics", "metrics exporter weekend deploy", "weekend weekend customers"):
        ranking = p.search(query, 1000)
        matching = {mid for mid, text in texts.items() if set(terms(text)) & set(terms(query))}
        assert len(ranking) == len(matching)
        assert ranking == sorted(ranking, key=lambda hit: (-hit[1], written.index(hit[0])))
        assert len({score for _, score in ranking}) < len(ranking) / 2  # ties were exercised
        for k in range(1, len(ranking) + 2):
            assert p.search(query, k) == ranking[:k]


def _bm25_by_hand(rows: dict[str, tuple[str, str]], query: str, scopes: list[str] | None) -> dict[str, float]:
    """BM25 over live rows (id -> (scope, text)) computed directly, term by term."""
    counted = {mid: (scope, Counter(terms(text))) for mid, (scope, text) in rows.items()}
    average = sum(sum(c.values()) for _, c in counted.values()) / len(counted)
    scores: dict[str, float] = {}
    for term, repeats in sorted(Counter(terms(query)).items()):
        having = [mid for mid, (_, c) in counted.items() if term in c]
        idf = repeats * math.log(1.0 + (len(counted) - len(having) + 0.5) / (len(having) + 0.5))
        for mid in having:
            scope, c = counted[mid]
            if scopes is not None and scope not in scopes:
                continue
            tf = float(c[term])
            norm = 1.2 * (1.0 - 0.75 + 0.75 * sum(c.values()) / average)
            scores[mid] = scores.get(mid, 0.0) + float(np.float32(idf * tf * 2.2 / (tf + norm)))
    return scores


def test_searches_one_after_another_score_as_bm25_by_hand() -> None:
    """Searches reuse score arrays: none may carry another's sums, whatever the terms,
    scopes, writes and folds in between."""
    rng = random.Random(7)
    p = TextPostings()
    p.MERGE_EVERY = 50
    rows = {f"r{i}": (f"s{i % 4}", " ".join(rng.choices(WORDS, k=rng.randint(2, 12)))) for i in range(300)}
    p.load([(mid, scope, text) for mid, (scope, text) in rows.items()])
    for step in range(60):
        if step % 10 == 9:  # rewrites, new rows and deletes between searches
            for mid in rng.sample(sorted(rows), 5):
                rows[mid] = (rows[mid][0], " ".join(rng.choices(WORDS, k=4)))
                p.put([(mid, *rows[mid])])
            new = f"n{step}"
            rows[new] = ("s1", " ".join(rng.choices(WORDS, k=6)))
            p.put([(new, *rows[new])])
            gone = rng.choice(sorted(rows))
            del rows[gone]
            p.remove([gone])
        query = " ".join(rng.choices(WORDS, k=rng.randint(1, 4)))
        scopes = None if step % 3 else [f"s{step % 4}", "s9"]
        expected = _bm25_by_hand(rows, query, scopes)
        found = p.search(query, 1000, scopes)
        assert dict(found) == pytest.approx(expected, rel=1e-5)  # float32 steps in both
        assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)
        best = p.search(query, 3, scopes)
        assert best == found[:3]
