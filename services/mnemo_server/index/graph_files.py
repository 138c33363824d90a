"""Vector graphs saved at an orderly shutdown and loaded at start-up, so a restart skips the build.

Building a tenant's graph takes ~40 s per 100k rows (on one thread: HnswGraph.add), all of it
before its first search is answered; reading the one saved at the last shutdown takes well
under a second. A saved graph is a cache, never the truth: at load every row of the table is
compared with what the graph holds (its int8 codes, exactly), rows written after the save (a
kill -9 since) are put right, and a graph that cannot be read, was made with other parameters,
or would take removals and additions of more than a quarter of the table's rows to put right is
built afresh instead. Only int8 graphs are kept: the comparison needs the graph to hold the
codes exactly as given.

Per tenant table a folder `<name>/` holds `graph.json` (the manifest, replaced atomically and
written last) naming one generation's `<g>.usearch` (usearch's own format) and `<g>.keys.npz`
(each key's memory id, UTF-8). A crash while saving leaves the previous generation in force.
Saved at close and, while serving, by the graph feeder once writes pause (vector_graph.py).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from mnemo_server.index.vector_graph import MAX_GHOST_SHARE, GraphParams, HnswGraph
from mnemo_server.store.durable import fsync_path, write_text_durably

log = logging.getLogger(__name__)

# 2: ghosts (vector_graph.HnswGraph.remove) instead of usearch's removals, whose reused
# slots could leave rows unreachable: a graph saved in format 1 may be so, and is built afresh.
_FORMAT = 2
_MANIFEST = "graph.json"
# A loaded graph that would take more removals and additions than this share of the table's
# rows to put right (a changed row is one of each) is built afresh: the repair would cost
# about as much. So is one whose ghosts are past vector_graph.MAX_GHOST_SHARE.
MAX_STALE_SHARE = 0.25


def _describe(dimension: int, params: GraphParams) -> dict[str, Any]:
    import usearch

    return {
        "format": _FORMAT,
        "usearch": usearch.__version__,
        "dimension": dimension,
        "dtype": params.dtype,
        "connectivity": params.connectivity,
        "expansion_add": params.expansion_add,
    }


def save(directory: Path, name: str, graph: HnswGraph, dimension: int, params: GraphParams) -> Path | None:
    """Write the graph as `name`'s newest generation; returns its manifest (None: not kept,
    e.g. not int8). No write may reach the graph meanwhile (its feeder stopped)."""
    if params.dtype != "i8":
        return None
    folder = directory / name
    folder.mkdir(parents=True, exist_ok=True)
    generation = str(time.time_ns())
    index_file, keys_file = folder / f"{generation}.usearch", folder / f"{generation}.keys.npz"
    with graph.lock:
        graph.index.save(str(index_file))
        keys = np.fromiter(graph.id_of.keys(), dtype=np.uint64, count=len(graph.id_of))
        ids = np.array([mid.encode() for mid in graph.id_of.values()], dtype=np.bytes_)
        nodes, next_key = len(graph.index), graph.next_key
    with keys_file.open("wb") as out:
        np.savez(out, keys=keys, ids=ids)
    for written in (index_file, keys_file):
        fsync_path(written)
    manifest = {
        **_describe(dimension, params),
        "index_file": index_file.name,
        "keys_file": keys_file.name,
        "rows": len(keys),
        "ghosts": nodes - len(keys),
        "next_key": next_key,
    }
    write_text_durably(folder / _MANIFEST, json.dumps(manifest))
    for old in folder.iterdir():
        if old.name not in (_MANIFEST, index_file.name, keys_file.name):
            old.unlink(missing_ok=True)
    return folder / _MANIFEST


def load(directory: Path, name: str, dimension: int, params: GraphParams) -> HnswGraph | None:
    """The graph saved for `name` if there is a usable one (None: build afresh; why is logged)."""
    folder = directory / name
    if not (folder / _MANIFEST).exists():
        return None
    try:
        return _read(folder, dimension, params)
    except Exception:  # a cache: whatever is wrong with it, the table is the truth
        log.warning("saved vector graph %s not readable; built afresh", folder, exc_info=True)
        return None


def _read(folder: Path, dimension: int, params: GraphParams) -> HnswGraph | None:
    from usearch.index import Index

    manifest = json.loads((folder / _MANIFEST).read_text())
    wanted = _describe(dimension, params)
    if any(manifest.get(k) != v for k, v in wanted.items()):  # (only int8 graphs are saved)
        log.info("saved vector graph %s made with other parameters; built afresh", folder)
        return None
    index_file, keys_file = folder / manifest["index_file"], folder / manifest["keys_file"]
    meta = Index.metadata(str(index_file))
    rows, ghosts = int(manifest["rows"]), int(manifest["ghosts"])
    if meta is None or meta["dimensions"] != dimension or meta["count_present"] != rows + ghosts:
        log.warning("saved vector graph %s does not match its manifest; built afresh", folder)
        return None
    if ghosts > MAX_GHOST_SHARE * max(1, rows + ghosts):  # the feeder would build it afresh anyway
        log.info("saved vector graph %s holds %d ghosts; built afresh", folder, ghosts)
        return None
    graph = HnswGraph(dimension, params)
    graph.index.load(str(index_file))  # the expansions stay as HnswGraph set them
    with np.load(keys_file, allow_pickle=False) as stored:
        keys, ids = stored["keys"].tolist(), [mid.decode() for mid in stored["ids"].tolist()]
    if len(keys) != len(ids) or len(keys) != rows or len(graph.index) != rows + ghosts:
        log.warning("saved vector graph %s: keys and index disagree; built afresh", folder)
        return None
    graph.id_of = dict(zip(keys, ids, strict=True))
    graph.ghosts = ghosts
    graph.key_of = {mid: key for key, mid in graph.id_of.items()}
    graph.next_key = max(int(manifest["next_key"]), max(keys, default=-1) + 1)
    return graph


def discard(directory: Path, name: str | None = None) -> None:
    """Forget `name`'s saved graph (every tenant's with no name): its table is gone."""
    shutil.rmtree(directory / name if name is not None else directory, ignore_errors=True)
