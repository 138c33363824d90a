"""The in-memory part of a vector search (index/pending.py): its filter must be the one
every other path applies (a disagreement would silently drop hits), and its search exact."""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np

from mnemo_server.index.lance_index import IndexRow
from mnemo_server.index.pending import PendingRows, row_filter
from mnemo_server.memory.model import Memory, MemoryFilter, MemoryType, Scope, ScopeKind, Source, TimeRange

SCOPES = [Scope.workspace(), Scope(ScopeKind.PROJECT, "p1"), Scope(ScopeKind.PERSONA, "p1")]
TYPES = [MemoryType.SEMANTIC, MemoryType.EPISODIC]
CATEGORIES = ["general", "ops"]
SESSIONS = ["", "s1", "s2"]
TIMES = [10, 20, 30]


def _row(
    i: int, scope: Scope, mtype: MemoryType, category: str, session: str, pinned: bool, t: int
) -> IndexRow:
    return IndexRow(
        id=f"m{i}",
        scope=scope.key,
        type=mtype.value,
        category=category,
        session=session,
        pinned=pinned,
        event_time_ns=t,
        create_time_ns=t + 5,
        revision=1,
        text="x",
        vector=np.ones(4, dtype=np.float32),
    )


def _memory(r: IndexRow, scope: Scope, mtype: MemoryType) -> Memory:
    return Memory(
        id=r.id,
        tenant_id="t",
        scope=scope,
        type=mtype,
        category=r.category,
        content=r.text,
        content_hash="",
        pinned=r.pinned,
        source=Source(session_id=r.session),
        event_time_ns=r.event_time_ns,
        create_time_ns=r.create_time_ns,
    )


def _filters(rng: random.Random, n: int) -> list[MemoryFilter]:
    ranges = [TimeRange(), TimeRange(15, None), TimeRange(None, 25), TimeRange(20, 31)]
    return [
        MemoryFilter(
            scopes=tuple(rng.sample(SCOPES, rng.randint(0, 2))),
            types=tuple(rng.sample(TYPES, rng.randint(0, 1))),
            categories=tuple(rng.sample(CATEGORIES, rng.randint(0, 1))),
            create_time=rng.choice(ranges),
            event_time=rng.choice(ranges),
            pinned_only=rng.random() < 0.3,
            source_session_ids=tuple(rng.sample(SESSIONS[1:], rng.randint(0, 1))),
        )
        for _ in range(n)
    ]


def test_the_row_filter_agrees_with_the_filter_on_memories() -> None:
    combos = itertools.product(SCOPES, TYPES, CATEGORIES, SESSIONS, (False, True), TIMES)
    pairs = [(_row(i, s, m, c, sess, p, t), s, m) for i, (s, m, c, sess, p, t) in enumerate(combos)]
    for f in _filters(random.Random(3), 300):
        matches = row_filter(f)
        for r, scope, mtype in pairs:
            assert matches(r) == f.matches(_memory(r, scope, mtype)), (f, r)


def test_search_is_exact_filtered_and_follows_writes() -> None:
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((40, 8)).astype(np.float32)
    rows = [
        dataclasses.replace(_row(i, SCOPES[i % 2], MemoryType.SEMANTIC, "general", "", False, 0), vector=v)
        for i, v in enumerate(vectors)
    ]
    pending = PendingRows().with_rows(rows[:30]).with_rows(rows[30:])
    q = rng.standard_normal(8).astype(np.float32)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    cos = unit @ (q / np.linalg.norm(q))
    expected = [f"m{i}" for i in np.argsort(-cos)[:5]]
    assert [i for i, _ in pending.search(q, 5, MemoryFilter())] == expected
    in_project = MemoryFilter(scopes=(SCOPES[1],))
    assert all(int(i[1:]) % 2 == 1 for i, _ in pending.search(q, 10, in_project))

    first = int(expected[0][1:])
    moved = dataclasses.replace(rows[first], vector=-vectors[first])  # now the least similar
    pending = pending.with_rows([moved]).without([expected[1]])
    assert len(pending) == 39
    top = [i for i, _ in pending.search(q, 5, MemoryFilter())]
    assert expected[0] not in top and expected[1] not in top and top[:3] == expected[2:5]


def test_rows_written_since_a_snapshot_include_rewrites_of_ids_it_held() -> None:
    a, b, c = (_row(i, SCOPES[0], TYPES[0], CATEGORIES[0], "", False, 10) for i in range(3))
    before = PendingRows().with_rows([a, b])
    b2 = dataclasses.replace(b, revision=2)
    now = before.with_rows([c]).with_rows([b2]).without(["m0"])
    assert [r.id for r in now.written_since(before).rows] == ["m2", "m1"]
    assert now.written_since(before).rows[1] is b2
    assert len(now.written_since(now)) == 0
