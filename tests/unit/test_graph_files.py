"""Saved vector graphs: read back as they were, put right against the table's rows, and never
trusted when they cannot be read or were made otherwise (the table is the truth)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from mnemo_server.index import graph_files
from mnemo_server.index.scope_vectors import quantize
from mnemo_server.index.vector_graph import GraphParams, HnswGraph, VectorGraph

DIM = 24
PARAMS = GraphParams(dtype="i8")


def _codes(n: int, seed: int) -> npt.NDArray[np.int8]:
    v = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return quantize(v / np.linalg.norm(v, axis=1, keepdims=True))[0]


def _graph(n: int) -> tuple[VectorGraph, list[str], npt.NDArray[np.int8]]:
    graph = VectorGraph(DIM, PARAMS)
    ids = [f"m{i}" for i in range(n)]
    codes = _codes(n, 0)
    assert graph.build([(ids, codes)])
    return graph, ids, codes


def _saved(tmp_path: Path, graph: VectorGraph) -> Path:
    current = graph.current()
    assert current is not None
    manifest = graph_files.save(tmp_path, "t_a", current, DIM, PARAMS)
    assert manifest is not None
    return manifest


def _top(graph: VectorGraph, query: npt.NDArray[np.int8], k: int = 10) -> list[str]:
    found = graph.search(query.astype(np.float32), k)
    assert found is not None
    return [i for i, _ in found]


def test_a_saved_graph_is_read_back_and_answers_as_before(tmp_path: Path) -> None:
    graph, _, _ = _graph(300)
    _saved(tmp_path, graph)
    loaded = graph_files.load(tmp_path, "t_a", DIM, PARAMS)
    assert loaded is not None
    assert loaded.key_of == graph.current().key_of  # type: ignore[union-attr]
    again = VectorGraph(DIM, PARAMS)
    assert again.fill(again.begin_build(loaded), [])
    for q in _codes(10, 1):
        assert _top(again, q) == _top(graph, q)
    # Keys handed out after the load do not reuse a saved one.
    again.put([("new", np.ones(DIM, dtype=np.float32))])
    assert again.apply_queued() == 1
    assert len(set(loaded.key_of.values())) == 301


def test_differences_name_the_rows_gone_changed_and_new(tmp_path: Path) -> None:
    graph, ids, codes = _graph(200)
    _saved(tmp_path, graph)
    loaded = graph_files.load(tmp_path, "t_a", DIM, PARAMS)
    assert loaded is not None
    # The table since: m3 deleted, m7 written with another vector, n1 new.
    changed = codes.copy()
    changed[7] = _codes(1, 9)[0]
    keep = [i for i in range(200) if i != 3]
    snapshot = [
        ([ids[i] for i in keep[:100]], changed[keep[:100]]),
        ([ids[i] for i in keep[100:]], changed[keep[100:]]),
    ]
    snapshot.append((["n1"], _codes(1, 10)))
    stale, adds = loaded.differences(snapshot)
    assert sorted(stale) == ["m3", "m7"]
    assert sorted(i for chunk, _ in adds for i in chunk) == ["m7", "n1"]
    added = {i: c for chunk, codes_ in adds for i, c in zip(chunk, codes_, strict=True)}
    assert np.array_equal(added["m7"], changed[7])
    # Put right, it answers as a graph built from the table would.
    loaded.remove(stale)
    repaired = VectorGraph(DIM, PARAMS)
    assert repaired.fill(repaired.begin_build(loaded), adds)
    assert repaired.search(changed[7].astype(np.float32), 1)[0][0] == "m7"  # type: ignore[index]
    assert "m3" not in _top(repaired, codes[3], 50)
    assert loaded.differences(snapshot) == ([], [])


def test_a_second_save_replaces_the_first_and_leaves_one_generation(tmp_path: Path) -> None:
    graph, _, _ = _graph(50)
    _saved(tmp_path, graph)
    graph.remove(["m1"])
    assert graph.apply_queued() == 1
    _saved(tmp_path, graph)
    assert sorted(p.suffix for p in (tmp_path / "t_a").iterdir()) == [".json", ".npz", ".usearch"]
    loaded = graph_files.load(tmp_path, "t_a", DIM, PARAMS)
    assert loaded is not None and "m1" not in loaded.key_of and len(loaded.key_of) == 49


def test_a_save_cut_short_leaves_the_previous_generation_in_force(tmp_path: Path) -> None:
    graph, _, _ = _graph(50)
    _saved(tmp_path, graph)
    folder = tmp_path / "t_a"
    # A crash after the new files and the staged manifest were written, before the rename.
    (folder / "99.usearch").write_bytes(b"partial")
    (folder / "graph.json.tmp").write_text('{"format": 1, "index_file": "99.usearch"')
    loaded = graph_files.load(tmp_path, "t_a", DIM, PARAMS)
    assert loaded is not None and len(loaded.key_of) == 50


@pytest.mark.parametrize("damage", ["truncated index", "keys missing", "manifest garbled", "rows disagree"])
def test_a_damaged_save_is_not_used(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    graph, _, _ = _graph(120)
    manifest_path = _saved(tmp_path, graph)
    manifest = json.loads(manifest_path.read_text())
    folder = tmp_path / "t_a"
    if damage == "truncated index":
        index_file = folder / manifest["index_file"]
        index_file.write_bytes(index_file.read_bytes()[:2000])
    elif damage == "keys missing":
        (folder / manifest["keys_file"]).unlink()
    elif damage == "manifest garbled":
        manifest_path.write_text("{not json")
    else:
        manifest["rows"] = 7
        manifest_path.write_text(json.dumps(manifest))
    with caplog.at_level(logging.INFO, logger="mnemo_server.index.graph_files"):
        assert graph_files.load(tmp_path, "t_a", DIM, PARAMS) is None
    assert "built afresh" in caplog.text


@pytest.mark.parametrize(
    ("dimension", "params"),
    [(DIM + 8, PARAMS), (DIM, GraphParams(dtype="i8", connectivity=8)), (DIM, GraphParams(dtype="f32"))],
)
def test_a_graph_made_with_other_parameters_is_not_used(
    tmp_path: Path, dimension: int, params: GraphParams
) -> None:
    graph, _, _ = _graph(40)
    _saved(tmp_path, graph)
    assert graph_files.load(tmp_path, "t_a", dimension, params) is None


def test_only_int8_graphs_are_saved(tmp_path: Path) -> None:
    graph = VectorGraph(DIM, GraphParams(dtype="f32"))
    assert graph.build([(["a"], _codes(1, 0))])
    current = graph.current()
    assert current is not None
    assert graph_files.save(tmp_path, "t_a", current, DIM, GraphParams(dtype="f32")) is None
    assert not (tmp_path / "t_a").exists()


def test_ghosts_are_saved_and_a_graph_with_many_is_built_afresh(tmp_path: Path) -> None:
    graph, ids, codes = _graph(100)
    graph.remove(ids[:10])  # kept in usearch as ghosts
    graph.drain()
    _saved(tmp_path, graph)
    loaded = graph_files.load(tmp_path, "t_a", DIM, PARAMS)
    assert loaded is not None and loaded.ghosts == 10 and len(loaded.key_of) == 90
    assert loaded.nearest(codes[0], 5, ()).keys().isdisjoint(ids[:10])
    graph.remove(ids[10:30])
    graph.drain()
    _saved(tmp_path, graph)
    assert graph_files.load(tmp_path, "t_a", DIM, PARAMS) is None  # 30 of 100 nodes


def test_a_graph_saved_in_the_old_format_is_built_afresh(tmp_path: Path) -> None:
    """Format 1 used usearch's removals, whose reused slots could leave rows unreachable."""
    graph, _, _ = _graph(20)
    manifest = _saved(tmp_path, graph)
    described = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**described, "format": 1}))
    assert graph_files.load(tmp_path, "t_a", DIM, PARAMS) is None


def test_discard_forgets_one_table_or_all(tmp_path: Path) -> None:
    graph, _, _ = _graph(10)
    current = graph.current()
    assert isinstance(current, HnswGraph)
    for name in ("t_a", "t_b"):
        graph_files.save(tmp_path, name, current, DIM, PARAMS)
    graph_files.discard(tmp_path, "t_a")
    assert graph_files.load(tmp_path, "t_a", DIM, PARAMS) is None
    assert graph_files.load(tmp_path, "t_b", DIM, PARAMS) is not None
    graph_files.discard(tmp_path)
    assert not tmp_path.exists()
