"""The cross-encoder: data pipeline, fine-tuning, ONNX runtime, deadlines, metrics, command.

Most tests use a tiny random BERT (2 layers, 32 wide) saved like a sentence-transformers
model, so training and export take a second. The one test that must show real learning
fine-tunes the bundled MiniLM for a few steps on a toy set whose positives share the
query's words."""

from __future__ import annotations

import itertools
import json
import random
import re
import shutil
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from mnemo_server.errors import Cancelled, DeadlineExceeded, FailedPrecondition
from mnemo_sidecar.crossencoder.command import finetune_cross_encoder
from mnemo_sidecar.crossencoder.data import (
    PairsError,
    RerankRow,
    cap_per_source,
    labelled_pairs,
    limit_pairs,
    load_rows,
    split_by_group,
    to_pairs,
)
from mnemo_sidecar.crossencoder.evaluate import compare, evaluate, rank_of_positive
from mnemo_sidecar.crossencoder.finetune import (
    CARD_NAME,
    FinetuneStopped,
    _keep_to_budget,
    _load,
    _Schedule,
    bundled_base,
    finetune,
    read_card,
    torch_scorer,
    update_card,
)
from mnemo_sidecar.crossencoder.runtime import CrossEncoderRuntime, model_version
from mnemo_sidecar.deadlines import Deadline
from tests.conftest import SHARED

RERANK = SHARED / "rerank"
WORDS = [
    "apple",
    "river",
    "engine",
    "violin",
    "marble",
    "tiger",
    "candle",
    "orbit",
    "pepper",
    "glacier",
    "harbor",
    "saddle",
    "copper",
    "lantern",
    "meadow",
    "falcon",
]


def toy_rows(n: int, seed: int, source: str = "selqa_sent") -> list[RerankRow]:
    """Separable by word overlap: the positive names the query's two things, negatives others."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b, *others = rng.sample(WORDS, 8)
        negatives = tuple(
            f"the {c} and the {d} are in the hall" for c, d in zip(others[::2], others[1::2], strict=True)
        )
        rows.append(
            RerankRow(
                source,
                f"where are the {a} and the {b}",
                f"the {a} and the {b} are in the hall",
                negatives,
                f"g{seed}-{i}",
            )
        )
    return rows


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import BertConfig, BertModel

    out = tmp_path_factory.mktemp("tiny-base")
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        initializer_range=0.5,  # wide random weights, so scores differ enough to compare
    )
    BertModel(config).save_pretrained(str(out))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(bundled_base() / name, out / name)
    return out


@pytest.fixture(scope="module")
def tiny_model(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-ce") / "model"
    finetune(
        tiny_base,
        to_pairs(toy_rows(24, 1), negatives=2),
        out,
        max_length=32,
        batch_size=8,
        lr=1e-4,
        threads=1,
    )
    return out


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ce-onnx")


@pytest.fixture(scope="module")
def runtime(tiny_model: Path, onnx_cache: Path) -> CrossEncoderRuntime:
    return CrossEncoderRuntime(tiny_model, onnx_cache, intra_op_threads=1)


# ---------------------------------------------------------------- data


def test_group_split_holds_out_whole_groups_and_drops_shared_text() -> None:
    rows = [r for seed in range(3) for r in toy_rows(40, seed)]
    # Another source repeating a question verbatim (as QNLI and XQuAD do) must not leak it.
    twins = [
        RerankRow("qnli_dev_sent", r.query, r.positive + " (twin)", r.negatives, "twin-" + r.group)
        for r in rows
    ]
    split = split_by_group([*rows, *twins], validation_fraction=0.2)
    train_groups = {(r.source, r.group) for r in split.train}
    validation_groups = {(r.source, r.group) for r in split.validation}
    assert split.validation and split.train
    assert not train_groups & validation_groups
    held_out_text = {r.query for r in split.validation} | {r.positive for r in split.validation}
    assert not any(r.query in held_out_text or r.positive in held_out_text for r in split.train)
    assert split.dropped_for_overlap > 0
    # Hash-based: the same rows give the same split whatever their order.
    again = split_by_group(list(reversed([*rows, *twins])), validation_fraction=0.2)
    assert {(r.source, r.group) for r in again.validation} == validation_groups


def test_group_split_gives_every_source_with_enough_groups_a_validation_share() -> None:
    rows = [RerankRow("few", f"q{i}", f"p{i}", ("n",), f"g{i % 4}") for i in range(20)]
    split = split_by_group(rows, validation_fraction=0.0001)  # hashing alone would hold out nothing
    assert len({r.group for r in split.validation}) == 1
    assert len({r.group for r in split.train}) == 3


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        ('{"query": "q", "positive": "p"}\n{oops\n', r"p\.jsonl:2: bad JSON"),
        ('["q", "p"]\n', r"p\.jsonl:1: expected an object"),
        ('{"query": "q", "positive": "p", "negatives": 3}\n', r"p\.jsonl:1: expected an object with a list"),
    ],
)
def test_pairs_that_cannot_be_read_are_one_error_naming_the_line(
    tmp_path: Path, lines: str, said: str
) -> None:
    (tmp_path / "p.jsonl").write_text(lines)
    with pytest.raises(PairsError, match=said):
        load_rows(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PairsError, match=r"no \.jsonl files in"):
        load_rows(tmp_path / "empty")
    with pytest.raises(PairsError, match=r"absent\.jsonl: No such file"):
        load_rows(tmp_path / "absent.jsonl")


@pytest.mark.skipif(not RERANK.exists(), reason="public rerank pairs not present")
def test_real_pairs_split_and_per_source_cap() -> None:
    rows = load_rows(RERANK)
    split = split_by_group(rows)
    assert not {r.group for r in split.train} & {r.group for r in split.validation}
    assert set(Counter(r.source for r in split.validation)) == set(Counter(r.source for r in rows))
    capped = cap_per_source(split.train, max_queries=50, seed=3)
    queries = Counter(r.source for r in capped)
    assert max(queries.values()) <= 50 and len(queries) == len({r.source for r in rows})
    assert len({(r.source, r.query) for r in capped}) == len(capped)  # one positive per query
    assert capped == cap_per_source(split.train, max_queries=50, seed=3)
    assert capped != cap_per_source(split.train, max_queries=50, seed=4)


def test_per_source_cap_counts_queries_and_keeps_all_rows_when_asked() -> None:
    rows = [RerankRow("s", f"q{i % 10}", f"p{i}", ("n",), "g") for i in range(30)]  # 3 gold passages a query
    assert len(cap_per_source(rows, max_queries=4)) == 4
    assert len(cap_per_source(rows, max_queries=4, rows_per_query=None)) == 12


def test_pairs_labels_and_limits() -> None:
    rows = toy_rows(10, 0)
    pairs = to_pairs(rows, negatives=2, seed=1)
    assert len(pairs) == 30 and sum(p.label for p in pairs) == 10
    assert pairs == to_pairs(rows, negatives=2, seed=1)
    limited = limit_pairs(pairs, 10)
    assert len(limited) == 9 and Counter(p.query for p in limited).most_common(1)[0][1] == 3
    fed = labelled_pairs([("q", "relevant", 1), ("q", " ", 0), ("q", "half", 0.5)])
    assert [p.label for p in fed] == [1.0, 0.5] and {p.source for p in fed} == {"feedback"}
    with pytest.raises(ValueError):
        labelled_pairs([("q", "p", 2)])


# ---------------------------------------------------------------- metrics


def test_metrics_rank_ties_against_the_positive() -> None:
    assert rank_of_positive(1.0, [0.0, 2.0, 1.0]) == 3
    rows = [RerankRow("a", "q1", "p", ("n1", "n2"), "g"), RerankRow("b", "q2", "p", ("n1",), "g")]
    table = {("q1", "p"): 0.1, ("q1", "n1"): 0.5, ("q1", "n2"): 0.0, ("q2", "p"): 0.9, ("q2", "n1"): 0.2}
    report = evaluate(rows, lambda pairs: np.array([table[p] for p in pairs], dtype=np.float32))
    assert report.per_source["a"].mrr_at_10 == 0.5 and report.per_source["b"].mrr_at_10 == 1.0
    assert report.per_source["a"].ndcg_at_10 == pytest.approx(1 / np.log2(3), abs=1e-4)
    assert report.overall.mrr_at_10 == 0.75 and report.overall.accuracy_at_1 == 0.5
    flat = evaluate(rows, lambda pairs: np.zeros(len(pairs), dtype=np.float32))
    assert flat.overall.accuracy_at_1 == 0.0  # a constant scorer earns nothing
    assert compare(flat, report)["overall"]["mrr_at_10"] == pytest.approx(0.75 - flat.overall.mrr_at_10)


# ---------------------------------------------------------------- fine-tuning


def test_card_is_written_with_data_hyperparameters_and_attribution(tiny_model: Path) -> None:
    card = read_card(tiny_model)
    assert card["base_kind"] == "sentence-transformers" and card["max_length"] == 32
    assert card["data"]["pairs"] == 72 and card["data"]["positives"] == 24
    assert card["hyperparameters"]["lr"] == 1e-4 and card["hyperparameters"]["freeze_word_embeddings"]
    assert [a["source"] for a in card["attribution"]["pair_sources"]] == ["selqa_sent"]
    assert "Apache-2.0" in card["attribution"]["pair_sources"][0]["licence"]
    assert {"config.json", "model.safetensors", "tokenizer.json", CARD_NAME} <= {
        p.name for p in tiny_model.iterdir()
    }
    assert not list(tiny_model.parent.glob(".*tmp*"))  # the temp dir was renamed away


def test_finetune_is_deterministic_and_freezes_word_embeddings(tiny_base: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    pairs = to_pairs(toy_rows(8, 5))
    kwargs: dict[str, Any] = {"max_length": 24, "batch_size": 8, "lr": 1e-3, "threads": 1}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        finetune(tiny_base, pairs, tmp_path / name, seed=seed, **kwargs)
    a, b, c = (load_file(str(tmp_path / n / "model.safetensors")) for n in "abc")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], c[k]) for k in a)
    base = load_file(str(tiny_base / "model.safetensors"))
    word = next(k for k in a if k.endswith("word_embeddings.weight"))
    assert np.array_equal(a[word], base[word.removeprefix("bert.")])


def test_finetune_continues_a_cross_encoder_and_stops_without_writing(
    tiny_model: Path, tmp_path: Path
) -> None:
    validation = toy_rows(4, 9)
    report = finetune(
        tiny_model,
        labelled_pairs([("where is x", "x is here", 1)]),
        tmp_path / "next",
        validation=validation,
        threads=1,
    )
    assert report.base_kind == "cross-encoder" and report.validation_before is not None
    card = read_card(tmp_path / "next")
    assert card["parent"]["base"] == read_card(tiny_model)["base"]
    assert {a["source"] for a in card["attribution"]["pair_sources"]} == {"selqa_sent"}  # inherited

    keep = tmp_path / "keep"
    shutil.copytree(tiny_model, keep)
    before = {p.name: p.read_bytes() for p in keep.iterdir()}
    with pytest.raises(FinetuneStopped):
        finetune(tiny_model, to_pairs(toy_rows(8, 2)), keep, should_stop=lambda: True, threads=1)
    assert {p.name: p.read_bytes() for p in keep.iterdir()} == before

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a model")
    with pytest.raises(FileExistsError):  # never replace a directory finetune() did not write
        finetune(tiny_model, to_pairs(toy_rows(8, 2)), foreign, threads=1)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_finetune_raises_validation_mrr_above_the_untrained_head(tmp_path: Path) -> None:
    train, validation = toy_rows(32, 1), toy_rows(24, 2)
    model, tokenizer, _ = _load(bundled_base(), seed=0)  # the same head finetune() starts from
    untrained = evaluate(validation, torch_scorer(model, tokenizer, 32))
    seen: list[float] = []
    report = finetune(
        bundled_base(),
        to_pairs(train, negatives=1),
        tmp_path / "ce",
        lr=1e-4,
        batch_size=16,
        max_length=32,
        validation=validation,
        threads=1,
        progress=lambda done, _message: seen.append(done),
    )
    assert report.validation is not None
    assert report.validation.overall.mrr_at_10 >= untrained.overall.mrr_at_10 + 0.25, (
        untrained,
        report.validation,
    )
    assert report.validation.overall.mrr_at_10 >= 0.8
    assert seen[-1] == 1.0 and seen == sorted(seen)


def test_a_resized_schedule_still_decays_its_rate_to_zero() -> None:
    plain = _Schedule(40, 0.1)
    # Cut while warming up: the shape of a plan of the new length.
    early = _Schedule(100, 0.1)
    early.resize(40, done=3)
    assert early.total == 40
    assert [early.factor(i) for i in range(41)] == [plain.factor(i) for i in range(41)]
    # Cut later: from the rate it has, linearly down to zero at the new end.
    late = _Schedule(100, 0.1)
    before = late.factor(50)
    late.resize(60, done=50)
    rates = [late.factor(i) for i in range(50, 61)]
    assert rates[0] == pytest.approx(before) and rates[-1] == 0.0
    assert all(a > b for a, b in itertools.pairwise(rates))
    # Lengthened again (the pace got better): on from the rate it has, never past the plan.
    at_55 = late.factor(55)
    late.resize(500, done=55)
    assert late.total == 100 and late.factor(55) == pytest.approx(at_55) and late.factor(100) == 0.0
    late.resize(10, done=70)  # never shorter than the steps done
    assert late.total == 70 and late.factor(70) == 0.0


def test_a_time_budget_resizes_the_plan_to_the_steps_its_pace_fits() -> None:
    plan = _Schedule(1000, 0.1)
    _keep_to_budget(plan, 4, elapsed=1.0, budget=10.0)
    assert plan.total == 1000  # too few steps to judge the pace
    _keep_to_budget(plan, 5, elapsed=1.0, budget=10.0)
    assert plan.total == 50  # 0.2 s a step
    _keep_to_budget(plan, 6, elapsed=3.0, budget=10.0)
    assert plan.total == 50  # checked again only every 20 steps
    _keep_to_budget(plan, 20, elapsed=2.5, budget=10.0)
    assert plan.total == 80  # faster than the first steps
    _keep_to_budget(plan, 40, elapsed=8.0, budget=10.0)
    assert plan.total == 50
    _keep_to_budget(plan, 45, elapsed=10.0, budget=10.0)
    assert plan.total == 45  # the budget is spent: stop now


def test_a_fine_tune_cut_by_its_budget_is_written_and_says_so(tiny_base: Path, tmp_path: Path) -> None:
    pairs = to_pairs(toy_rows(40, 3), negatives=2)  # 120 pairs: 15 batches of 8 an epoch
    kwargs: dict[str, Any] = {"max_length": 24, "batch_size": 8, "epochs": 2, "threads": 1}
    half = finetune(tiny_base, pairs, tmp_path / "half", step_fraction=0.5, **kwargs)
    assert (half.steps, half.planned_steps) == (15, 30)
    seen: list[tuple[float, str]] = []
    cut = finetune(
        tiny_base,
        pairs,
        tmp_path / "cut",
        max_seconds=1e-6,
        progress=lambda done, message: seen.append((done, message)),
        **kwargs,
    )
    assert cut.planned_steps == 30 and 1 <= cut.steps < 30
    assert seen[-1] == (1.0, seen[-1][1]) and "(cut to 1 of 30 steps)" in seen[-1][1]
    card = read_card(tmp_path / "cut")
    assert card["training"]["steps"] == cut.steps and card["training"]["planned_steps"] == 30
    assert card["hyperparameters"]["max_seconds"] == 1e-6
    assert CrossEncoderRuntime(tmp_path / "cut", tmp_path / "onnx", intra_op_threads=1).score(
        "where are the harbor and the saddle", ["the harbor and the saddle are in the hall"], Deadline.none()
    ).shape == (1,)
    with pytest.raises(ValueError, match="max_seconds"):
        finetune(tiny_base, pairs, tmp_path / "bad", max_seconds=0.0, **kwargs)


# ---------------------------------------------------------------- runtime


def test_runtime_loads_the_saved_model_and_scores_deterministically(runtime: CrossEncoderRuntime) -> None:
    texts = [f"the {w} is in the hall" for w in WORDS] + ["a much longer passage " * 10]
    first = runtime.score("where is the tiger", texts)
    assert first.dtype == np.float32 and first.shape == (len(texts),)
    assert np.array_equal(first, runtime.score("where is the tiger", texts))
    # Order of the candidates does not change any candidate's score.
    reordered = runtime.score("where is the tiger", texts[::-1])[::-1]
    np.testing.assert_allclose(reordered, first, atol=1e-5)
    info = runtime.describe()
    assert info["version"] == runtime.version == model_version(runtime.model_dir)
    assert info["precision"] == "fp32" and info["max_length"] == 32 and info["calls"] >= 2


def test_concurrent_calls_get_the_same_scores_as_serial_ones(runtime: CrossEncoderRuntime) -> None:
    from concurrent.futures import ThreadPoolExecutor

    requests = [(r.query, [r.positive, *r.negatives] * 5) for r in toy_rows(8, 6)]
    serial = [runtime.score(q, texts) for q, texts in requests]
    with ThreadPoolExecutor(max_workers=4) as pool:
        concurrent = list(pool.map(lambda req: runtime.score(*req), requests * 3))
    for i, scores in enumerate(concurrent):
        np.testing.assert_array_equal(scores, serial[i % len(requests)])


def test_onnx_matches_torch_logits(runtime: CrossEncoderRuntime, tiny_model: Path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_model)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    rows = toy_rows(6, 4)
    pairs = [(r.query, t) for r in rows for t in (r.positive, *r.negatives)]
    pairs.append(("a long query " * 5, "and a passage that will be truncated " * 8))  # > max_length
    enc = tokenizer(
        [q for q, _ in pairs],
        [p for _, p in pairs],
        truncation=True,
        max_length=32,
        padding=True,
        return_tensors="pt",
    )
    with torch.inference_mode():
        expected = model(**enc).logits[:, 0].numpy()
    np.testing.assert_allclose(runtime.score_pairs(pairs), expected, atol=1e-4)


def test_int8_export_serves_close_scores(
    runtime: CrossEncoderRuntime, tiny_model: Path, onnx_cache: Path
) -> None:
    int8 = CrossEncoderRuntime(tiny_model, onnx_cache, precision="int8", intra_op_threads=1)
    assert int8.onnx_file.name == "model.int8.onnx" and int8.version == runtime.version
    pairs = [(r.query, t) for r in toy_rows(6, 3) for t in (r.positive, *r.negatives)]
    fp32, q8 = runtime.score_pairs(pairs), int8.score_pairs(pairs)
    assert np.corrcoef(fp32, q8)[0, 1] > 0.9


def test_version_ignores_card_notes_but_not_max_length(tiny_model: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model, copy)
    version = model_version(copy)
    update_card(copy, notes="measured later")
    assert model_version(copy) == version
    update_card(copy, max_length=64)
    assert model_version(copy) != version


class _ClockedSession:
    """Wraps the ONNX session: every run() advances a fake clock by one second."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.now = 0.0
        self.runs = 0

    def clock(self) -> float:
        return self.now

    def run(self, *args: Any) -> Any:
        self.runs += 1
        self.now += 1.0
        return self.inner.run(*args)


def test_expired_deadline_raises_before_any_work(
    runtime: CrossEncoderRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_work(*_: Any) -> Any:
        raise AssertionError("scoring started although the deadline had passed")

    monkeypatch.setattr(runtime, "_run", no_work)
    with pytest.raises(DeadlineExceeded) as err:
        runtime.score("q", ["a", "b"], Deadline(0.0))
    assert err.value.reason == "SIDECAR_DEADLINE"


def test_deadline_expiring_or_the_caller_leaving_midway_stops_between_batches(
    runtime: CrossEncoderRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = _ClockedSession(runtime._session)
    monkeypatch.setattr(runtime, "_session", session)
    texts = [f"passage number {i}" for i in range(40)]  # three micro-batches of 16
    with pytest.raises(DeadlineExceeded):
        runtime.score("q", texts, Deadline(1.5, clock=session.clock))
    assert session.runs == 2  # checked between batches: the third never started

    session.runs, session.now = 0, 0.0
    with pytest.raises(DeadlineExceeded):  # the only batch finished after the deadline
        runtime.score("q", texts[:5], Deadline(0.5, clock=session.clock))
    assert session.runs == 1

    session.runs, session.now = 0, 0.0
    assert runtime.score("q", texts, Deadline(10.0, clock=session.clock)).shape == (40,)

    session.runs, session.now = 0, 0.0
    with pytest.raises(Cancelled):  # the caller went away during the first batch
        runtime.score("q", texts, Deadline(100.0, clock=session.clock, alive=lambda: session.runs == 0))
    assert session.runs == 1


def test_batch_that_cannot_finish_in_time_is_refused_up_front(
    runtime: CrossEncoderRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = _ClockedSession(runtime._session)
    monkeypatch.setattr(runtime, "_session", session)
    monkeypatch.setattr(runtime, "_seconds_per_token", 1.0)  # as if the machine were very slow
    with pytest.raises(DeadlineExceeded):
        runtime.score("q", ["a passage"], Deadline(2.0))
    assert session.runs == 0


def test_texts_longer_than_the_model_reads_score_as_the_whole_texts(runtime: CrossEncoderRuntime) -> None:
    """Texts are cut before tokenising to what the model reads; the scores stay those of the
    whole texts (the tokenizer's own truncation), whatever the query's length."""
    long_text = " ".join(f"the {WORDS[i % len(WORDS)]} number {i}, in the hall." for i in range(1_500))
    texts = [long_text, "tabs\tand\nlines " * 300, "the tiger is in the hall"]
    for query in ("where is the tiger", "where is the tiger " * 40):
        whole = runtime._tokenizer.encode_batch([(query, t) for t in texts])
        pairs_cut = runtime._tokenizer.encode_batch([(query, runtime._readable(query, t, {})) for t in texts])
        assert [e.ids for e in pairs_cut] == [e.ids for e in whole]
        assert [e.type_ids for e in pairs_cut] == [e.type_ids for e in whole]
    assert len(runtime._readable("q", long_text, {})) < len(long_text) // 10


def test_a_batch_the_time_left_cannot_take_whole_is_split(
    runtime: CrossEncoderRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 pairs of one length are one micro-batch; at a pace where they take 1 s and 0.8 s are
    left, only as many run before the deadline is checked again as fit in half of that."""
    session = _ClockedSession(runtime._session)
    monkeypatch.setattr(runtime, "_session", session)
    sizes: list[int] = []
    run = session.run

    def recording(*args: Any) -> Any:
        sizes.append(len(args[1]["input_ids"]))
        return run(*args)

    monkeypatch.setattr(session, "run", recording)
    texts = [f"passage number {i} " * 20 for i in range(16)]
    width = len(runtime._tokenizer.encode("q", texts[0]).ids)
    monkeypatch.setattr(runtime, "_seconds_per_token", 1.0 / (16 * width))
    with pytest.raises(DeadlineExceeded):
        runtime.score("q", texts, Deadline(0.8, clock=session.clock))
    assert sizes == [6]  # 0.4 s of the 1 s the batch takes; then the deadline had passed


def test_candidate_cap(tiny_model: Path, onnx_cache: Path, runtime: CrossEncoderRuntime) -> None:
    texts = [f"the {w} is in the hall" for w in WORDS]
    capped = runtime.score("where is the tiger", texts, max_candidates=5)
    assert capped.shape == (5,)
    np.testing.assert_allclose(capped, runtime.score("where is the tiger", texts)[:5], atol=1e-5)
    assert runtime.score("q", texts, max_candidates=0).shape == (0,)
    default_cap = CrossEncoderRuntime(tiny_model, onnx_cache, intra_op_threads=1, max_candidates=3)
    assert default_cap.score("q", texts).shape == (3,) and default_cap.describe()["max_candidates"] == 3


# ---------------------------------------------------------------- command


def _write_pairs(pairs_dir: Path, rows: list[Any], name: str = "rows") -> None:
    pairs_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(
            {
                "source": r.source,
                "query": r.query,
                "positive": r.positive,
                "negatives": list(r.negatives),
                "group": r.group,
            }
        )
        for r in rows
    ]
    (pairs_dir / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


def test_command_trains_exports_and_reports(tiny_base: Path, tmp_path: Path) -> None:
    pairs_dir = tmp_path / "pairs"
    for source, seed in (("selqa_sent", 11), ("dstc9_faq", 12)):
        _write_pairs(pairs_dir, toy_rows(30, seed, source), source)
    out, figures = tmp_path / "model", tmp_path / "figures.json"
    result = CliRunner().invoke(
        finetune_cross_encoder,
        [
            "--pairs", str(pairs_dir), "--out", str(out), "--base", str(tiny_base), "--per-source-cap", "10",
            "--max-length", "32", "--batch-size", "8", "--lr", "1e-3", "--precision", "int8",
            "--validation-fraction", "0.3", "--validation-cap", "5", "--latency-runs", "1", "--threads", "1",
            "--max-minutes", "1e-9", "--json-out", str(figures),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(figures.read_text())
    assert summary["command"]["max_minutes"] == 1e-9  # a budget that cuts the run to its first step
    assert summary["training"]["steps"] == 1 < summary["training"]["planned_steps"]
    assert f"1 of {summary['training']['planned_steps']} steps" in result.output
    assert set(summary["validation"]) == {"bi-encoder", "CE fp32", "CE int8"}
    assert set(summary["validation"]["CE fp32"]["per_source"]) == {"selqa_sent", "dstc9_faq"}
    assert {"20", "50", "50_mean_tokens"} <= set(summary["rerank_latency_ms"]["int8"])
    assert summary["data"]["training_pairs"]["queries"] <= 20
    assert read_card(out)["serving"] == {"precision": "int8"}
    assert CrossEncoderRuntime(out, out / "onnx").precision == "int8"  # the card chooses, the cache is reused
    assert "Validation: rank of the positive" in result.output and "NDCG" in result.output


def test_the_command_refuses_inputs_it_cannot_use_in_one_line_before_loading_a_model(tmp_path: Path) -> None:
    """Each of these ended in a traceback (sidecar probe), one only after the whole run."""
    rows = toy_rows(30, 11, "selqa_sent")
    _write_pairs(tmp_path / "good", rows)
    _write_pairs(tmp_path / "no-negatives", [replace(r, negatives=()) for r in rows])
    _write_pairs(tmp_path / "one-row", rows[:1])
    # Every training row shares its query with a validation row, and is dropped for it.
    _write_pairs(tmp_path / "overlap", [replace(r, query="which one?") for r in rows])
    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "not-a-model" / "notes.txt").write_text("mine")
    out = str(tmp_path / "model")
    cases = [
        (["--pairs", str(tmp_path / "no-negatives"), "--out", out], "no validation row has a negative"),
        (["--pairs", str(tmp_path / "one-row"), "--out", out], "no rows are held out for validation"),
        (["--pairs", str(tmp_path / "overlap"), "--out", out], "no training pairs are left"),
        (
            ["--pairs", str(tmp_path / "good"), "--out", str(tmp_path / "not-a-model")],
            "does not hold a cross-encoder",
        ),
        (["--pairs", str(tmp_path / "good"), "--out", out, "--epochs", "0"], "--epochs"),
        (["--pairs", str(tmp_path / "good"), "--out", out, "--batch-size", "0"], "--batch-size"),
        (["--pairs", str(tmp_path / "good"), "--out", out, "--max-length", "4"], "--max-length"),
        (
            ["--pairs", str(tmp_path / "good"), "--out", out, "--validation-fraction", "1"],
            "--validation-fraction",
        ),
    ]
    for args, message in cases:
        result = CliRunner().invoke(finetune_cross_encoder, args)
        assert result.exit_code != 0 and isinstance(result.exception, SystemExit), result.exception
        assert message in result.output, (args, result.output)
        assert "Traceback" not in result.output
    assert not (tmp_path / "model").exists()


def test_a_configured_cross_encoder_whose_weights_are_cut_short_is_one_line_at_start(
    tiny_model: Path, tmp_path: Path
) -> None:
    """A truncated model.safetensors raised the loader's own error type, which start-up did
    not catch: a 30-line traceback (sidecar probe)."""
    from mnemo_sidecar.config import SidecarConfig

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    cfg = SidecarConfig().replace(
        storage={"data_dir": str(tmp_path / "data")}, cross_encoder={"path": str(broken)}
    )
    engine = _engine_over(cfg, tmp_path)
    with pytest.raises(FailedPrecondition, match="holds no cross-encoder that loads") as err:
        engine.warm_up()
    assert err.value.reason == "BAD_CONFIG"


# ---------------------------------------------------------------- learning from sessions


def _learning_engine(tiny_model: Path, tmp_path: Path, **cross_encoder: Any) -> Any:
    """A sidecar engine configured with the tiny cross-encoder, holding 24 sessions."""
    from mnemo_sidecar.config import SidecarConfig
    from tests.unit.test_sidecar_learning import synthetic_session

    cfg = SidecarConfig().replace(
        storage={"data_dir": str(tmp_path)},
        # A margin below any difference: every candidate is promoted, so each path runs.
        training={"min_sessions": 20, "heldout_fraction": 0.25, "promote_margin": -1.0, "torch_threads": 1},
        cross_encoder={
            "path": str(tiny_model),
            "epochs": 1,
            "max_length": 32,
            "batch_size": 8,
            "score_head": 5,
            **cross_encoder,
        },
        ranker={"n_estimators": 20, "min_child_samples": 5},
    )
    engine = _engine_over(cfg, tmp_path)
    rng = random.Random(4)
    for s in (synthetic_session(i, rng, n=8) for i in range(24)):
        engine.store.add_session("t", s, None, None, None)
    return engine


def _engine_over(cfg: Any, tmp_path: Path) -> Any:
    """An engine over the pair store and model registry in tmp_path (new, or a restart)."""
    from mnemo_sidecar.engine import RankingEngine
    from mnemo_sidecar.learning.pair_store import PairStore

    store = PairStore(tmp_path / "p.sqlite")
    return RankingEngine.over(cfg, store, tmp_path / "models")


def _train_both(engine: Any) -> tuple[Any, Any]:
    from mnemo_sidecar.learning.model import ModelKind
    from mnemo_sidecar.learning.trainer import Trainer

    ce_out, ranker_out = Trainer(engine).train(
        "t",
        {ModelKind.CROSS_ENCODER, ModelKind.RANKER},
        force=False,
        progress=lambda *a: None,
        should_stop=lambda: False,
    )
    return ce_out, ranker_out


def test_trainer_judges_a_fine_tune_as_the_rankers_feature(tiny_model: Path, tmp_path: Path) -> None:
    """A fine-tuned cross-encoder is compared, as the ranker's feature, with the current
    one; the ranker then trained records whose scores it learned, and one that learned
    another cross-encoder's scores is no incumbent."""
    from mnemo_sidecar.deadlines import Deadline
    from mnemo_sidecar.learning import cross_fit
    from mnemo_sidecar.learning.pair_store import split_heldout
    from mnemo_sidecar.learning.trainer import Trainer
    from tests.unit.test_sidecar_learning import synthetic_session

    engine = _learning_engine(tiny_model, tmp_path)
    cfg, store = engine.cfg, engine.store
    rng = random.Random(5)
    configured, _ = engine.cross_encoder("t")
    assert configured is not None
    none = Deadline.none()

    ce_out, ranker_out = _train_both(engine)
    assert ce_out.promoted and ce_out.reason.endswith("(as the ranker's feature)")
    served_ce, _ = engine.cross_encoder("t")
    assert served_ce is not None
    # The sessions the fine-tune learned from are scored by the fold models (cross_fit),
    # the held-back ones by the fine-tune itself, and the ranker learns those scores.
    sessions = store.sessions("t")
    train_sessions, _ = split_heldout(sessions, cfg.training.heldout_fraction, cfg.training.min_heldout)
    oof = cross_fit.load(served_ce)
    assert set(oof) == {s.session_id for s in train_sessions} and all(len(v) == 5 for v in oof.values())
    own = {
        s.session_id: engine.ce_head_scores(served_ce, s.query, [c.candidate for c in s.candidates], none)
        for s in sessions
    }
    assert any(oof[i] != pytest.approx(own[i]) for i in oof)  # other models' scores, not its own
    features = Trainer(engine)._ce_features(served_ce, sessions, {}, lambda *a: None)
    assert {i: features[i] for i in oof} == oof
    assert all(features[i] == pytest.approx(own[i]) for i in own if i not in oof)
    served = engine.ranker("t")
    assert served_ce is not None and served_ce.version != configured.version
    # The fine-tune is judged and served in int8, the configured model in fp32 (the defaults).
    assert (served_ce.precision, configured.precision) == ("int8", "fp32")
    assert ranker_out.promoted and served is not None
    assert served.model.uses_ce and served.model.ce_version == served_ce.version
    # Score feeds the ranker only the scores of the cross-encoder it learned from. Another
    # may serve meanwhile: the configured one while the fine-tune is out of memory (loading
    # in the background, cross_encoder.max_resident), or one promoted since.
    scored_by: list[str] = []
    head_scores, serving = engine.ce_head_scores, engine.serving_cross_encoder

    def recording(ce: Any, query: str, candidates: Any, deadline: Any) -> dict[str, float]:
        scored_by.append(ce.version)
        return head_scores(ce, query, candidates, deadline)

    engine.ce_head_scores = recording
    probe = sessions[0]
    for now_serving, expected in ((served_ce, [served_ce.version]), (configured, [])):
        engine.serving_cross_encoder = lambda tenant, ce=now_serving: (ce, "test")
        scored_by.clear()
        engine.predict("t", probe.query, probe.feature_names, [c.candidate for c in probe.candidates], none)
        assert scored_by == expected
    engine.ce_head_scores, engine.serving_cross_encoder = head_scores, serving
    # More sessions, another fine-tune (from the configured model again, on all of them)
    # replaces the cross-encoder; the ranker that learned the previous one's scores is not
    # the incumbent the next ranker has to beat.
    for s in (synthetic_session(i, rng, n=8) for i in range(24, 32)):
        store.add_session("t", s, None, None, None)
    ce_again, ranker_again = _train_both(engine)
    again, _ = engine.cross_encoder("t")
    assert again is not None and again.version != served_ce.version
    assert ce_again.promoted and "another cross-encoder's scores" in ranker_again.reason
    assert ranker_again.current_ndcg == 0.0  # judged against the baseline alone


def test_as_the_rankers_feature_a_cross_encoder_scores_only_the_newest_sessions_up_to_the_cap(
    tiny_model: Path, tmp_path: Path
) -> None:
    """At up to feature_max_ms a head, scoring every stored session with the fine-tune, the
    current version and a fold model would take up to 40 minutes at the store's cap."""
    from mnemo_sidecar.learning import cross_fit
    from mnemo_sidecar.learning.pair_store import split_heldout

    engine = _learning_engine(tiny_model, tmp_path, feature_max_sessions=10)
    sessions = engine.store.sessions("t")
    train, held = split_heldout(
        sessions, engine.cfg.training.heldout_fraction, engine.cfg.training.min_heldout
    )
    assert (len(train), len(held)) == (16, 8)
    newest = {s.query for s in [*train, *held][-10:]}  # all 8 held back and 2 training sessions
    assert len(newest) == 10 and len({s.query for s in sessions}) == 24
    scored: list[str] = []
    head_scores = engine.ce_head_scores

    def recording(ce: Any, query: str, candidates: Any, deadline: Any) -> dict[str, float]:
        scored.append(query)
        return head_scores(ce, query, candidates, deadline)

    engine.ce_head_scores = recording  # the real scoring, its queries noted
    ce_out, ranker_out = _train_both(engine)
    assert ce_out.promoted and ce_out.reason.endswith("(as the ranker's feature)")
    assert set(scored) == newest  # by the fine-tune, the configured model and the fold models
    served_ce, _ = engine.cross_encoder("t")
    assert served_ce is not None
    assert set(cross_fit.load(served_ce)) == {s.session_id for s in train[-2:]}
    served = engine.ranker("t")
    assert ranker_out.promoted and served is not None and served.model.uses_ce


def test_a_cross_encoder_too_slow_for_scores_deadline_is_no_rankers_feature(
    tiny_model: Path, tmp_path: Path
) -> None:
    """One whose head takes longer to score than `feature_max_ms` is judged alone (for
    Recall's rerank), without fold models, and the ranker learns without its scores."""
    from mnemo_sidecar.learning import cross_fit

    engine = _learning_engine(tiny_model, tmp_path, feature_max_ms=1e-6)
    ce_out, ranker_out = _train_both(engine)
    slow = "scoring its head of 5 candidates takes"
    assert ce_out.promoted and f"(alone, for Recall's rerank: {slow}" in ce_out.reason
    served_ce, _ = engine.cross_encoder("t")
    assert served_ce is not None and cross_fit.load(served_ce) == {}  # no fold model was fitted
    assert ranker_out.promoted and f"(no cross-encoder feature: {slow}" in ranker_out.reason
    served = engine.ranker("t")
    assert served is not None and not served.model.uses_ce
    assert "cross-encoder" not in served.source


def test_a_fine_tune_over_its_budget_is_cut_and_its_fold_models_run_the_same_share(
    tiny_model: Path, tmp_path: Path
) -> None:
    from mnemo_sidecar.learning.model import ModelKind
    from mnemo_sidecar.learning.trainer import Trainer

    engine = _learning_engine(tiny_model, tmp_path, fine_tune_max_s=1e-6)
    events: list[tuple[str, str]] = []
    ce_out, _ = Trainer(engine).train(
        "t",
        {ModelKind.CROSS_ENCODER, ModelKind.RANKER},
        force=False,
        progress=lambda kind, stage, _f, message: events.append((stage, message)),
        should_stop=lambda: False,
    )
    assert ce_out.promoted
    _, source = engine.cross_encoder("t")
    # 16 training sessions, 8 candidates each: 128 pairs, 16 batches of 8 in one epoch.
    assert source.endswith(
        "(1 of 16 steps, cut to its 1e-06 s budget) (the ranker learns their scores from 2 fold models)"
    )
    last = dict(events)
    assert last["fine-tuning"].endswith("(cut to 1 of 16 steps)")
    # Each fold model trains on the other fold's sessions (about half), cut to the same
    # share: 1 of 16 steps is 1 of its own.
    folds = [m for stage, m in events if stage == "cross-fitting" and "epoch" in m]
    assert len(folds) == 2 and all(re.search(r"\(cut to 1 of \d+ steps\)$", m) for m in folds), folds


def test_a_run_stopped_during_its_fine_tune_leaves_no_version_behind(
    tiny_model: Path, tmp_path: Path
) -> None:
    """A sidecar stopping mid-run (should_stop turns true) ends the fine-tune; the version
    directory the run had made for it is removed, and nothing is promoted."""
    from mnemo_sidecar.crossencoder.finetune import FinetuneStopped
    from mnemo_sidecar.learning.model import ModelKind
    from mnemo_sidecar.learning.trainer import Trainer

    engine = _learning_engine(tiny_model, tmp_path)
    kind_dir = tmp_path / "models" / "t" / ModelKind.CROSS_ENCODER.value
    stages: list[str] = []
    with pytest.raises(FinetuneStopped):
        Trainer(engine).train(
            "t",
            {ModelKind.CROSS_ENCODER, ModelKind.RANKER},
            force=False,
            progress=lambda _k, stage, _f, _m: stages.append(stage),
            should_stop=lambda: "fine-tuning" in stages,  # once the fine-tune has begun
        )
    assert "fine-tuning" in stages
    assert not kind_dir.exists() or not any(kind_dir.iterdir())
    assert engine.registry.pointer("t", ModelKind.CROSS_ENCODER) is None


def test_a_cross_encoder_promoted_by_a_training_process_is_served_here_and_after_a_restart(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The training process promotes on disk; this process, and a restarted one, load the
    promoted version from the registry (where the model sits in the version's `model`
    directory) and serve it, not the configured one."""
    from mnemo_sidecar.engine import RankingEngine
    from mnemo_sidecar.learning.model import ModelKind
    from mnemo_sidecar.learning.runner import TrainingRunner

    engine = _learning_engine(tiny_model, tmp_path)
    run, _ = TrainingRunner(engine).start("t", {ModelKind.CROSS_ENCODER}, force=False)
    assert run.done.wait(300) and run.error is None and not run.failure, run.failure
    [outcome] = [e.outcome for e in run.events if e.outcome]
    assert outcome.promoted
    model_dir = (
        tmp_path / "models" / "t" / ModelKind.CROSS_ENCODER.value / outcome.candidate_version / "model"
    )

    def served_by(e: RankingEngine) -> Path:
        ce, source = e.cross_encoder("t")
        assert ce is not None and source.startswith("fine-tuned from"), source
        assert e.registry.broken("t", ModelKind.CROSS_ENCODER) == ""
        # Named in status and Rerank as its outcome and directory name it (it was the hash
        # of its files, which nothing else names), with its promote time.
        version, promoted_ns = e.cross_encoder_name("t", ce)
        assert version == outcome.candidate_version and promoted_ns > 0
        configured = e.base_cross_encoder()
        assert configured is not None and e.cross_encoder_name("t", configured) == (configured.version, 0)
        return ce.model_dir

    assert served_by(engine) == model_dir
    restarted = _engine_over(engine.cfg, tmp_path)
    restarted.warm_up()
    assert served_by(restarted) == model_dir
    # Its export sits in its version, pruned with it; the shared cache holds the configured
    # model's alone once a start-up has pruned what an older sidecar or a cut export left
    # (probe: every fine-tune, kept or not, left ~144 MB there).
    ce, _ = restarted.cross_encoder("t")
    assert ce is not None and ce.export_dir.parent == model_dir.parent / "onnx"
    (restarted.onnx_cache / "ce-0123456789abcdef").mkdir()
    (restarted.onnx_cache / "ce-0123456789abcdef.tmp-1-2").mkdir()
    configured = restarted.base_cross_encoder()
    assert configured is not None
    assert len(restarted.prune_onnx_cache()) == 2
    assert list(restarted.onnx_cache.iterdir()) == [configured.export_dir]


def test_a_fine_tune_judged_alone_is_judged_on_the_newest_held_back_sessions_up_to_the_cap(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Alone it scores every candidate of every session it is judged on (~0.4 s a session
    for MiniLM here): at the store's cap, all held-back sessions would take an hour."""
    from mnemo_sidecar.learning.pair_store import split_heldout
    from mnemo_sidecar.learning.trainer import baseline_ndcg

    engine = _learning_engine(tiny_model, tmp_path, feature_max_ms=1e-6, judge_max_sessions=2)
    _, held = split_heldout(
        engine.store.sessions("t"), engine.cfg.training.heldout_fraction, engine.cfg.training.min_heldout
    )
    assert len(held) == 8  # min_heldout
    ce_out, ranker_out = _train_both(engine)
    assert ce_out.heldout_sessions == 2 and ce_out.baseline_ndcg == pytest.approx(baseline_ndcg(held[-2:]))
    assert ranker_out.heldout_sessions == 8  # the ranker's judgement is cheap: all of them


def test_fold_models_are_kept_in_the_sidecars_training_scratch_while_they_score(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Not in the system's temp, where a training process killed mid-run would leave them:
    the sidecar clears its scratch when it starts (test_sidecar_models)."""
    from mnemo_sidecar.learning.model import ModelKind
    from mnemo_sidecar.learning.trainer import Trainer

    engine = _learning_engine(tiny_model, tmp_path)
    scratch = engine.cfg.training_scratch
    during: list[set[str]] = []

    def progress(_kind: object, stage: str, _f: float, message: str) -> None:
        if stage == "cross-fitting" and "epoch" in message:
            during.append({p.name[: len("ce-fold-")] for p in scratch.iterdir()})

    Trainer(engine).train(
        "t", {ModelKind.CROSS_ENCODER}, force=False, progress=progress, should_stop=lambda: False
    )
    assert during and all(names == {"ce-fold-"} for names in during)
    assert scratch.is_dir() and not list(scratch.iterdir())  # each removed once it scored


def test_background_runs_fine_tune_again_only_once_the_sessions_have_doubled(
    tiny_model: Path, tmp_path: Path
) -> None:
    """A background run fine-tunes the cross-encoder the first time, then only once as many
    sessions have arrived as were stored at the last fine-tune (`finetune_growth` 2); the
    ranker trains in every run, and a Train call fine-tunes whenever it asks."""
    from mnemo_sidecar.learning.model import ModelKind, SessionMark
    from mnemo_sidecar.learning.runner import TrainingRunner
    from tests.unit.test_sidecar_learning import synthetic_session

    engine = _learning_engine(tiny_model, tmp_path)  # 24 sessions
    store = engine.store
    runner = TrainingRunner(engine)
    rng = random.Random(6)
    both = {ModelKind.CROSS_ENCODER, ModelKind.RANKER}

    def background() -> list[ModelKind]:
        """Which models one background run (start_background) trained."""
        before = len(store.outcomes("t", limit=100))
        assert runner.start_background("t")
        while runner.running("t"):
            time.sleep(0.05)
        after = store.outcomes("t", limit=100)  # newest first
        return [o.model for o in after[: len(after) - before]]

    def add(first: int, last: int) -> None:
        for s in (synthetic_session(i, rng, n=8) for i in range(first, last)):
            store.add_session("t", s, None, None, None)

    assert sorted(background()) == sorted(both)
    assert store.last_fine_tune("t") == SessionMark(24, 24)
    add(24, 47)  # 23 arrived: one short of the 24 stored at the fine-tune
    run, started = runner.start("t", both, force=False, scheduled=True)
    assert started and list(run.follow())
    skipped = [e for e in run.events if e.stage == "skipped"]
    assert [(e.model, e.message) for e in skipped] == [
        (
            ModelKind.CROSS_ENCODER,
            "not due: fine-tuned when 24 sessions were stored; the next after 1 more",
        )
    ]
    assert [e.outcome.model for e in run.events if e.outcome] == [ModelKind.RANKER]
    assert store.last_fine_tune("t") == SessionMark(24, 24)
    add(47, 48)
    assert sorted(background()) == sorted(both)
    assert store.last_fine_tune("t") == SessionMark(48, 48)
    # Not due again, but a Train call (not scheduled) asked for it.
    add(48, 50)
    run, _ = runner.start("t", both, force=False)
    list(run.follow())
    assert sorted(e.outcome.model for e in run.events if e.outcome) == sorted(both)
    assert store.last_fine_tune("t") == SessionMark(50, 50)


def test_a_sidecar_keeps_the_bound_of_fine_tunes_in_memory_and_loads_a_dropped_one_without_waiting(
    tiny_model: Path, tmp_path: Path, start_sidecar: Any
) -> None:
    """Real sidecar on a real port: three tenants' promoted fine-tunes on disk and room for
    two. The two newest are loaded before it serves; the third tenant's first Rerank is
    answered by the embedding blend while its fine-tune loads in the background, and once
    loaded it serves, the least recently served one dropped in its place."""
    import grpc

    from mnemo.ranking.v1 import ranking_service_pb2 as rpb
    from mnemo.ranking.v1 import ranking_service_pb2_grpc as rpb_grpc
    from mnemo_sidecar.engine import RankingEngine
    from mnemo_sidecar.learning.model import ModelKind
    from mnemo_sidecar.learning.registry import ModelRegistry

    data = tmp_path / "side"
    on_disk = ModelRegistry(data / "models")  # what training processes left
    for tenant in "abc":
        version, directory = on_disk.new_version(tenant, ModelKind.CROSS_ENCODER)
        shutil.copytree(tiny_model, RankingEngine.fine_tuned_model_dir(directory))
        on_disk.promote(tenant, ModelKind.CROSS_ENCODER, version, None, f"fine-tuned for {tenant}")
    side = start_sidecar(data_dir=data, cross_encoder={"max_resident": 2})
    stub = rpb_grpc.RankingServiceStub(grpc.insecure_channel(f"127.0.0.1:{side.port}"))

    def status(tenant: str) -> rpb.GetModelStatusResponse:
        response: rpb.GetModelStatusResponse = stub.GetModelStatus(
            rpb.GetModelStatusRequest(tenant_id=tenant), timeout=10
        )
        return response

    def rerank(tenant: str) -> rpb.RerankResponse:
        candidates = [
            rpb.Candidate(id=f"m{i}", text=f"note {i}", baseline_score=1 - i / 10) for i in range(4)
        ]
        response: rpb.RerankResponse = stub.Rerank(
            rpb.RerankRequest(tenant_id=tenant, query="which note", candidates=candidates), timeout=10
        )
        return response

    for tenant in "bc":
        assert (
            status(tenant).cross_encoder.ready
            and status(tenant).cross_encoder.source == f"fine-tuned for {tenant}"
        )
    dropped = status("a")
    assert not dropped.cross_encoder.ready and "is not in memory" in dropped.note, dropped.note
    resident = dropped.resident_cross_encoders
    assert (resident.in_memory, resident.max_resident, resident.loads, resident.drops) == (2, 2, 2, 0)
    assert not status("a").cross_encoder.ready  # a status call loads nothing
    assert rerank("a").method == rpb.RERANK_METHOD_EMBEDDING_BLEND  # answered while it loads
    deadline = time.monotonic() + 60
    while (served := rerank("a")).method != rpb.RERANK_METHOD_CROSS_ENCODER and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.method == rpb.RERANK_METHOD_CROSS_ENCODER and len(served.scores) == 4
    assert status("a").cross_encoder.source == "fine-tuned for a"
    # b, loaded before c at start-up (older promotion), was the least recently served.
    assert not status("b").cross_encoder.ready and status("c").cross_encoder.ready
    resident = status("c").resident_cross_encoders
    assert (resident.in_memory, resident.loads, resident.drops) == (2, 3, 1)


def test_bench_residency_measures_a_sidecar_holding_more_fine_tunes_than_it_keeps(
    tiny_model: Path, tmp_path: Path, model_cache: Path
) -> None:
    """Three tenants' fine-tunes, room for two, Reranks on each in turn: the first call (the
    oldest promotion, not loaded at start-up) and every later one that finds its tenant's
    fine-tune dropped are answered by the blend, the others by the fine-tune; none fails."""
    from mnemo_sidecar.cli import cli

    out = tmp_path / "residency.json"
    result = CliRunner().invoke(
        cli,
        [
            *("bench-residency", "--model", str(tiny_model), "--tenants", "3", "--max-resident", "2"),
            *("--seconds", "3", "--json-out", str(out)),
        ],
        env={"MNEMO_SIDECAR_INFERENCE__EMBEDDER_CACHE_DIR": str(model_cache)},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert (figures["tenants"], figures["max_resident"], figures["precision"]) == (3, 2, "int8")
    calls = figures["reranks"]
    assert calls["failures"] == {} and calls["count"] == sum(calls["by"].values()) > 3
    assert calls["by"]["cross_encoder"] > 0 and calls["by"]["embedding_blend"] > 0
    assert 0 < calls["p50_ms"] <= calls["p99_ms"] <= calls["max_ms"]
    rss = figures["rss_mb"]
    assert 0 < rss["after_start"] <= rss["peak"] and rss["end"] <= rss["peak"]
    assert "by the fine-tune" in result.output and "RSS MB: after start" in result.output
