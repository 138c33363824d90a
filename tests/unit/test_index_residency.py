"""The tenants whose search indices stay in memory are bounded (index/residency.py): the
least recently used are dropped past the bounds and loaded again by their next search, with
nothing lost, whatever writes run meanwhile. Real LanceDB files and vector graphs."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mnemo_server.config import IndexConfig
from mnemo_server.errors import Unavailable
from mnemo_server.index.lance_index import IndexRow, LanceIndex
from mnemo_server.index.residency import ResidencyBounds, Resident, has_room, to_drop
from mnemo_server.memory.model import MemoryFilter
from tests.unit.test_lance_index import _row as lance_row

DIM = 32
ANY = MemoryFilter()


def _row(i: int, vector: np.ndarray, *, revision: int = 1) -> IndexRow:
    """Row m{i}, its text holding the word w{i}."""
    return lance_row(i, vector, word=f"w{i}", revision=revision)


def _units(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        v = rng.standard_normal(DIM).astype(np.float32)
        out.append(v / np.linalg.norm(v))
    return out


def _bounded(path: Path, **bounds: float) -> LanceIndex:
    # Searches wait as long as a load takes on a busy machine (load_wait_s has its own test).
    cfg = dataclasses.replace(IndexConfig(), resident_min_idle_s=0.0, load_wait_s=60.0, **bounds)  # type: ignore[arg-type]
    return LanceIndex(path / "lance", DIM, cfg, graph_dir=path / "graphs")


def _answers(index: LanceIndex, tenant: str, vectors: dict[int, np.ndarray]) -> list[tuple[str, str]]:
    """Each row's nearest vector hit and its word's full-text hit."""
    return [
        (index.vector_search(tenant, v, 1, ANY)[0].id, index.text_search(tenant, f"w{i}", 1, ANY)[0].id)
        for i, v in vectors.items()
    ]


# --- the choice --------------------------------------------------------------------------


def test_the_least_recently_used_are_dropped_until_within_both_bounds() -> None:
    kept = [Resident("a", 10.0, 500), Resident("b", 30.0, 100), Resident("c", 20.0, 100)]
    assert to_drop(kept, ResidencyBounds(3, 0, 0.0), now=100.0) == []
    assert to_drop(kept, ResidencyBounds(2, 0, 0.0), now=100.0) == ["a"]
    assert to_drop(kept, ResidencyBounds(1, 0, 0.0), now=100.0) == ["a", "c"]
    assert to_drop(kept, ResidencyBounds(0, 250, 0.0), now=100.0) == ["a"]  # 200 rows left
    assert to_drop(kept, ResidencyBounds(0, 150, 0.0), now=100.0) == ["a", "c"]
    # Used within min_idle_s: kept past the bounds, and so is every one used after it.
    assert to_drop(kept, ResidencyBounds(1, 0, 85.0), now=100.0) == ["a"]
    assert to_drop(kept, ResidencyBounds(1, 0, 95.0), now=100.0) == []


def test_start_up_loads_one_more_while_it_fits() -> None:
    assert has_room(0, 10**9, ResidencyBounds(1, 1, 0.0))  # at least one
    assert has_room(1, 10, ResidencyBounds(2, 100, 0.0))
    assert not has_room(2, 10, ResidencyBounds(2, 100, 0.0))
    assert not has_room(1, 101, ResidencyBounds(5, 100, 0.0))
    assert has_room(50, 10**9, ResidencyBounds(0, 0, 0.0))  # no bounds


# --- LanceIndex --------------------------------------------------------------------------


def test_a_dropped_tenant_answers_the_same_after_its_next_search_loads_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    index = _bounded(tmp_path, max_resident_tenants=2)
    vectors = {t: _units(seed, 30) for seed, t in enumerate(("a", "b", "c"))}
    for t, vs in vectors.items():
        index.upsert(t, [_row(i, v) for i, v in enumerate(vs)])
    before = {t: _answers(index, t, dict(enumerate(vs))) for t, vs in vectors.items()}  # "a" used first
    assert all(hits == [(f"m{i}", f"m{i}") for i in range(30)] for hits in before.values())

    assert index.trim() == ["a"]
    assert not index.is_kept("a") and index.is_kept("b") and index.is_kept("c")
    assert index.cache_use("a").scope_vector_bytes == 0  # a status read opens nothing
    assert not index.is_kept("a")
    stats = index.residency()
    assert (stats.tenants, stats.rows, stats.max_tenants, stats.drops) == (2, 60, 2, 1)
    assert (tmp_path / "graphs" / "t_a" / "graph.json").exists()  # saved as it was dropped

    with caplog.at_level(logging.INFO, logger="mnemo_server.index"):
        assert _answers(index, "a", dict(enumerate(vectors["a"]))) == before["a"]
    assert "vector graph of" in caplog.text and "loaded: 30 rows, 0 removed and 0 added" in caplog.text
    assert index.is_kept("a") and index.residency().loads == 1
    assert index.trim() == ["b"]  # now the least recently used
    index.close()


def test_the_row_bound_drops_the_least_recently_used_and_min_idle_keeps_the_busy(tmp_path: Path) -> None:
    index = _bounded(tmp_path, max_resident_tenants=0, max_resident_rows=50)
    for seed, t in enumerate(("a", "b")):
        index.upsert(t, [_row(i, v) for i, v in enumerate(_units(seed, 30))])
    index.vector_search("a", _units(9, 1)[0], 1, ANY)
    index.vector_search("b", _units(9, 1)[0], 1, ANY)
    assert index.residency().rows == 60
    idle = LanceIndex(
        tmp_path / "lance",
        DIM,
        dataclasses.replace(IndexConfig(), max_resident_rows=50, resident_min_idle_s=3600.0),
    )
    idle.vector_search("a", _units(9, 1)[0], 1, ANY)
    idle.vector_search("b", _units(9, 1)[0], 1, ANY)
    assert idle.trim() == []  # both used within the hour: kept past the bound
    assert index.trim() == ["a"] and index.residency().rows == 30
    index.close()
    idle.close()


def test_writes_to_a_dropped_tenant_are_searchable_once_it_loads_again(tmp_path: Path) -> None:
    index = _bounded(tmp_path, max_resident_tenants=1)
    a, b = _units(1, 21), _units(2, 5)
    index.upsert("a", [_row(i, v) for i, v in enumerate(a[:20])])
    index.upsert("b", [_row(i, v) for i, v in enumerate(b)])
    index.vector_search("b", b[0], 1, ANY)
    assert index.trim() == ["a"]
    index.upsert("a", [_row(20, a[20]), _row(3, a[3], revision=2)])  # opened, not loaded
    index.delete("a", ["m4"])
    assert not index.is_kept("a") and index.stats("a")["scope_vector_rows"] is None
    live = [i for i in range(21) if i != 4]
    hits = _answers(index, "a", {i: a[i] for i in live})
    assert hits == [(f"m{i}", f"m{i}") for i in live]
    assert "m4" not in {h.id for h in index.vector_search("a", a[4], 30, ANY)}
    assert index.text_search("a", "w4", 5, ANY) == []
    assert index.warm("a") == {"attrs": 20, "scope_vectors": 20, "text_postings": 20, "vector_graph": 20}
    index.close()


def test_drops_and_loads_under_concurrent_writes_and_searches_lose_nothing(tmp_path: Path) -> None:
    """One thread writes tenant "a" batch after batch, one searches it (loading it again
    each time it was dropped), one drops it again and again: afterwards every write is in
    each of its in-memory indices."""
    index = _bounded(tmp_path)
    vectors = _units(3, 400)
    done = threading.Event()
    errors: list[BaseException] = []

    def writing() -> None:
        try:
            for start in range(0, 400, 10):
                index.upsert("a", [_row(i, vectors[i]) for i in range(start, start + 10)])
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        finally:
            done.set()

    def searching() -> None:
        try:
            while not done.is_set():
                index.vector_search("a", vectors[0], 5, ANY)
                index.text_search("a", "w1", 5, ANY)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writing), threading.Thread(target=searching)]
    for th in threads:
        th.start()
    dropped = 0
    while not done.is_set():
        dropped += index._drop("t_a")  # not while a search loads it
        time.sleep(0.01)
    for th in threads:
        th.join(60)
    assert not errors, errors
    assert dropped >= 3, dropped  # it was dropped while written and searched
    warmed = index.warm("a")
    assert warmed["scope_vectors"] == warmed["text_postings"] == 400
    deadline = time.monotonic() + 30
    while index.stats("a")["graph_queued"]:
        assert time.monotonic() < deadline, "the graph feeder never caught up"
        time.sleep(0.02)
    assert index.warm("a")["vector_graph"] == 400
    assert _answers(index, "a", dict(enumerate(vectors))) == [(f"m{i}", f"m{i}") for i in range(400)]
    assert index.residency().drops == dropped
    index.close()


def test_tenants_come_most_recently_written_first(tmp_path: Path) -> None:
    index = _bounded(tmp_path)
    for n, t in enumerate(("a", "b", "c")):
        index.upsert(t, [_row(0, _units(n, 1)[0])])
    versions = tmp_path / "lance" / "t_b.lance" / "_versions"
    os.utime(versions, (time.time() + 60, time.time() + 60))  # "b" written last
    assert index.tenants_newest_first()[0] == "b"
    index.close()


def test_a_search_waits_for_a_load_at_most_load_wait_s_and_never_loads_in_its_thread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The load runs on the loading thread: a search that finds it unfinished after
    load_wait_s fails UNAVAILABLE (INDEX_LOADING, which clients retry) instead of holding
    its call's compute slot through a large tenant's load."""
    vectors = _units(4, 50)
    writer = LanceIndex(tmp_path / "lance", DIM, IndexConfig())
    writer.upsert("a", [_row(i, v) for i, v in enumerate(vectors)])
    writer.close()
    index = LanceIndex(tmp_path / "lance", DIM, dataclasses.replace(IndexConfig(), load_wait_s=0.0))
    with caplog.at_level(logging.INFO, logger="mnemo_server.index.lance_index"):
        with pytest.raises(Unavailable) as raised:
            index.vector_search("a", vectors[7], 1, ANY)
        assert raised.value.reason == "INDEX_LOADING"
        deadline = time.monotonic() + 30
        while not index.is_kept("a"):
            assert time.monotonic() < deadline, "the loading thread never loaded it"
            time.sleep(0.02)
    assert index.vector_search("a", vectors[7], 1, ANY)[0].id == "m7"
    assert [r.threadName for r in caplog.records if "loaded: 50 rows" in r.getMessage()] == ["index-loader"]
    assert index.residency().loads == 1
    index.close()


def test_a_tenant_searched_before_it_had_a_table_is_found_after_its_drop(tmp_path: Path) -> None:
    """A table found absent is remembered (a failed open costs ~0.6 ms, under the index's
    lock), and forgotten once written: dropped and opened again, it is found."""
    index = _bounded(tmp_path)
    vectors = _units(5, 3)
    assert index.vector_search("a", vectors[0], 1, ANY) == []
    assert index.text_search("a", "w0", 1, ANY) == []
    index.upsert("a", [_row(i, v) for i, v in enumerate(vectors)])
    assert index._drop("t_a") and not index.is_kept("a")
    assert index.vector_search("a", vectors[2], 1, ANY)[0].id == "m2"
    index.close()


def test_a_trim_logs_one_line_naming_only_the_tenants_whose_indices_were_loaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A start-up that opened 2,000 tables to check them logged a line for each it closed."""
    writer = _bounded(tmp_path)
    for seed, t in enumerate(("a", "b", "c", "d")):
        writer.upsert(t, [_row(i, v) for i, v in enumerate(_units(seed, 5))])
    writer.close()
    index = _bounded(tmp_path, max_resident_tenants=1)
    for t in ("a", "b"):
        index.vector_search(t, _units(9, 1)[0], 1, ANY)  # loaded
    assert index.count("c") == 5 and index.count("d") == 5  # opened, not loaded
    assert not index.is_kept("c")
    with caplog.at_level(logging.DEBUG, logger="mnemo_server.index.lance_index"):
        assert sorted(index.trim()) == ["a", "c", "d"]
    lines = [r.getMessage() for r in caplog.records if "dropped from memory" in r.getMessage()]
    assert lines == ["indices of 1 tenant(s) dropped from memory (index.max_resident_*): a"]
    index.close()
