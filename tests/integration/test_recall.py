"""Recall: hybrid legs with per-leg scores, filters pushed down and re-checked, stages."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from tests.conftest import TenantClient

FACTS = [
    (
        "The user prefers dark mode and vim keybindings",
        common_pb2.MEMORY_TYPE_SEMANTIC,
        "prefs",
        "alpha",
        100,
    ),
    (
        "Deployed v2.1 to staging; rollback needed due to a memory leak",
        common_pb2.MEMORY_TYPE_EPISODIC,
        "deploy",
        "alpha",
        200,
    ),
    (
        "Always run the test suite before deploying to production",
        common_pb2.MEMORY_TYPE_PROCEDURAL,
        "deploy",
        "beta",
        300,
    ),
    ("The office cat is called Miso and likes tuna", common_pb2.MEMORY_TYPE_SEMANTIC, "misc", "beta", 400),
    (
        "Quarterly revenue grew 12 percent, driven by the EMEA region",
        common_pb2.MEMORY_TYPE_SEMANTIC,
        "finance",
        "alpha",
        500,
    ),
]


def _seed(t: TenantClient) -> dict[str, str]:
    reqs = [
        pb.CreateMemoryRequest(
            memory=memory_pb2.Memory(
                content=c,
                type=ty,
                category=cat,
                scope=common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id=proj),
                event_time=timestamp_pb2.Timestamp(seconds=ts),
            )
        )
        for c, ty, cat, proj, ts in FACTS
    ]
    res = (
        t.memory()
        .BatchCreateMemories(
            pb.BatchCreateMemoriesRequest(requests=reqs, wait_for_index=True), metadata=t.md, timeout=60
        )
        .results
    )
    assert all(r.memory.index_state == memory_pb2.INDEX_STATE_INDEXED for r in res)
    return {r.memory.content.split()[1]: r.memory.id for r in res}


def _recall(t: TenantClient, query: str, **kw: object) -> list[pb.RecallHit]:
    return list(
        t.memory()
        .Recall(
            pb.RecallRequest(query=query, **kw),
            metadata=t.md,  # type: ignore[arg-type]
            timeout=10,
        )
        .hits
    )


def test_semantic_and_lexical_queries_find_the_right_memory(tenant_a: TenantClient) -> None:
    _seed(tenant_a)
    assert (
        "dark mode" in _recall(tenant_a, "which editor theme does the user like?", top_k=1)[0].memory.content
    )
    assert "Miso" in _recall(tenant_a, "Miso", top_k=1)[0].memory.content
    assert "revenue" in _recall(tenant_a, "how did sales develop last quarter", top_k=1)[0].memory.content


def test_hits_carry_scores_per_leg_and_explanations(tenant_a: TenantClient) -> None:
    _seed(tenant_a)
    resp = tenant_a.memory().Recall(
        pb.RecallRequest(
            query="rollback memory leak staging", top_k=3, options=pb.RecallOptions(explain=True)
        ),
        metadata=tenant_a.md,
        timeout=10,
    )
    top = resp.hits[0]
    assert "rollback" in top.memory.content
    assert top.scores.vector_rank == 1 and top.scores.text_rank == 1
    assert top.scores.vector_score > 0 and top.scores.text_score > 0
    assert "vector #1" in top.explanation and "full-text #1" in top.explanation
    assert [h.score for h in resp.hits] == sorted((h.score for h in resp.hits), reverse=True)
    assert resp.vector_candidates >= 3 and resp.text_candidates >= 1


def test_filters(tenant_a: TenantClient) -> None:
    _seed(tenant_a)
    beta = common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id="beta")
    hits = _recall(tenant_a, "deploy", filter=memory_pb2.MemoryFilter(scopes=[beta]))
    assert hits and all(h.memory.scope.id == "beta" for h in hits)
    hits = _recall(
        tenant_a, "deploy", filter=memory_pb2.MemoryFilter(types=[common_pb2.MEMORY_TYPE_EPISODIC])
    )
    assert [h.memory.type for h in hits] == [common_pb2.MEMORY_TYPE_EPISODIC]
    hits = _recall(
        tenant_a,
        "anything",
        filter=memory_pb2.MemoryFilter(
            event_time=common_pb2.TimeRange(
                start_time=timestamp_pb2.Timestamp(seconds=250), end_time=timestamp_pb2.Timestamp(seconds=450)
            )
        ),
    )
    assert sorted(h.memory.event_time.seconds for h in hits) == [300, 400]
    hits = _recall(tenant_a, "deploy", filter=memory_pb2.MemoryFilter(categories=["finance"]))
    assert [h.memory.category for h in hits] == ["finance"]
    # The earliest time the API takes (-2**63 ns) is a bound like any other.
    earliest = timestamp_pb2.Timestamp(seconds=-9_223_372_037, nanos=145_224_192)
    for bounds, expected in (({"start_time": earliest}, len(FACTS)), ({"end_time": earliest}, 0)):
        time_range = common_pb2.TimeRange(**bounds)  # type: ignore[arg-type]
        scopes = [common_pb2.Scope(kind=common_pb2.SCOPE_KIND_PROJECT, id=p) for p in ("alpha", "beta")]
        f = memory_pb2.MemoryFilter(scopes=scopes, event_time=time_range)  # read from the table
        hits = _recall(tenant_a, "anything", top_k=20, filter=f)
        assert len(hits) == expected, bounds


def test_stages_can_be_switched_off(tenant_a: TenantClient) -> None:
    _seed(tenant_a)
    text_only = _recall(tenant_a, "tuna", options=pb.RecallOptions(disabled_stages=[pb.RECALL_STAGE_VECTOR]))
    assert text_only and all(h.scores.vector_rank == 0 for h in text_only)
    vec_only = _recall(
        tenant_a, "feline pet", options=pb.RecallOptions(disabled_stages=[pb.RECALL_STAGE_FULL_TEXT])
    )
    assert vec_only[0].memory.content.startswith("The office cat") and vec_only[0].scores.text_rank == 0


def test_top_k_and_empty_tenant(tenant_a: TenantClient, tenant_b: TenantClient) -> None:
    _seed(tenant_a)
    assert len(_recall(tenant_a, "the", top_k=2)) == 2
    assert _recall(tenant_b, "anything at all") == []


def test_a_code_found_only_by_full_text_is_scored_with_its_cosine_too(tenant_a: TenantClient) -> None:
    """A query of one rare code: the memory holding it is far from the query's vector (its
    text is about something else), so the vector leg's top K (50 here) is 120 invoices with
    other codes. Scored by its BM25 share alone it ranked below them; with its own cosine
    added it comes first, and its scores say the vector leg did not find it."""
    codes = [f"{n:04X}" for n in range(0x1A2B, 0x1A2B + 120)]
    memories = [f"Invoice INV-{c} for the cloud hosting plan was paid on time." for c in codes]
    memories.append("Reference INV-QZ7K: the team offsite lunch was vegetarian pizza and salad.")
    reqs = [pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=c)) for c in memories]
    tenant_a.memory().BatchCreateMemories(
        pb.BatchCreateMemoriesRequest(requests=reqs, wait_for_index=True), metadata=tenant_a.md, timeout=60
    )
    hits = _recall(tenant_a, "INV-QZ7K", top_k=10)
    assert hits[0].memory.content.startswith("Reference INV-QZ7K"), [h.memory.content for h in hits[:3]]
    top = hits[0].scores
    assert top.text_rank == 1 and top.vector_rank == 0 and top.vector_score > 0.05
    # The fused score is both legs' shares: BM25 over the best BM25 (1 here) and the cosine.
    assert abs(top.fused_score - (0.3 + 0.7 * top.vector_score)) < 1e-4
