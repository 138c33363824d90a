"""LanceIndex maintenance keeps search exact: compaction and optimize must neither lose,
resurrect nor duplicate rows. Real LanceDB files."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mnemo_server.config import IndexConfig
from mnemo_server.index import lance_index
from mnemo_server.index.attrs import ATTR_COLUMNS, read_attrs
from mnemo_server.index.lance_index import IndexRow, LanceIndex, filter_sql
from mnemo_server.index.lance_table import index_names
from mnemo_server.memory.model import MemoryFilter, MemoryType, Scope, ScopeKind, TimeRange

DIM = 32
TENANT = "acme"
ANY = MemoryFilter()


def _row(i: int, vector: np.ndarray, *, word: str, revision: int = 1) -> IndexRow:
    return IndexRow(
        id=f"m{i}",
        scope="s",
        type="semantic",
        category="c",
        session="",
        pinned=False,
        event_time_ns=0,
        create_time_ns=0,
        revision=revision,
        text=f"memory number {i} about {word}",
        vector=vector,
        seq=i,
    )


def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


@pytest.fixture
def index(tmp_path: Path) -> LanceIndex:
    # These cases compact a few fragments on purpose: compaction is not skipped for their number.
    # They test LanceDB's paths, so no vector graph answers the unfiltered vector searches.
    return LanceIndex(
        tmp_path / "lance",
        DIM,
        IndexConfig(ann_min_rows=256, ann_nprobes=64, compact_min_fragments=0, vector_graph=False),
    )


def _check(index: LanceIndex, expected: dict[str, tuple[np.ndarray, str]], gone: set[str]) -> None:
    for memory_id, (vector, word) in expected.items():
        hits = index.vector_search(TENANT, vector, 3, ANY)
        assert hits[0].id == memory_id, (memory_id, [h.id for h in hits])
        assert word in hits[0].attrs.text
        text_hits = [h.id for h in index.text_search(TENANT, word, 5, ANY)]
        assert text_hits == [memory_id], (word, text_hits)
    revisions = index.revisions(TENANT)
    assert not gone & revisions.keys()
    assert index.count(TENANT) == len(revisions)


def test_compaction_and_optimize_keep_search_exact(index: LanceIndex) -> None:
    rng = np.random.default_rng(7)
    vectors = {i: _unit(rng) for i in range(600)}
    index.upsert(TENANT, [_row(i, vectors[i], word=f"base{i}") for i in range(600)])
    done = index.optimize(TENANT)
    assert "ann_index" in done

    # A stream of single writes, as creates arrive: each leaves a small fragment.
    fresh = {i: _unit(rng) for i in range(600, 630)}
    for i, v in fresh.items():
        index.upsert(TENANT, [_row(i, v, word=f"fresh{i}")])
    updated = {i: _unit(rng) for i in range(10, 15)}
    for i, v in updated.items():
        index.upsert(TENANT, [_row(i, v, word=f"edited{i}", revision=2)])
    deleted = [f"m{i}" for i in range(20, 25)]
    index.delete(TENANT, deleted)
    fragments_before = index.stats(TENANT)["fragments"]

    expected = {f"m{i}": (v, f"fresh{i}") for i, v in fresh.items()}
    expected |= {f"m{i}": (v, f"edited{i}") for i, v in updated.items()}
    expected |= {f"m{i}": (vectors[i], f"base{i}") for i in (0, 1, 2, 300, 599)}

    assert index.compact(TENANT) > 0
    assert index.stats(TENANT)["fragments"] < fragments_before
    _check(index, expected, set(deleted))
    assert not index.text_search(TENANT, "base12", 5, ANY)  # the edit replaced its old text
    assert index.count(TENANT) == 600 + 30 - 5

    index.optimize(TENANT)
    _check(index, expected, set(deleted))
    assert index.unindexed_rows(TENANT) == 0


def test_a_batch_mixing_new_and_indexed_rows_neither_duplicates_nor_loses(index: LanceIndex) -> None:
    """New rows are appended and known ones merged: a batch holding both (an edit arriving
    with creates), and one written twice (a crash before it was marked indexed), must leave
    each id once with its newest text."""
    rng = np.random.default_rng(11)
    vectors = {i: _unit(rng) for i in range(40)}
    index.upsert(TENANT, [_row(i, vectors[i], word=f"first{i}") for i in range(20)])
    mixed = [_row(i, vectors[i], word=f"second{i}", revision=2) for i in range(15, 20)]
    mixed += [_row(i, vectors[i], word=f"first{i}") for i in range(20, 40)]
    index.upsert(TENANT, mixed)
    index.upsert(TENANT, mixed)  # replayed

    assert index.count(TENANT) == 40
    revisions = index.revisions(TENANT)
    assert len(revisions) == 40
    assert all(revisions[f"m{i}"] == (2 if 15 <= i < 20 else 1) for i in range(40))
    expected = {f"m{i}": (vectors[i], f"second{i}" if 15 <= i < 20 else f"first{i}") for i in range(40)}
    _check(index, expected, set())
    assert not index.text_search(TENANT, "first17", 5, ANY)


def test_which_rows_a_write_finds_present_comes_from_the_postings_as_from_the_table(
    index: LanceIndex,
) -> None:
    """Upserts tell new rows (appended) from known ones (merged, moved between scopes) by
    the postings once they are loaded; the table itself must agree, and a row moved to
    another scope is found there only, once."""
    rng = np.random.default_rng(12)
    vectors = {i: _unit(rng) for i in range(30)}
    index.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}") for i in range(30)])
    moved = [
        dataclasses.replace(_row(i, vectors[i], word=f"moved{i}", revision=2), scope="project:t")
        for i in range(5)
    ]
    index.upsert(TENANT, moved)
    h = index._handle(TENANT, create=False)
    assert h is not None and h.texts.loaded
    ids = [f"m{i}" for i in range(35)]
    from_postings = LanceIndex._scopes_of(h, ids)
    h.texts.loaded = False  # the same question to the table
    assert LanceIndex._scopes_of(h, ids) == from_postings
    h.texts.loaded = True
    assert from_postings == {f"m{i}": "project:t" if i < 5 else "s" for i in range(30)}
    assert index.count(TENANT) == 30
    in_t = MemoryFilter(scopes=(Scope(ScopeKind.PROJECT, "t"),))
    found = {hit.id for hit in index.vector_search(TENANT, vectors[2], 10, in_t)}
    assert found == {f"m{i}" for i in range(5)}
    assert [hit.id for hit in index.text_search(TENANT, "moved3", 5, in_t)] == ["m3"]


def test_rows_outside_the_ann_index_are_searched_in_memory_with_the_filter(tmp_path: Path) -> None:
    """Once the ANN index holds every row, newer rows are searched from memory and LanceDB
    is asked for indexed rows only; the filter applies to both, an optimize hands the rows
    over, and a process that did not write them (a restart) lets LanceDB scan them."""
    # Compaction of a few fragments below is part of the case: not skipped for their number.
    # Without the vector graph: with it, tables have no ANN index.
    cfg = IndexConfig(ann_min_rows=256, ann_nprobes=64, compact_min_fragments=0, vector_graph=False)
    rng = np.random.default_rng(5)
    vectors = {i: _unit(rng) for i in range(330)}

    def row(i: int, scope: str) -> IndexRow:
        return dataclasses.replace(_row(i, vectors[i], word=f"w{i}"), scope=f"project:{scope}")

    index = LanceIndex(tmp_path / "lance", DIM, cfg)
    index.upsert(TENANT, [row(i, "a" if i % 2 else "b") for i in range(300)])
    assert index.stats(TENANT)["pending_rows"] is None  # no ANN index yet
    index.optimize(TENANT)
    assert index.stats(TENANT)["pending_rows"] == 0
    for i in range(300, 330):
        index.upsert(TENANT, [row(i, "c" if i % 2 else "d")])
    index.upsert(TENANT, [dataclasses.replace(row(301, "d"), revision=2)])  # moved to scope d
    index.delete(TENANT, ["m303"])
    assert index.stats(TENANT)["pending_rows"] == 29

    def top(ix: LanceIndex, i: int, scope: str | None) -> list[str]:
        f = ANY if scope is None else _scope_filter(scope)
        return [h.id for h in ix.vector_search(TENANT, vectors[i], 3, f)]

    def check(ix: LanceIndex) -> None:
        assert top(ix, 305, None)[0] == "m305"
        assert top(ix, 305, "c")[0] == "m305"
        assert "m305" not in top(ix, 305, "d")
        assert top(ix, 301, "d")[0] == "m301"  # its new scope only
        assert "m301" not in top(ix, 301, "c")
        assert "m303" not in top(ix, 303, None)  # deleted
        assert top(ix, 10, "b")[0] == "m10"  # an indexed row
        assert "m10" not in top(ix, 10, "a")

    check(index)
    reopened = LanceIndex(tmp_path / "lance", DIM, cfg)
    assert reopened.stats(TENANT)["pending_rows"] is None
    check(reopened)
    index.optimize(TENANT)
    assert index.stats(TENANT)["pending_rows"] == 0
    check(index)
    # A small indexed fragment merged with newer ones: the index finds its rows where
    # they moved, the newer ones stay pending.
    for i in range(310, 320):
        index.upsert(TENANT, [dataclasses.replace(row(i, "c" if i % 2 else "d"), revision=3)])
    assert index.compact(TENANT) > 0
    assert index.stats(TENANT)["pending_rows"] == 10
    check(index)
    assert top(index, 315, "c")[0] == "m315"
    check(LanceIndex(tmp_path / "lance", DIM, cfg))


def _scope_filter(project: str) -> MemoryFilter:
    return MemoryFilter(scopes=(Scope(ScopeKind.PROJECT, project),))


def test_rows_rewritten_after_indexing_survive_compaction(index: LanceIndex) -> None:
    """Rows folded into an ANN delta, then edited, then their fragment compacted: with the
    index remap deferred, every vector search of the table failed from then on."""
    rng = np.random.default_rng(5)
    vectors = {i: _unit(rng) for i in range(330)}
    index.upsert(TENANT, [_row(i, vectors[i], word=f"base{i}") for i in range(300)])
    index.optimize(TENANT)
    for i in range(300, 330):
        index.upsert(TENANT, [_row(i, vectors[i], word=f"late{i}")])
    index.optimize(TENANT)  # a small delta of the ANN index now holds m300..m329
    for i in range(310, 320):
        index.upsert(TENANT, [_row(i, vectors[i], word=f"edited{i}", revision=2)])
    assert index.compact(TENANT) > 0

    expected = {f"m{i}": (vectors[i], f"late{i}") for i in range(300, 310)}
    expected |= {f"m{i}": (vectors[i], f"edited{i}") for i in range(310, 320)}
    expected |= {f"m{i}": (vectors[i], f"base{i}") for i in (0, 150)}
    _check(index, expected, set())
    index.optimize(TENANT)
    _check(index, expected, set())


def test_a_table_whose_ann_index_no_longer_reads_is_dropped_for_rebuilding(tmp_path: Path) -> None:
    """A data directory from a server that compacted with the remap deferred: its ANN index
    fails every search that reaches the broken delta. At start-up the table is dropped (the
    caller re-indexes the tenant from DuckDB); a sound table stays."""
    cfg = IndexConfig(ann_min_rows=256, ann_nprobes=64, compact_min_fragments=0, vector_graph=False)
    rng = np.random.default_rng(5)
    vectors = {i: _unit(rng) for i in range(330)}
    broken = LanceIndex(tmp_path / "lance", DIM, cfg)
    for tenant in ("bad", "good"):
        broken.upsert(tenant, [_row(i, vectors[i], word="w") for i in range(300)])
        broken.optimize(tenant)
        for i in range(300, 330):
            broken.upsert(tenant, [_row(i, vectors[i], word="w")])
        broken.optimize(tenant)
        for i in range(310, 320):
            broken.upsert(tenant, [_row(i, vectors[i], word="w", revision=2)])
    # The old compaction, on one tenant only.
    h = broken._handle("bad", create=False)
    assert h is not None
    h.for_maintenance().optimize.compact_files(target_rows_per_fragment=1 << 20, defer_index_remap=True)
    broken.compact("good")
    with pytest.raises(ValueError, match="HNSW graph"):
        LanceIndex(tmp_path / "lance", DIM, cfg).vector_search("bad", vectors[315], 3, ANY)

    restarted = LanceIndex(tmp_path / "lance", DIM, cfg)
    assert restarted.drop_outdated() == ["bad"]
    assert restarted.tenants() == ["good"]
    assert restarted.vector_search("good", vectors[315], 3, ANY)[0].id == "m315"


def test_a_table_with_an_older_layout_is_dropped_for_rebuilding(tmp_path: Path) -> None:
    """A table an older server wrote without a column this one reads (here `seq`) is
    dropped at start-up, and the tenant's next write creates it with the current layout."""
    import lancedb
    import pyarrow as pa

    current = LanceIndex(tmp_path / "lance", DIM, IndexConfig())
    current.upsert("fresh", [_row(0, _unit(np.random.default_rng(1)), word="w")])
    old_schema = pa.schema([f for f in current.schema if f.name != "seq"])
    old = _row(1, _unit(np.random.default_rng(2)), word="old")
    values = {f.name: [getattr(old, f.name)] for f in old_schema if f.name != "vector"}
    values["vector"] = [old.vector.tolist()]
    lancedb.connect(str(tmp_path / "lance")).create_table("t_old", data=pa.table(values, schema=old_schema))

    restarted = LanceIndex(tmp_path / "lance", DIM, IndexConfig())
    assert sorted(restarted.tenants()) == ["fresh", "old"]
    assert restarted.drop_outdated() == ["old"]
    assert restarted.tenants() == ["fresh"]
    assert restarted.count("old") == 0
    restarted.upsert("old", [old])
    assert restarted.vector_search("old", old.vector, 1, ANY)[0].id == "m1"
    assert restarted.count("fresh") == 1


def _ann_indexed_600(path: Path, seed: int, rows: int) -> tuple[LanceIndex, dict[int, np.ndarray]]:
    """An index merging ANN deltas past 2, holding rows 0-599 of `rows` random vectors
    under an ANN index (the rest are for the test to add); no vector graph, so LanceDB
    answers every search."""
    cfg = IndexConfig(ann_min_rows=256, ann_nprobes=64, ann_max_deltas=2, vector_graph=False)
    index = LanceIndex(path, DIM, cfg)
    rng = np.random.default_rng(seed)
    vectors = {i: _unit(rng) for i in range(rows)}
    index.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}") for i in range(600)])
    assert "ann_index" in index.optimize(TENANT)
    return index, vectors


def test_a_bound_given_for_one_optimize_replaces_ann_max_deltas(tmp_path: Path) -> None:
    """A backlog's optimizes merge past their own, larger bound (index.ann_backlog_max_deltas)."""
    index, vectors = _ann_indexed_600(tmp_path / "lance", seed=5, rows=700)
    merged = []
    for start in range(600, 700, 25):
        index.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}") for i in range(start, start + 25)])
        merged.append(index.optimize(TENANT, max_deltas=4).get("merged_vector_deltas", 0))
    assert merged == [0, 0, 0, 4]  # 2, 3 and 4 deltas stay; the fifth makes it merge
    assert index.vector_deltas(TENANT) == 2
    _check(index, {f"m{i}": (vectors[i], f"w{i}") for i in (0, 599, 600, 699)}, set())


def test_ann_deltas_are_merged_without_losing_concurrent_writes(tmp_path: Path) -> None:
    import threading

    index, vectors = _ann_indexed_600(tmp_path / "lance", seed=11, rows=900)

    def small_deltas(rows: range) -> None:
        """Backlog-only optimizes add a small delta each and do not merge."""
        for start in range(rows.start, rows.stop, 25):
            index.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}") for i in range(start, start + 25)])
            assert "merged_vector_deltas" not in index.optimize(TENANT, merge_deltas=False)

    small_deltas(range(600, 700))
    assert index.vector_deltas(TENANT) == 5
    assert index.optimize(TENANT)["merged_vector_deltas"] == 4  # the small ones, not the base
    assert index.vector_deltas(TENANT) == 2

    # The merge runs outside the table lock: writes made meanwhile must all survive. (How
    # many deltas it merges then depends on how many of them arrive before it starts.)
    small_deltas(range(700, 800))

    def write_one_by_one() -> None:
        for i in range(800, 900):
            index.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}")])

    # Searches go on throughout: maintenance must never hold the dataset object they read.
    failures: list[BaseException] = []
    stop = threading.Event()

    def search() -> None:
        while not stop.is_set():
            try:
                index.vector_search(TENANT, vectors[3], 5, ANY)
                index.text_search(TENANT, "w3", 5, ANY)
            except BaseException as exc:  # any failure is the finding
                failures.append(exc)

    writer = threading.Thread(target=write_one_by_one)
    searcher = threading.Thread(target=search)
    searcher.start()
    writer.start()
    done = index.optimize(TENANT)
    writer.join()
    index.compact(TENANT)
    stop.set()
    searcher.join()
    assert failures == []
    assert done["merged_vector_deltas"] >= 4
    index.optimize(TENANT, merge_deltas=False)
    assert index.vector_deltas(TENANT) <= 4
    _check(index, {f"m{i}": (vectors[i], f"w{i}") for i in (0, 599, 600, 699, 700, 899)}, set())
    assert index.count(TENANT) == 900


@pytest.mark.parametrize("cache_rows", [200_000, 3], ids=["cached", "over_the_cap"])
def test_hit_attributes_follow_updates_deletes_and_restarts(tmp_path: Path, cache_rows: int) -> None:
    """Searches read hit attributes from the in-memory cache the index's own writes keep;
    what is not cached (past the cap, or after a restart) is read from the table. Either
    way a hit carries its current text, and a deleted row never comes back."""
    cfg = IndexConfig(attrs_cache_rows=cache_rows)
    rng = np.random.default_rng(3)
    vectors = {i: _unit(rng) for i in range(8)}
    index = LanceIndex(tmp_path / "lance", DIM, cfg)
    index.upsert(TENANT, [_row(i, vectors[i], word=f"first{i}") for i in range(8)])
    index.upsert(TENANT, [_row(2, vectors[2], word="second2", revision=2)])
    index.delete(TENANT, ["m5"])

    def check(ix: LanceIndex) -> None:
        top = ix.vector_search(TENANT, vectors[2], 8, ANY)
        assert top[0].id == "m2" and "second2" in top[0].attrs.text
        assert "m5" not in {h.id for h in top}
        assert len(top) == 7
        text = ix.text_search(TENANT, "second2", 5, ANY)
        assert [(h.id, h.attrs.text) for h in text] == [("m2", "memory number 2 about second2")]
        assert ix.text_search(TENANT, "first5", 5, ANY) == []
        rows = ix.rows(TENANT, ["m2", "m5", "m7"])
        assert sorted(rows) == ["m2", "m7"] and "second2" in rows["m2"][0].text
        assert {h.id: h.attrs.seq for h in top} == {f"m{i}": i for i in range(8) if i != 5}

    check(index)
    assert index.warm(TENANT)["attrs"] == min(7, cache_rows)  # m5 left the cache with its row
    restarted = LanceIndex(tmp_path / "lance", DIM, cfg)
    check(restarted)  # the first search loads the cache from the table
    assert restarted.warm(TENANT)["attrs"] == min(7, cache_rows)
    check(restarted)


def test_a_session_holding_superseded_index_files_is_renewed_warm_and_searches_agree(tmp_path: Path) -> None:
    cfg = IndexConfig(ann_min_rows=256, ann_nprobes=64, vector_graph=False)
    index = LanceIndex(tmp_path / "lance", DIM, cfg)
    rng = np.random.default_rng(5)
    vectors = {i: _unit(rng) for i in range(700)}
    index.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}") for i in range(600)])
    index.optimize(TENANT)  # builds the indices
    h = index._handle(TENANT, create=False)
    assert h is not None
    old_session = h.session
    index.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}") for i in range(600, 700)])
    assert "session_mb_before_after" not in index.optimize(TENANT)  # defaults: a 64 MB allowance
    assert h.session is old_session
    before = {i: [x.id for x in index.vector_search(TENANT, vectors[i], 5, ANY)] for i in (0, 299, 650)}
    texts = [x.id for x in index.text_search(TENANT, "w42", 5, ANY)]

    # Now any cache at all crosses the bound (the table maintenance's): factor ~0, no allowance.
    index._maintenance.cfg = dataclasses.replace(index.cfg, cache_renew_factor=1e-9, cache_renew_slack_mb=0)
    h.session_measure_s = 3600.0  # as if measuring the old session had taken an hour
    done = index.optimize(TENANT)

    assert "session_mb_before_after" in done
    assert h.session is not old_session
    # The warm session's measure, and what it took, set when the next measure comes.
    assert h.session_measure_s < 3600.0
    # What a status read reports is the renewed session's measure, not the old one's.
    assert index.cache_use(TENANT).index_session_bytes == h.warm_session_bytes > 0
    # The renewed session is not renewed again until it outgrows what it held when new,
    # however low the bound: else every optimize would pay for a fresh one.
    renewed = h.session
    assert "session_mb_before_after" not in index.optimize(TENANT)
    assert h.session is renewed
    # It holds what was read into it before it served (this alone would not tell a warm-up
    # from the refresh's own reads: the bench's renewals log 45-65 MB held at 100k rows).
    assert h.session.size_bytes() > 0
    for i, ids in before.items():
        assert [x.id for x in index.vector_search(TENANT, vectors[i], 5, ANY)] == ids
    assert [x.id for x in index.text_search(TENANT, "w42", 5, ANY)] == texts
    _check(index, {f"m{i}": (vectors[i], f"w{i}") for i in (0, 650, 699)}, set())


def test_scoped_vector_search_from_memory_agrees_with_an_exact_search(tmp_path: Path) -> None:
    """Searches filtered by a few small scopes are answered from the in-memory scope vectors
    (index/scope_vectors.py); they must follow writes, moves and deletes, be reloaded after
    a restart, and rank as an exact search over the same rows does. (Without the vector graph,
    where LanceDB's ANN index answers the searches over more rows.)"""
    cfg = IndexConfig(ann_min_rows=256, ann_nprobes=64, exact_scope_search_max_rows=400, vector_graph=False)
    rng = np.random.default_rng(21)
    vectors = {i: _unit(rng) for i in range(700)}
    scope_of = {i: "a" if i < 300 else ("b" if i < 600 else "c") for i in vectors}

    def row(i: int) -> IndexRow:
        return dataclasses.replace(_row(i, vectors[i], word=f"w{i}"), scope=f"project:{scope_of[i]}")

    index = LanceIndex(tmp_path / "lance", DIM, cfg)
    index.upsert(TENANT, [row(i) for i in range(650)])
    index.optimize(TENANT)
    for i in range(650, 700):
        index.upsert(TENANT, [row(i)])
    vectors[7] = _unit(rng)
    scope_of[7] = "c"  # moved, with a new vector
    index.upsert(TENANT, [dataclasses.replace(row(7), revision=2)])
    index.delete(TENANT, ["m8", "m650"])
    del vectors[8], vectors[650]

    def exact(q: np.ndarray, scopes: set[str], k: int) -> list[str]:
        members = [i for i in vectors if scope_of[i] in scopes]
        return [f"m{i}" for i in sorted(members, key=lambda i: -float(vectors[i] @ q))[:k]]

    def check(ix: LanceIndex) -> None:
        for qi in (0, 7, 100, 400, 660, 699):
            q = vectors[qi]
            for scopes in ({"a"}, {"c"}, {"a", "c"}, {"b", "c"}):
                f = MemoryFilter(scopes=tuple(Scope(ScopeKind.PROJECT, s) for s in sorted(scopes)))
                found = [h.id for h in ix.vector_search(TENANT, q, 10, f)]
                truth = exact(q, scopes, 10)
                assert set(found) <= {f"m{i}" for i in vectors if scope_of[i] in scopes}
                assert len(set(found) & set(truth)) >= 9, (qi, scopes, found, truth)
                if scope_of[qi] in scopes:
                    assert found[0] == f"m{qi}"
        assert "m8" not in {h.id for h in ix.vector_search(TENANT, vectors[9], 50, _scope_filter("a"))}

    assert index.stats(TENANT)["scope_vector_rows"] == 698  # a new table: kept from the start
    check(index)
    small, large = _scope_filter("c"), MemoryFilter(scopes=(Scope(ScopeKind.PROJECT, "a"),) * 2)
    h = index._handle(TENANT, create=False)
    assert h is not None
    assert index._exact_in_memory(h, small, [s.key for s in small.scopes])  # 101 rows
    both = _scope_filter("a"), _scope_filter("b")
    ab = MemoryFilter(scopes=both[0].scopes + both[1].scopes)  # 597 rows: over the 400
    assert not index._exact_in_memory(h, ab, [s.key for s in ab.scopes])
    typed = dataclasses.replace(small, categories=("c",))  # more than scopes: LanceDB
    assert not index._exact_in_memory(h, typed, [s.key for s in typed.scopes])
    assert large.scopes  # a repeated scope counts once
    assert index._exact_in_memory(h, large, [s.key for s in large.scopes])

    restarted = LanceIndex(tmp_path / "lance", DIM, cfg)
    assert restarted.stats(TENANT)["scope_vector_rows"] is None  # not loaded by a status read
    check(restarted)  # the first search loads them
    assert restarted.warm(TENANT)["scope_vectors"] == 698
    check(restarted)
    off = LanceIndex(tmp_path / "lance", DIM, dataclasses.replace(cfg, exact_scope_search_max_rows=0))
    assert off.warm(TENANT)["scope_vectors"] == 0
    assert off.stats(TENANT)["scope_vector_rows"] is None
    check(off)


def test_optimize_and_compaction_run_beside_appends_updates_and_deletes(index: LanceIndex) -> None:
    """Once the rows outside the ANN index are known, optimize and compaction do not hold
    the table lock (it held index writes back for seconds at 100k rows), so writes of every
    kind land while they run: none may be lost, resurrected or left unsearchable."""
    import threading

    rng = np.random.default_rng(23)
    vectors = {i: _unit(rng) for i in range(700)}
    words = {i: f"w{i}" for i in range(700)}
    index.upsert(TENANT, [_row(i, vectors[i], word=words[i]) for i in range(500)])
    index.optimize(TENANT)
    assert index.stats(TENANT)["pending_rows"] == 0
    deleted: set[int] = set()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for i in range(500, 700):
                index.upsert(TENANT, [_row(i, vectors[i], word=words[i])])  # a new row
                if i % 4 == 0:  # an indexed row rewritten with a new vector and text
                    j = i - 480
                    vectors[j], words[j] = _unit(rng), f"edited{j}"
                    index.upsert(TENANT, [_row(j, vectors[j], word=words[j], revision=2)])
                if i % 10 == 5:
                    gone = i - 400
                    index.delete(TENANT, [f"m{gone}"])
                    deleted.add(gone)
        except BaseException as exc:  # any failure is the finding
            failures.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    rounds = []
    while writer.is_alive():
        rounds.append(index.optimize(TENANT, merge_deltas=False))
        index.compact(TENANT)
    writer.join()
    assert failures == []
    assert len(rounds) >= 2 and all(r.get("beside_writes") for r in rounds)

    live = {i for i in vectors if i not in deleted}
    sample = sorted(live)[::7] + [i - 480 for i in range(500, 700, 4) if i - 480 in live]

    def check() -> None:
        _check(index, {f"m{i}": (vectors[i], words[i]) for i in sample}, {f"m{i}" for i in deleted})
        assert index.count(TENANT) == len(live)

    check()
    index.optimize(TENANT)  # nothing written meanwhile: every row is in the indices now
    assert index.stats(TENANT)["pending_rows"] == 0
    check()
    check_reopened = LanceIndex(index.path, DIM, index.cfg)
    assert check_reopened.count(TENANT) == len(live)


@pytest.mark.parametrize("keep_s", [0.0, 3600.0])
def test_optimize_drops_versions_older_than_kept_and_searches_still_agree(
    tmp_path: Path, keep_s: float
) -> None:
    """Every write commits a Lance version; optimize drops those older than keep_versions_s
    (a search may still read one that young), so the table's history does not pile up."""
    index = LanceIndex(tmp_path / "lance", DIM, IndexConfig(ann_min_rows=256, keep_versions_s=keep_s))
    rng = np.random.default_rng(11)
    vectors = {i: _unit(rng) for i in range(300)}
    index.upsert(TENANT, [_row(i, vectors[i], word=f"base{i}") for i in range(300)])
    index.optimize(TENANT)
    for i in range(300, 312):
        vectors[i] = _unit(rng)
        index.upsert(TENANT, [_row(i, vectors[i], word=f"fresh{i}")])
    versions_dir = tmp_path / "lance" / f"{LanceIndex.table_name(TENANT)}.lance" / "_versions"
    before = len(list(versions_dir.glob("*.manifest")))
    assert before > 12  # one version a write at least

    index.optimize(TENANT)

    after = len(list(versions_dir.glob("*.manifest")))
    if keep_s:
        assert after > before  # all kept, the optimize's own versions added
    else:
        assert after <= 2, after  # the newest, and at most the one a concurrent reader pinned
    expected = {f"m{i}": (vectors[i], f"fresh{i}") for i in range(300, 312)}
    expected |= {f"m{i}": (vectors[i], f"base{i}") for i in (0, 150, 299)}
    _check(index, expected, set())
    reopened = LanceIndex(tmp_path / "lance", DIM, IndexConfig(ann_min_rows=256, keep_versions_s=keep_s))
    _check(reopened, expected, set())


def test_compaction_waits_for_enough_fragments(tmp_path: Path) -> None:
    """Each compaction commits a version and remaps the indices; below
    index.compact_min_fragments fragments it is not worth that and is skipped."""
    index = LanceIndex(tmp_path / "lance", DIM, IndexConfig(ann_min_rows=256, compact_min_fragments=6))
    rng = np.random.default_rng(5)
    vectors = {i: _unit(rng) for i in range(9)}
    for i in range(4):
        index.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}")])
    assert index.stats(TENANT)["fragments"] == 4
    assert index.compact(TENANT) == 0
    assert index.stats(TENANT)["fragments"] == 4
    for i in range(4, 9):
        index.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}")])
    assert index.compact(TENANT) > 0
    assert index.stats(TENANT)["fragments"] < 9
    _check(index, {f"m{i}": (vectors[i], f"w{i}") for i in range(9)}, set())


def test_compaction_leaves_fragments_of_the_target_size_alone(tmp_path: Path) -> None:
    """Without an ANN index every fragment is covered by the same indices after an optimize,
    and Lance would merge them all: compaction must not rewrite a fragment that already has
    index.compact_target_rows rows, only the runs of smaller ones, and lose no row doing so."""
    cfg = IndexConfig(compact_min_fragments=0, compact_target_rows=100)
    index = LanceIndex(tmp_path / "lance", DIM, cfg)
    rng = np.random.default_rng(13)
    vectors = {i: _unit(rng) for i in range(260)}
    h = index._handle(TENANT, create=True)
    assert h is not None

    def fragments() -> dict[int, int]:
        return {f.fragment_id: f.count_rows() for f in h.reader.get_fragments()}

    for start in range(0, 250, 10):
        index.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}") for i in range(start, start + 10)])
    index.optimize(TENANT)
    full = {fid: n for fid, n in fragments().items() if n >= 100}
    assert full and sum(fragments().values()) == 250, fragments()
    for i in range(250, 260):
        index.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}")])
    assert index.compact(TENANT) > 0
    after = fragments()
    assert full.items() <= after.items(), (full, after)  # the same fragments, not rewritten
    assert sum(after.values()) == 260 and len(after) <= 4
    _check(index, {f"m{i}": (vectors[i], f"w{i}") for i in range(0, 260, 13)}, set())


def test_lance_cpu_pool_has_threads_beyond_the_cores_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """With Lance's default pool (one thread a core) an ANN delta merge held the whole pool
    and a vector search waited for all of it (8.8 s of an 8.9 s merge at 100k, measured with
    /work/exp/merge_block.py on a copy of bench data); cores + 2 let searches go on."""
    monkeypatch.delenv("LANCE_CPU_THREADS", raising=False)
    monkeypatch.setattr(lance_index.os, "cpu_count", lambda: 2)
    assert lance_index.size_lance_cpu_pool(0) == "4"
    monkeypatch.delenv("LANCE_CPU_THREADS")
    assert lance_index.size_lance_cpu_pool(6) == "6"
    monkeypatch.setenv("LANCE_CPU_THREADS", "3")  # an operator's own setting stands
    assert lance_index.size_lance_cpu_pool(0) == "3"


def test_the_lance_session_is_measured_again_only_when_it_costs_its_share_of_the_time(
    tmp_path: Path,
) -> None:
    """Lance's size_bytes walks the session's caches holding the GIL, stalling every call in
    flight (config.py, session_measure_max_share): status reads and the renewal check take
    the last measure until measuring again keeps to the share."""
    rng = np.random.default_rng(8)
    for share, measured_again in ((1e-9, False), (0.0, True)):
        index = LanceIndex(tmp_path / f"lance-{share}", DIM, IndexConfig(session_measure_max_share=share))
        index.upsert(TENANT, [_row(i, _unit(rng), word=f"w{i}") for i in range(20)])
        first = index.cache_use(TENANT).index_session_bytes
        for i in range(20, 60):  # each write reads the new version's manifest into the session
            index.upsert(TENANT, [_row(i, _unit(rng), word=f"w{i}")])
        h = index._handle(TENANT, create=False)
        assert h is not None
        now_held = int(h.session.size_bytes())
        assert now_held > first  # the premise: the session did grow
        assert index.cache_use(TENANT).index_session_bytes == (now_held if measured_again else first)
        index.close()


def test_with_the_vector_graph_a_renewed_session_holds_no_ann_index(tmp_path: Path) -> None:
    """With the graph the table has no ANN index, so a renewed LanceDB session holds less than
    one warmed with it."""
    rng = np.random.default_rng(6)
    vectors = {i: _unit(rng) for i in range(600)}
    warm_bytes: dict[bool, int] = {}
    for graph in (False, True):
        # Measured at every use: the renewal below sees the growth since the first one.
        cfg = IndexConfig(
            ann_min_rows=256,
            vector_graph=graph,
            cache_renew_factor=1e-9,
            cache_renew_slack_mb=0,
            session_measure_max_share=0,
        )
        index = LanceIndex(tmp_path / f"lance-{graph}", DIM, cfg)
        index.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}") for i in range(600)])
        index.optimize(TENANT)
        index.upsert(TENANT, [_row(0, vectors[0], word="w0")])
        h = index._handle(TENANT, create=False)
        assert h is not None
        done = index.optimize(TENANT)
        # Renewed (with the graph before the work) and still beside the writes: a renewal
        # first once made the whole optimize hold the table lock.
        assert "session_mb_before_after" in done and done.get("beside_writes"), done
        warm_bytes[graph] = h.warm_session_bytes
        assert [x.id for x in index.vector_search(TENANT, vectors[7], 1, ANY)] == ["m7"]
        index.close()
    assert warm_bytes[True] < warm_bytes[False]


def test_with_the_vector_graph_filtered_searches_scan_the_scope_vectors_exactly(tmp_path: Path) -> None:
    """With the graph (and the scope vectors it is built from) a table gets no ANN index: a
    search filtered by any scopes, or by other columns too, scans the scope vectors, limited
    to the rows LanceDB finds passing the filter. It follows writes and deletes at once and
    ranks as an exact search over the rows that pass."""
    rng = np.random.default_rng(9)
    vectors = {i: _unit(rng) for i in range(600)}

    def row(i: int) -> IndexRow:
        return dataclasses.replace(
            _row(i, vectors[i], word=f"w{i}"),
            scope=f"project:{'ab'[i % 2]}",
            type="episodic" if i % 3 == 0 else "semantic",
            pinned=i % 5 == 0,
            event_time_ns=i,
        )

    index = LanceIndex(tmp_path / "lance", DIM, IndexConfig(ann_min_rows=256, exact_scope_search_max_rows=50))
    index.upsert(TENANT, [row(i) for i in range(500)])
    index.optimize(TENANT)
    for i in range(500, 600, 20):  # after the optimize, outside LanceDB's scalar indices
        index.upsert(TENANT, [row(j) for j in range(i, i + 20)])
    index.delete(TENANT, ["m3", "m550"])
    del vectors[3], vectors[550]
    h = index._handle(TENANT, create=False)
    assert h is not None
    assert "vector_idx" not in index_names(h.table) and index.vector_deltas(TENANT) == 0

    filters: dict[str, tuple[MemoryFilter, Callable[[int], bool]]] = {
        "scope a (past exact_scope_search_max_rows)": (_scope_filter("a"), lambda i: i % 2 == 0),
        "episodic": (MemoryFilter(types=(MemoryType.EPISODIC,)), lambda i: i % 3 == 0),
        "pinned in b": (
            MemoryFilter(scopes=_scope_filter("b").scopes, pinned_only=True),
            lambda i: i % 2 == 1 and i % 5 == 0,
        ),
        "event time": (MemoryFilter(event_time=TimeRange(100, 200)), lambda i: 100 <= i < 200),
        "nothing passes": (MemoryFilter(categories=("none",)), lambda i: False),
    }
    for name, (f, passes) in filters.items():
        members = [i for i in vectors if passes(i)]
        for qi in (0, 5, 15, 150, 555, 590):
            q = vectors[qi]
            found = [x.id for x in index.vector_search(TENANT, q, 10, f)]
            truth = [f"m{i}" for i in sorted(members, key=lambda i: -float(vectors[i] @ q))[:10]]
            assert set(found) <= {f"m{i}" for i in members}, (name, qi, found)
            assert len(found) == len(truth) and len(set(found) & set(truth)) >= len(truth) - 1, (name, qi)
            if passes(qi):
                assert found[0] == f"m{qi}", (name, qi, found)


def test_indices_left_by_a_configuration_without_the_in_memory_ones_are_dropped(tmp_path: Path) -> None:
    """A data directory indexed without the graph and the in-memory postings has LanceDB's ANN
    and full-text indices; started with both (the defaults), the indices are dropped at
    start-up (nothing would read them, every optimize would fold rows into them), the rows are
    not indexed again, and the searches agree."""
    rng = np.random.default_rng(10)
    vectors = {i: _unit(rng) for i in range(300)}
    without = LanceIndex(
        tmp_path / "lance", DIM, IndexConfig(ann_min_rows=256, vector_graph=False, memory_text_search=False)
    )
    without.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}") for i in range(300)])
    without.optimize(TENANT)
    assert {"vector_idx", "text_idx"} <= without.stats(TENANT)["indices"].keys()
    without.close()

    index = LanceIndex(tmp_path / "lance", DIM, IndexConfig(ann_min_rows=256))
    assert index.drop_outdated() == []
    assert not {"vector_idx", "text_idx"} & index.stats(TENANT)["indices"].keys()
    assert index.unindexed_rows(TENANT) == 0 and index.rows_to_fold(TENANT) == 0
    warmed = index.warm(TENANT)
    assert warmed["scope_vectors"] == 300 and warmed["vector_graph"] == 300
    for qi in (0, 150, 299):
        assert index.vector_search(TENANT, vectors[qi], 1, ANY)[0].id == f"m{qi}"
        assert index.vector_search(TENANT, vectors[qi], 1, _scope_filter("none")) == []
        assert [x.id for x in index.text_search(TENANT, f"w{qi}", 3, ANY)] == [f"m{qi}"]  # loaded at need
    index.upsert(TENANT, [_row(300, _unit(rng), word="w300")])
    assert not {"ann_index", "text_index"} & index.optimize(TENANT).keys()
    assert not {"vector_idx", "text_idx"} & index.stats(TENANT)["indices"].keys()
    index.close()


def test_filtered_full_text_searches_come_from_the_postings(tmp_path: Path) -> None:
    """Without LanceDB's full-text index, a text search filtered on more than scopes is the
    postings' search limited to the rows LanceDB finds passing the filter: the same hits, in
    the same order, as the unfiltered search keeps of them."""
    rng = np.random.default_rng(11)
    index = LanceIndex(tmp_path / "lance", DIM, IndexConfig())
    rows = [
        dataclasses.replace(
            _row(i, _unit(rng), word="common" if i % 2 else "rare"),
            type="episodic" if i % 3 == 0 else "semantic",
            pinned=i % 4 == 0,
        )
        for i in range(120)
    ]
    index.upsert(TENANT, rows)
    everything = [x.id for x in index.text_search(TENANT, "common memory", 120, ANY)]
    assert len(everything) == 120
    for f, passes in (
        (MemoryFilter(types=(MemoryType.EPISODIC,)), lambda i: i % 3 == 0),
        (MemoryFilter(pinned_only=True), lambda i: i % 4 == 0),
        (MemoryFilter(types=(MemoryType.EPISODIC,), pinned_only=True), lambda i: i % 12 == 0),
        (MemoryFilter(categories=("none",)), lambda i: False),
    ):
        found = [x.id for x in index.text_search(TENANT, "common memory", 120, f)]
        assert found == [m for m in everything if passes(int(m[1:]))], f
        top = [x.id for x in index.text_search(TENANT, "common memory", 5, f)]
        assert top == found[:5]
    index.close()


def _graph_drained(index: LanceIndex) -> None:
    deadline = time.monotonic() + 30
    while index.stats(TENANT)["graph_queued"]:
        assert time.monotonic() < deadline, "the graph feeder never caught up"
        time.sleep(0.02)


def _saved_graph_then(path: Path, rows: list[IndexRow], later: Callable[[LanceIndex], None]) -> Path:
    """A graph of `rows` saved at close, then `later`'s writes with no save (a kill -9 after
    them); returns the graphs' folder."""
    graphs = path / "graphs"
    first = LanceIndex(path / "lance", DIM, IndexConfig(), graph_dir=graphs)
    first.upsert(TENANT, rows)
    _graph_drained(first)
    first.close()
    assert (graphs / "t_acme" / "graph.json").exists()
    unsaved = LanceIndex(path / "lance", DIM, IndexConfig(), graph_dir=None)
    later(unsaved)
    unsaved.close()
    return graphs


def _warmed_with_graph(path: Path, graphs: Path, caplog: pytest.LogCaptureFixture, rows: int) -> LanceIndex:
    index = LanceIndex(path / "lance", DIM, IndexConfig(), graph_dir=graphs)
    with caplog.at_level(logging.INFO, logger="mnemo_server.index"):
        assert index.warm(TENANT)["vector_graph"] == rows
    return index


def test_a_saved_vector_graph_is_read_at_warm_up_and_put_right_against_the_table(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Saved at close, read at the next warm-up; writes after the save that no orderly close
    followed (a kill -9) are found against the table's rows and put right."""
    rng = np.random.default_rng(5)
    vectors = {i: _unit(rng) for i in range(41)}

    def later(index: LanceIndex) -> None:  # m3 rewritten, m5 deleted, m40 new
        vectors[3] = _unit(rng)
        index.upsert(TENANT, [_row(3, vectors[3], word="w3", revision=2), _row(40, vectors[40], word="w40")])
        index.delete(TENANT, ["m5"])

    graphs = _saved_graph_then(tmp_path, [_row(i, vectors[i], word=f"w{i}") for i in range(40)], later)
    third = _warmed_with_graph(tmp_path, graphs, caplog, 40)
    assert "loaded: 40 rows, 2 removed and 2 added" in caplog.text
    live = {i: v for i, v in vectors.items() if i != 5}
    for i, vector in live.items():
        hits = third.vector_search(TENANT, vector, 40, ANY)
        assert hits[0].id == f"m{i}" and hits[0].score > 0.99
        assert "m5" not in {h.id for h in hits} and len(hits) == 40
    third.close()


def test_a_saved_graph_that_differs_too_much_is_built_afresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rng = np.random.default_rng(6)
    rows = [_row(i, _unit(rng), word=f"w{i}") for i in range(40)]
    graphs = _saved_graph_then(tmp_path, rows[:20], lambda index: index.upsert(TENANT, rows[20:]))  # half new
    third = _warmed_with_graph(tmp_path, graphs, caplog, 40)
    assert "0 removals and 20 additions for 40 rows; built afresh" in caplog.text
    assert "built: 40 rows" in caplog.text
    third.drop_all()
    assert not graphs.exists()  # a dropped table's graph goes with it
    third.close()


def test_a_graph_is_saved_while_serving_once_writes_pause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No orderly close (a kill -9 later): the save made once writes paused is what the next
    start reads, with nothing to repair."""
    graphs = tmp_path / "graphs"
    cfg = IndexConfig(graph_save_quiet_s=0.1, graph_save_changes=10)
    rng = np.random.default_rng(7)
    vectors = {i: _unit(rng) for i in range(20)}
    serving = LanceIndex(tmp_path / "lance", DIM, cfg, graph_dir=graphs)
    try:
        serving.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}") for i in range(20)])
        deadline = time.monotonic() + 20
        while not (graphs / "t_acme" / "graph.json").exists():
            assert time.monotonic() < deadline, "the feeder never saved the graph"
            time.sleep(0.05)
        restarted = LanceIndex(tmp_path / "lance", DIM, cfg, graph_dir=graphs)
        with caplog.at_level(logging.INFO, logger="mnemo_server.index"):
            assert restarted.warm(TENANT)["vector_graph"] == 20
        assert "loaded: 20 rows, 0 removed and 0 added" in caplog.text
        assert restarted.vector_search(TENANT, vectors[4], 1, ANY)[0].id == "m4"
        restarted.close()
    finally:
        serving.close()


def _varied_row(i: int, vector: np.ndarray) -> IndexRow:
    return dataclasses.replace(
        _row(i, vector, word="common" if i % 2 else "rare"),
        scope=f"project:{'ab'[i % 2]}",
        type="episodic" if i % 3 == 0 else "semantic",
        category=f"c{i % 4}",
        session=f"s{i % 5}",
        pinned=i % 7 == 0,
        event_time_ns=i,
        create_time_ns=1000 + i,
    )


VARIED_FILTERS = [
    MemoryFilter(types=(MemoryType.EPISODIC,)),
    MemoryFilter(categories=("c1", "c2")),
    MemoryFilter(source_session_ids=("s3",)),
    MemoryFilter(pinned_only=True),
    MemoryFilter(create_time=TimeRange(1100, 1250)),
    MemoryFilter(event_time=TimeRange(None, 40), types=(MemoryType.SEMANTIC,)),
    MemoryFilter(scopes=_scope_filter("a").scopes, categories=("c0",)),
    MemoryFilter(categories=("none",)),
]


def test_the_attributes_pass_a_filter_exactly_when_lancedb_finds_the_row_passing_it(tmp_path: Path) -> None:
    """Searches filtered without scopes keep the hits whose cached attributes pass the filter
    (Attrs.passes); LanceDB evaluates the same filter as SQL (filter_sql). Both must agree."""
    rng = np.random.default_rng(12)
    index = LanceIndex(tmp_path / "lance", DIM, IndexConfig())
    index.upsert(TENANT, [_varied_row(i, _unit(rng)) for i in range(300)])
    h = index._handle(TENANT, create=False)
    assert h is not None
    ids = [f"m{i}" for i in range(300)]
    for attrs in (
        index.attrs(TENANT, ids),
        dict(read_attrs(h.reader.to_table(columns=["id", *ATTR_COLUMNS]))),
    ):
        assert len(attrs) == 300
        for f in VARIED_FILTERS:
            lance = set(h.reader.to_table(columns=["id"], filter=filter_sql(f)).column("id").to_pylist())
            assert {i for i, a in attrs.items() if a.passes(f)} == lance, f
    index.close()


def test_searches_filtered_without_scopes_keep_the_best_hits_that_pass(tmp_path: Path) -> None:
    """A search filtered on other columns but no scopes asks the graph (or the postings) for
    more hits and keeps those that pass, without reading which rows pass from LanceDB, while
    that finds k of them; a filter few rows pass is answered by the exact scan. Either way
    the hits pass the filter and are the best of those that do."""
    rng = np.random.default_rng(13)
    vectors = {i: _unit(rng) for i in range(400)}
    index = LanceIndex(tmp_path / "lance", DIM, IndexConfig())
    index.upsert(TENANT, [_varied_row(i, vectors[i]) for i in range(400)])
    _graph_drained(index)
    h = index._handle(TENANT, create=False)
    assert h is not None
    everything = [x.id for x in index.text_search(TENANT, "common rare memory", 400, ANY)]
    for f, passes, broad in (
        (MemoryFilter(types=(MemoryType.EPISODIC,)), lambda i: i % 3 == 0, True),
        (MemoryFilter(categories=("c1", "c2")), lambda i: i % 4 in (1, 2), True),
        (MemoryFilter(pinned_only=True, types=(MemoryType.EPISODIC,)), lambda i: i % 21 == 0, False),
        (MemoryFilter(categories=("none",)), lambda i: False, False),
    ):
        members = [i for i in vectors if passes(i)]
        for qi in (0, 7, 21, 150):
            h.last_matching = None
            found = [x.id for x in index.vector_search(TENANT, vectors[qi], 10, f)]
            truth = [f"m{i}" for i in sorted(members, key=lambda i: -float(vectors[i] @ vectors[qi]))[:10]]
            assert set(found) <= {f"m{i}" for i in members}, (f, qi, found)
            assert len(found) == len(truth) and len(set(found) & set(truth)) >= len(truth) - 1, (f, qi)
            text = [x.id for x in index.text_search(TENANT, "common rare memory", 10, f)]
            assert text == [m for m in everything if passes(int(m[1:]))][:10], f
            # Broad filters never asked LanceDB which rows pass; selective ones did.
            assert (h.last_matching is None) == broad, (f, qi)
    index.close()


def test_a_graph_built_at_load_finds_every_row_by_its_own_vector(tmp_path: Path) -> None:
    """Built on one thread: usearch's add on several threads leaves some rows stored yet
    unreachable (usearch issue #735; ~9 of 2,000 here on two threads)."""
    rng = np.random.default_rng(21)
    vectors = [_unit(rng) for _ in range(2000)]
    writer = LanceIndex(tmp_path / "lance", DIM, IndexConfig())
    writer.upsert(TENANT, [_row(i, v, word=f"w{i}") for i, v in enumerate(vectors)])
    writer.close()
    index = LanceIndex(tmp_path / "lance", DIM, IndexConfig(), graph_dir=None)  # built afresh
    assert index.warm(TENANT)["vector_graph"] == 2000
    missed = [i for i, v in enumerate(vectors) if index.vector_search(TENANT, v, 1, ANY)[0].id != f"m{i}"]
    assert missed == []
    index.close()


def _unreferenced_data_files(h: Any) -> set[str]:
    import lance

    named = {
        Path(f.path).name
        for v in h.reader.versions()
        for frag in lance.dataset(h.uri, version=v["version"]).get_fragments()
        for f in frag.data_files()
    }
    return {p.name for p in (Path(h.uri) / "data").iterdir()} - named


def test_a_lost_compactions_files_are_removed_under_the_table_lock(tmp_path: Path) -> None:
    """A compaction whose commit loses to a concurrent delete leaves the files it wrote, which
    no version names, and Lance kept them 7 days (a churned tenant: 114 of 128 MB)."""
    from lance.optimize import Compaction, CompactionOptions

    index = LanceIndex(tmp_path / "lance", DIM, IndexConfig(compact_min_fragments=0, vector_graph=False))
    rng = np.random.default_rng(17)
    vectors = {i: _unit(rng) for i in range(8)}
    for i in range(8):
        index.upsert(TENANT, [_row(i, vectors[i], word=f"w{i}")])
    h = index._handle(TENANT, create=False)
    assert h is not None
    dataset = h.for_maintenance()
    plan = Compaction.plan(dataset, CompactionOptions(target_rows_per_fragment=1024))
    rewritten = [task.execute(dataset) for task in plan.tasks]
    index.delete(TENANT, ["m3"])  # commits first
    with pytest.raises(OSError, match="onflict"):
        Compaction.commit(dataset, rewritten)
    lost = _unreferenced_data_files(h)
    assert lost  # the lost compaction's, which the cleanup each optimize runs leaves alone:
    h.for_maintenance().cleanup_old_versions(older_than=timedelta(seconds=index.cfg.keep_versions_s))
    assert _unreferenced_data_files(h) == lost
    with h.lock:
        index._maintenance.remove_lost_files(h)
    h.refresh()
    assert not _unreferenced_data_files(h)
    _check(index, {f"m{i}": (vectors[i], f"w{i}") for i in range(8) if i != 3}, {"m3"})
