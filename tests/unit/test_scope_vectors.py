"""Scoped vectors kept in memory (index/scope_vectors.py): a search must rank as an exact
float32 search of the same rows would (int8 only perturbs near-ties), and writes must move,
replace and remove rows without leaving a copy behind, across chunk boundaries."""

from __future__ import annotations

import numpy as np

from mnemo_server.index.scope_vectors import CHUNK, ScopeVectors, quantize

DIM = 48


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    m = rng.standard_normal((n, DIM)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def _exact(vectors: dict[str, np.ndarray], ids: list[str], q: np.ndarray, k: int) -> list[str]:
    cos = {i: float(vectors[i] @ q) for i in ids}
    return sorted(cos, key=lambda i: -cos[i])[:k]


def test_search_ranks_like_an_exact_search_within_the_scopes_asked() -> None:
    rng = np.random.default_rng(11)
    n = 2 * CHUNK + 300  # scope "a" spans three chunks
    m = _unit(rng, n)
    ids = [f"m{i}" for i in range(n)]
    scopes = ["a" if i % 3 else ("b" if i % 2 else "c") for i in range(n)]
    vectors = dict(zip(ids, m, strict=True))
    sv = ScopeVectors(DIM)
    sv.load([(ids[:1000], scopes[:1000], m[:1000]), (ids[1000:], scopes[1000:], m[1000:])])
    assert sv.loaded and sv.rows() == n
    assert sv.rows_in(["a"]) == sum(s == "a" for s in scopes)
    assert sv.rows_in(["b", "c", "b", "nope"]) == sum(s != "a" for s in scopes)
    for qi in (0, 5, 777, n - 1):
        q = m[qi] + 0.3 * _unit(rng, 1)[0]
        for asked in (["a"], ["b", "c"], ["c"]):
            members = [i for i, s in zip(ids, scopes, strict=True) if s in asked]
            found = sv.search(q, 20, asked)
            assert len(found) == 20
            assert {i for i, _ in found} <= set(members)
            unit_q = q / np.linalg.norm(q)
            exact = _exact(vectors, members, unit_q, 20)
            # int8 codes perturb each cosine by under 0.01, so only near-ties may swap: the
            # best is the exact best unless within 0.02 of the next, and whatever is found is
            # within 0.02 of the exact 20th.
            if float(vectors[exact[0]] @ unit_q) - float(vectors[exact[1]] @ unit_q) > 0.02:
                assert found[0][0] == exact[0]
            assert len({i for i, _ in found} & set(exact)) >= 17
            floor = float(vectors[exact[-1]] @ unit_q)
            for i, score in found:
                true = float(vectors[i] @ unit_q)
                assert abs(score - true) < 0.01
                assert true >= floor - 0.02
    assert sv.search(m[0], 5, ["nope"]) == []


def test_search_over_every_scope_limited_to_the_rows_allowed() -> None:
    """No scopes named: every row is searched; an allowed set (the rows another filter
    passes) limits the search, across chunks, and may leave fewer than k or none."""
    rng = np.random.default_rng(12)
    n = CHUNK + 500
    m = _unit(rng, n)
    ids = [f"m{i}" for i in range(n)]
    scopes = ["a" if i % 2 else "b" for i in range(n)]
    vectors = dict(zip(ids, m, strict=True))
    sv = ScopeVectors(DIM)
    sv.load([(ids, scopes, m)])
    allowed = {f"m{i}" for i in range(0, n, 7)}
    for qi in (0, 7, 701, n - 2):
        q = m[qi]
        everywhere = sv.search(q, 10, None)
        assert everywhere[0][0] == ids[qi]
        assert len({i for i, _ in everywhere} & set(_exact(vectors, ids, q, 10))) >= 9
        found = sv.search(q, 10, None, allowed)
        assert {i for i, _ in found} <= allowed and len(found) == 10
        assert len({i for i, _ in found} & set(_exact(vectors, sorted(allowed), q, 10))) >= 9
        assert (found[0][0] == ids[qi]) == (ids[qi] in allowed)
        in_a = sv.search(q, 10, ["a"], allowed)
        assert {i for i, _ in in_a} <= {i for i in allowed if scopes[int(i[1:])] == "a"}
    assert [i for i, _ in sv.search(m[0], 10, None, {"m3", "m5"})] in (["m3", "m5"], ["m5", "m3"])
    assert sv.search(m[0], 10, None, set()) == []


def test_writes_move_replace_and_remove_rows() -> None:
    rng = np.random.default_rng(12)
    m = _unit(rng, CHUNK + 10)
    ids = [f"m{i}" for i in range(len(m))]
    sv = ScopeVectors(DIM)
    sv.load([])
    sv.put([(i, "a", v) for i, v in zip(ids, m, strict=True)], {})
    assert sv.rows_in(["a"]) == len(m)

    # m3 moves to scope b with a new vector; m4 is written twice in one batch (last wins).
    v3, v4a, v4b = _unit(rng, 3)
    sv.put([("m3", "b", v3), ("m4", "a", v4a), ("m4", "a", v4b)], {"m3": "a", "m4": "a"})
    assert sv.rows_in(["a"]) == len(m) - 1 and sv.rows_in(["b"]) == 1
    assert sv.search(v3, 1, ["b"])[0][0] == "m3"
    assert "m3" not in {i for i, _ in sv.search(v3, len(m), ["a"])}
    top4 = sv.search(v4b, 2, ["a"])
    assert top4[0][0] == "m4" and top4[0][1] > 0.99
    assert sum(i == "m4" for i, _ in sv.search(v4b, len(m), ["a"])) == 1

    # Removing rows from the first chunk and the last; a scope left empty disappears.
    sv.remove({"m0": "a", f"m{CHUNK + 5}": "a", "m3": "b"})
    assert sv.rows_in(["a"]) == len(m) - 3 and sv.rows_in(["b"]) == 0
    left = {i for i, _ in sv.search(m[0], len(m), ["a", "b"])}
    assert left == set(ids) - {"m0", "m3", f"m{CHUNK + 5}"}
    assert sv.nbytes() == (len(m) - 3) * (DIM + 4)  # a byte a dimension, a float32 scale


def test_a_reader_keeps_the_state_it_started_with() -> None:
    """Writers replace the state; a search holding the old one finds each row once."""
    rng = np.random.default_rng(13)
    m = _unit(rng, 50)
    sv = ScopeVectors(DIM)
    sv.load([([f"m{i}" for i in range(50)], ["a"] * 50, m)])
    before = sv._state
    sv.put([("m1", "b", m[1])], {"m1": "a"})
    assert sum(len(c.ids) for c in before["a"]) == 50  # the old state is untouched
    assert sv.rows_in(["a"]) == 49 and sv.rows_in(["b"]) == 1


def test_search_scores_every_row_as_its_codes_say_and_orders_ties_by_row() -> None:
    """The compiled scan (index/kernels.py) against numpy on the same int8 codes: each
    cosine within float32 rounding, best first; rows with the same vector tie exactly and
    come in the order of the scopes asked, then of the rows; asking more than there are
    returns every row."""
    rng = np.random.default_rng(13)
    m = _unit(rng, CHUNK + 40)
    m[5] = m[CHUNK + 7] = m[3]  # three equal vectors: "b" holds m3 and m5, "a" holds m1031
    ids = [f"m{i}" for i in range(len(m))]
    scopes = ["b" if i < CHUNK else "a" for i in range(len(m))]
    sv = ScopeVectors(DIM)
    sv.load([(ids, scopes, m)])
    q = m[3] + 0.05 * _unit(rng, 1)[0]
    found = sv.search(q, len(m) + 5, ["a", "b"])
    assert len(found) == len(m) and sorted(i for i, _ in found) == sorted(ids)
    assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)
    assert [i for i, _ in found[:3]] == [f"m{CHUNK + 7}", "m3", "m5"]
    codes, scales = quantize(m)
    expected = (codes.astype(np.float32) @ (q / np.linalg.norm(q)).astype(np.float32)) * scales
    for i, score in found:
        assert abs(score - float(expected[int(i[1:])])) < 1e-5


def test_cosines_of_given_rows_match_their_vectors_and_follow_writes() -> None:
    rng = np.random.default_rng(5)
    n = CHUNK + 200  # scope "a" spans two chunks
    m = _unit(rng, n)
    ids = [f"m{i}" for i in range(n)]
    sv = ScopeVectors(DIM)
    sv.load([(ids, ["a"] * (n - 10) + ["b"] * 10, m)])
    q = _unit(rng, 1)[0] * 3.0  # not unit length: cosines, not dot products
    unit_q = q / np.linalg.norm(q)
    asked = {"m0": "a", "m1100": "a", f"m{n - 1}": "b", "ghost": "a", "m5": "b"}  # m5 is not in b
    found = sv.cosines(q, asked)
    assert set(found) == {"m0", "m1100", f"m{n - 1}"}
    for mid, cos in found.items():
        assert abs(cos - float(m[int(mid[1:])] @ unit_q)) < 0.01
    moved = _unit(rng, 1)[0]
    sv.put([("m0", "b", moved)], {"m0": "a"})
    assert sv.cosines(q, {"m0": "a"}) == {}
    assert abs(sv.cosines(q, {"m0": "b"})["m0"] - float(moved @ unit_q)) < 0.01
    sv.remove({"m1100": "a"})
    assert sv.cosines(q, {"m1100": "a"}) == {}
