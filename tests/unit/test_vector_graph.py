"""The in-process vector graph: exact enough against a brute-force search, and every write
visible to searches from the moment it is queued, before and after the feeder moves it."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from mnemo_server.config import EmbeddingConfig
from mnemo_server.embed.factory import build_embedder
from mnemo_server.index.scope_vectors import quantize
from mnemo_server.index.vector_graph import GraphFeeder, GraphParams, VectorGraph

DIM = 24  # int8 codes keep cosines within ~0.01 at this width (0.0025 at 384)


def _vectors(n: int, seed: int = 0) -> npt.NDArray[np.float32]:
    v = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _exact(
    matrix: npt.NDArray[np.float32], ids: list[str], query: npt.NDArray[np.float32], k: int
) -> list[str]:
    cos = matrix @ (query / np.linalg.norm(query))
    return [ids[i] for i in np.argsort(-cos)[:k]]


def _built(n: int, dtype: str = "f32", **kw: int) -> tuple[VectorGraph, list[str], npt.NDArray[np.float32]]:
    graph = VectorGraph(DIM, GraphParams(dtype=dtype, **kw))
    ids = [f"m{i}" for i in range(n)]
    matrix = _vectors(n)
    codes = quantize(matrix)[0]
    graph.build([(ids[: n // 2], codes[: n // 2]), (ids[n // 2 :], codes[n // 2 :])])
    return graph, ids, matrix


def test_search_finds_what_an_exact_search_finds() -> None:
    """Rows go in as int8 codes with a scale per row (cosine within ~0.0025 of the vectors'):
    a float graph over them finds an exact search's top ten, near-ties aside."""
    graph, ids, matrix = _built(400)
    overlap = []
    for q in _vectors(20, seed=1):
        found = graph.search(q, 10)
        assert found is not None and len(found) == 10
        overlap.append(len({i for i, _ in found} & set(_exact(matrix, ids, q, 10))) / 10)
        cos = matrix[[ids.index(i) for i, _ in found]] @ q
        assert np.allclose([s for _, s in found], cos, atol=0.01)
    assert np.mean(overlap) >= 0.97


def test_int8_graph_keeps_the_exact_top_ten() -> None:
    graph, ids, matrix = _built(2_000, dtype="i8")
    overlap = []
    for q in _vectors(30, seed=2):
        found = graph.search(q, 10)
        assert found is not None
        overlap.append(len({i for i, _ in found} & set(_exact(matrix, ids, q, 10))) / 10)
    assert np.mean(overlap) >= 0.97


def test_a_queued_write_is_searched_before_and_after_the_feeder_moves_it() -> None:
    graph, _, _ = _built(100)
    target = _vectors(1, seed=3)[0]
    graph.put([("new", target)])
    assert graph.queued() == 1
    before = graph.search(target, 3)
    assert before is not None and before[0][0] == "new" and before[0][1] == pytest.approx(1.0, abs=0.01)
    assert graph.apply_queued() == 1
    assert graph.queued() == 0 and graph.rows() == 101
    after = graph.search(target, 3)
    assert after is not None and after[0][0] == "new"


def test_a_row_written_again_is_found_once_with_its_new_vector() -> None:
    graph, ids, matrix = _built(100)
    moved = _vectors(1, seed=4)[0]
    graph.put([(ids[7], moved)])
    for step in ("queued", "applied"):
        found = graph.search(moved, 100)
        assert found is not None, step
        assert [i for i, _ in found].count(ids[7]) == 1, step
        assert found[0] == (ids[7], pytest.approx(1.0, abs=0.01)), step
        old = graph.search(matrix[7], 100)
        assert old is not None and dict(old)[ids[7]] < 0.99, step
        graph.apply_queued()
    assert graph.rows() == 100


def test_a_removed_row_is_gone_at_once() -> None:
    graph, ids, matrix = _built(100)
    graph.remove([ids[3]])
    for step in ("queued", "applied"):
        found = graph.search(matrix[3], 100)
        assert found is not None and ids[3] not in dict(found), step
        graph.apply_queued()
    assert graph.rows() == 99


def test_write_then_removal_in_one_slice_leaves_nothing() -> None:
    graph, _, _ = _built(50)
    v = _vectors(1, seed=5)[0]
    graph.put([("x", v)])
    graph.remove(["x"])
    graph.put([("y", v)])
    assert graph.apply_queued() == 3
    found = graph.search(v, 5)
    assert found is not None and "x" not in dict(found) and found[0][0] == "y"
    assert graph.rows() == 51


def test_an_unbuilt_graph_declines_and_ignores_writes() -> None:
    graph = VectorGraph(DIM, GraphParams())
    graph.put([("a", _vectors(1)[0])])
    assert graph.search(_vectors(1)[0], 5) is None
    assert graph.queued() == 0


def test_writes_queued_during_a_build_are_applied_over_its_snapshot() -> None:
    graph = VectorGraph(DIM, GraphParams(dtype="f32"))
    ids = [f"m{i}" for i in range(50)]
    matrix = _vectors(50)
    started = graph.begin_build()  # the snapshot: the 50 rows as they were
    moved = _vectors(1, seed=10)[0]
    graph.put([("m1", moved)])
    graph.remove(["m2"])
    assert graph.search(moved, 1) is None  # not built yet
    assert graph.fill(started, [(ids, quantize(matrix)[0])])
    for step in ("queued", "applied"):
        found = graph.search(moved, 50)
        assert found is not None, step
        assert found[0][0] == "m1" and "m2" not in dict(found) and len(found) == 49, step
        graph.apply_queued()
    assert graph.rows() == 49


def test_too_many_queued_writes_drop_the_graph_until_the_feeder_rebuilds_it() -> None:
    graph, ids, matrix = _built(20, max_queued=4)
    fresh = _vectors(5, seed=6)
    graph.put([(f"q{i}", v) for i, v in enumerate(fresh)])
    assert graph.search(fresh[0], 5) is None
    assert graph.needs_build and graph.rows() == 0 and graph.queued() == 0
    graph.put([("later", fresh[1])])  # nothing kept while dropped
    assert graph.queued() == 0

    table = {**dict(zip(ids, matrix, strict=True)), **{f"q{i}": v for i, v in enumerate(fresh)}}
    feeder = GraphFeeder(quiet_s=0.05)
    rebuilt = threading.Event()

    def rebuild() -> None:
        graph.build([(list(table), quantize(np.stack(list(table.values())))[0])])
        rebuilt.set()

    try:
        feeder.watch(graph, rebuild)
        assert rebuilt.wait(10)
    finally:
        feeder.stop()
    assert not graph.needs_build and graph.rows() == 25
    found = graph.search(fresh[3], 1)
    assert found is not None and found[0][0] == "q3"


def test_a_fill_stops_when_the_graph_is_dropped_meanwhile() -> None:
    graph = VectorGraph(DIM, GraphParams(max_queued=1))
    started = graph.begin_build()
    graph.put([(f"w{i}", v) for i, v in enumerate(_vectors(2))])  # over max_queued: dropped
    assert not graph.fill(started, [(["a"], quantize(_vectors(1))[0])])
    assert not graph.built and graph.search(_vectors(1)[0], 1) is None


def test_the_feeder_drains_every_watched_graph() -> None:
    feeder = GraphFeeder()
    graphs = [_built(30)[0] for _ in range(2)]
    try:
        for g in graphs:
            feeder.watch(g, lambda: None)
            g.put([(f"n{i}", v) for i, v in enumerate(_vectors(300, seed=7))])
        feeder.poke()
        deadline = time.monotonic() + 30
        while any(g.queued() for g in graphs) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [g.queued() for g in graphs] == [0, 0]
        assert [g.rows() for g in graphs] == [330, 330]
    finally:
        feeder.stop()


def test_searches_beside_the_feeder_see_every_row_once() -> None:
    graph, ids, _ = _built(200, max_queued=10_000)
    fresh = _vectors(3_000, seed=8)  # the index grows its capacity several times
    feeder = GraphFeeder()
    feeder.watch(graph, lambda: None)
    failures: list[str] = []

    def search_while_fed() -> None:
        for q in _vectors(300, seed=9):
            found = graph.search(q, 20)
            if found is None or len(found) != 20 or len({i for i, _ in found}) != 20:
                failures.append(repr(found))
            # What GetStatus reads, beside adds that grow the index (a server crashed on it).
            if not 150 <= graph.rows() <= 3_200 or graph.nbytes() <= 0:
                failures.append(f"rows {graph.rows()}")

    searchers = [threading.Thread(target=search_while_fed) for _ in range(2)]
    try:
        for t in searchers:
            t.start()
        graph.put([(f"f{i}", v) for i, v in enumerate(fresh)])
        graph.remove(ids[:50])
        feeder.poke()
        for t in searchers:
            t.join(timeout=60)
        deadline = time.monotonic() + 30
        while graph.queued() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        feeder.stop()
    assert failures == []
    assert graph.queued() == 0 and graph.rows() == 3_150
    found = graph.search(fresh[5], 1)
    assert found is not None and found[0][0] == "f5"


def test_status_reads_beside_adds_that_grow_the_index() -> None:
    """GetStatus reads a graph's size while the feeder adds: usearch crashed the process when
    a size read met an add that grew the index, so those reads take the graph lock too."""
    graph = VectorGraph(384, GraphParams(max_queued=50_000))
    graph.build([])
    rows = np.random.default_rng(11).normal(size=(12_000, 384)).astype(np.float32)
    graph.put([(f"r{i}", v) for i, v in enumerate(rows)])
    done = threading.Event()
    seen: list[int] = []

    def read_status() -> None:
        while not done.is_set():
            seen.append(graph.rows() + graph.nbytes())
            time.sleep(0.0002)

    reader = threading.Thread(target=read_status)
    reader.start()
    try:
        while graph.apply_queued(most=512):
            pass
    finally:
        done.set()
        reader.join(timeout=30)
    assert graph.rows() == 12_000 and len(seen) > 10


def test_the_feeder_saves_a_graph_once_enough_writes_reached_it_and_writes_paused() -> None:
    graph, _, _ = _built(50)
    graph.unsaved = 0  # as if just saved
    saves: list[int] = []

    def save() -> None:
        saves.append(graph.unsaved)
        graph.unsaved = 0  # what LanceIndex's save does, whatever its outcome

    feeder = GraphFeeder(quiet_s=60, save_quiet_s=0.05, save_changes=5)
    feeder.watch(graph, lambda: None, save)
    try:
        graph.put([(f"n{i}", v) for i, v in enumerate(_vectors(4, seed=3))])
        time.sleep(0.6)
        assert graph.queued() == 0 and graph.unsaved == 4 and saves == []  # fewer than 5 writes
        graph.remove(["m0"])
        deadline = time.monotonic() + 10
        while not saves and time.monotonic() < deadline:
            time.sleep(0.02)
        assert saves == [5]
        time.sleep(0.3)
        assert saves == [5]  # nothing new since: not saved again
    finally:
        feeder.stop()


def test_the_feeder_waits_for_writes_to_pause_before_saving() -> None:
    graph, ids, matrix = _built(40)
    saves: list[int] = []
    feeder = GraphFeeder(quiet_s=60, save_quiet_s=30, save_changes=1)
    feeder.watch(graph, lambda: None, lambda: saves.append(graph.unsaved))
    try:
        graph.put([(ids[0], matrix[1])])
        deadline = time.monotonic() + 10
        while graph.queued() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.6)
        assert graph.queued() == 0 and graph.unsaved == 41 and saves == []  # built (40) + 1 write
    finally:
        feeder.stop()


def test_the_feeder_saves_under_writes_that_never_pause_once_the_last_save_is_old_enough() -> None:
    graph, _, _ = _built(40)
    saves: list[int] = []

    def save() -> None:
        saves.append(graph.unsaved)
        graph.mark_saved()

    feeder = GraphFeeder(quiet_s=60, save_quiet_s=30, save_changes=5, save_max_wait_s=0.5)
    feeder.watch(graph, lambda: None, save)
    try:
        began = time.monotonic()
        for n, v in enumerate(_vectors(60, seed=5)):  # a write every 20 ms: never quiet for 30 s
            graph.put([(f"w{n}", v)])
            time.sleep(0.02)
        assert saves, "no save while writes kept coming"
        assert saves[0] >= 40  # the first waited for the build's rows plus the writes since
        assert time.monotonic() - began < 30  # long before writes paused for save_quiet_s
        assert len(saves) <= 4  # at most one per save_max_wait_s
    finally:
        feeder.stop()


def test_searches_pass_over_ghosts_and_still_return_k_rows() -> None:
    """Rows written again leave ghosts around the query; the search asks usearch for more
    until it has k live rows, and they are the exact search's."""
    graph, ids, matrix = _built(200)
    query = matrix[0]
    near = _exact(matrix, ids, query, 60)
    for _ in range(3):  # each round leaves another ghost of each near row, at the same place
        graph.put([(mid, matrix[ids.index(mid)]) for mid in near])
        graph.drain()
    current = graph.current()
    assert current is not None and current.ghosts == 180 and graph.rows() == 200
    found = graph.search(query, 10)
    assert found is not None and len({i for i, _ in found}) == 10
    tenth = float(matrix[ids.index(_exact(matrix, ids, query, 10)[-1])] @ query)
    assert all(score >= tenth - 0.02 for _, score in found)  # the exact top ten, near-ties aside


def test_past_the_ghost_share_a_fresh_graph_is_built_while_the_old_one_answers() -> None:
    graph, ids, matrix = _built(100, dtype="i8")
    graph.remove(ids[:15])
    graph.drain()
    assert not graph.wants_fresh()  # 15 of 100 nodes
    graph.remove(ids[15:25])
    graph.drain()
    assert graph.wants_fresh()  # 25 of 100
    live = ids[25:]
    old = graph.current()
    started = graph.begin_build()  # the feeder's rebuild: a snapshot of the live rows
    graph.put([("late", matrix[0])])  # written while the new graph fills
    found = graph.search(matrix[30], 5)
    assert found is not None and found[0][0] == ids[30]  # the old graph answers meanwhile
    early = graph.search(matrix[0], 3)
    assert early is not None and early[0][0] == "late" and ids[0] not in dict(early)
    assert graph.current() is None and old is not None and old.ghosts == 25
    assert graph.fill(started, [(live, quantize(matrix[25:])[0])])
    graph.drain()
    fresh = graph.current()
    assert fresh is started and fresh.ghosts == 0 and graph.rows() == 76 and not graph.wants_fresh()


def test_the_feeder_builds_afresh_a_graph_with_too_many_ghosts() -> None:
    graph, ids, matrix = _built(100, dtype="i8")
    rebuilt = threading.Event()

    def rebuild() -> None:
        started = graph.begin_build()
        graph.fill(started, [(ids[30:], quantize(matrix[30:])[0])])
        rebuilt.set()

    feeder = GraphFeeder(quiet_s=3600)  # no quiet needed: the old graph answers meanwhile
    feeder.watch(graph, rebuild)
    try:
        graph.remove(ids[:30])
        assert rebuilt.wait(10)
    finally:
        feeder.stop()
    current = graph.current()
    assert current is not None and current.ghosts == 0 and graph.rows() == 70


def test_a_fresh_build_that_cannot_start_is_not_retried_at_once() -> None:
    """A rebuild that leaves the ghosts in place (the scope vectors not loaded) waits its
    turn: the feeder does not spin on it."""
    graph, ids, _ = _built(100, dtype="i8")
    calls: list[float] = []
    feeder = GraphFeeder(quiet_s=3600)
    feeder.watch(graph, lambda: calls.append(time.monotonic()))
    try:
        graph.remove(ids[:30])
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
    finally:
        feeder.stop()
    assert len(calls) == 1 and graph.wants_fresh()


def test_rows_written_again_leave_untouched_rows_reachable(model_cache: Path) -> None:
    """The regression the ghosts fix, with the bundled model's vectors: usearch's removal
    freed slots that the next adds reused under links leading to the old vectors, and after
    600 content updates among 348 rows 24 of 48 untouched notes were missing from their
    own vector's top ten (found by probing the server's unfiltered Recall)."""
    embedder = build_embedder(EmbeddingConfig(), model_cache, threads=1, concurrent_runs=1)
    rng = random.Random(7)
    words = [
        "apple",
        "river",
        "quantum",
        "violet",
        "engine",
        "harbor",
        "lantern",
        "meadow",
        "copper",
        "falcon",
        "glacier",
        "orchard",
        "pepper",
        "saddle",
        "thunder",
        "velvet",
        "walnut",
        "zephyr",
        "basil",
        "canyon",
        "dolphin",
        "ember",
        "fjord",
        "gravel",
        "hazel",
        "iris",
        "jasmine",
        "kettle",
        "lemon",
        "maple",
    ]

    def sentences(n: int) -> list[str]:
        return [" ".join(rng.sample(words, 6)) + f" {rng.randrange(10**6)}" for _ in range(n)]

    try:
        notes = embedder.embed(
            [f"Note about widget zq{i}x and the gadget calibration step {i}" for i in range(48)]
        )
        graph = VectorGraph(embedder.dimension, GraphParams())
        assert graph.build([])
        graph.put([(f"n{i}", v) for i, v in enumerate(notes)])
        graph.put([(f"o{i}", v) for i, v in enumerate(embedder.embed(sentences(300)))])
        graph.drain()
        for _ in range(2):
            for i, v in enumerate(embedder.embed(sentences(300))):
                graph.remove([f"o{i}"])
                graph.put([(f"o{i}", v)])
                if i % 4 == 0:
                    graph.drain()
            graph.drain()
            missing = []
            for i, v in enumerate(notes):
                found = graph.search(v, 10)
                assert found is not None
                if f"n{i}" not in dict(found):
                    missing.append(i)
            assert missing == []
    finally:
        embedder.close()
