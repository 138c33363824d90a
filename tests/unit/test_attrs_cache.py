"""The index's attribute cache keeps its entries out of the garbage collector's walks."""

from __future__ import annotations

import gc

from mnemo_server.index.attrs import Attrs, AttrsCache


def _attrs(text: str) -> Attrs:
    return Attrs(text, "project:p", "s1", 5, 0.5, 7, "semantic", "cat", False, 9)


def test_cached_attrs_are_plain_tuples_the_collector_stops_tracking() -> None:
    """One object per indexed row that the collector tracks made every full collection
    of a server that had indexed 100k rows since start-up walk 100k more objects."""
    cache = AttrsCache(max_rows=3)
    a, b = _attrs("first"), _attrs("second")
    cache.remember([("m1", a), ("m2", b)], overwrite=False)
    gc.collect()
    assert not any(gc.is_tracked(entry) for entry in cache._by_id.values())
    found, missing = cache.lookup(["m1", "m2", "m3"])
    assert found == {"m1": a, "m2": b} and missing == ["m3"]
    assert isinstance(found["m1"], Attrs) and found["m1"].text == "first" and found["m2"].seq == 7
    # Reads only fill gaps; writes overwrite; past the cap only known ids change.
    cache.remember([("m1", _attrs("stale"))], overwrite=False)
    cache.remember([("m2", _attrs("new")), ("m3", _attrs("third")), ("m4", _attrs("over"))], overwrite=True)
    found, missing = cache.lookup(["m1", "m2", "m3", "m4"])
    assert [x.text for x in found.values()] == ["first", "new", "third"] and missing == ["m4"]
