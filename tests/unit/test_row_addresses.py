"""Ids by Lance row address must name the row at that address in the snapshot searched,
through deletes, updates and compactions. Real Lance datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lance
import pyarrow as pa

from mnemo_server.index.row_addresses import IdsByAddress


def _append(uri: str, ids: list[str], mode: str = "append") -> Any:
    return lance.write_dataset(pa.table({"id": ids, "n": list(range(len(ids)))}), uri, mode=mode)


def _addressed(ds: Any) -> tuple[list[int], list[str]]:
    t = ds.to_table(columns=["id"], with_row_address=True)
    return t.column("_rowaddr").to_pylist(), t.column("id").to_pylist()


def test_every_live_row_is_named_through_deletes_and_compaction(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    _append(uri, [f"a{i}" for i in range(50)], mode="create")
    _append(uri, [f"b{i}" for i in range(30)])
    ds = _append(uri, [f"c{i}" for i in range(20)])
    ids = IdsByAddress()
    addresses, expected = _addressed(ds)
    assert len({a >> 32 for a in addresses}) == 3
    assert ids.ids_at(ds, addresses) == expected

    # Rows deleted before a fragment is first read sit at their own offsets, not shifted.
    ds.delete("id IN ('b3', 'b4', 'c0')")
    fresh = IdsByAddress()
    addresses, expected = _addressed(ds)
    assert "b3" not in expected and len(expected) == 97
    assert fresh.ids_at(ds, addresses) == expected
    # An update is a delete and an append: the new copy has a new address.
    ds.merge_insert("id").when_matched_update_all().execute(pa.table({"id": ["a7"], "n": [999]}))
    ds = lance.dataset(uri)
    addresses, expected = _addressed(ds)
    assert fresh.ids_at(ds, addresses) == expected

    before = ids.nbytes()
    ds.optimize.compact_files(target_rows_per_fragment=1000)
    ds = lance.dataset(uri)
    addresses, expected = _addressed(ds)
    assert len({a >> 32 for a in addresses}) == 1
    assert ids.ids_at(ds, addresses) == expected
    # The fragments the compaction replaced are forgotten once the new one is read.
    assert 0 < ids.nbytes() < before


def test_an_older_snapshot_does_not_drop_a_newer_ones_fragments(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    old = _append(uri, [f"a{i}" for i in range(10)], mode="create")
    new = _append(uri, [f"b{i}" for i in range(10)])
    ids = IdsByAddress()
    new_addresses, new_expected = _addressed(new)
    b_only = [a for a, i in zip(new_addresses, new_expected, strict=True) if i.startswith("b")]
    assert ids.ids_at(new, b_only) == [f"b{i}" for i in range(10)]
    held = ids.nbytes()
    old_addresses, old_expected = _addressed(old)
    assert ids.ids_at(old, old_addresses) == old_expected
    assert ids.nbytes() > held  # both fragments kept
