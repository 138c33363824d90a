"""``mnemo-sidecar finetune-cross-encoder``: the general fine-tune on the public rerank pairs.

Splits the rows by group, caps each source's share, trains, exports ONNX (fp32 and int8)
and reports validation MRR@10 / NDCG@10 before and after — "before" being the bundled MiniLM
used as a bi-encoder (cosine), since an untrained cross-encoder head ranks at random — plus
training throughput and rerank latency for 20 and 50 candidates."""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from mnemo_sidecar.crossencoder.data import (
    DEFAULT_PER_SOURCE_CAP,
    DEFAULT_VALIDATION_FRACTION,
    PairsError,
    RerankRow,
    Split,
    cap_per_source,
    limit_pairs,
    load_rows,
    split_by_group,
    summarise_pairs,
    to_pairs,
)
from mnemo_sidecar.crossencoder.evaluate import EvaluationReport, bi_encoder_scorer, compare, evaluate
from mnemo_sidecar.crossencoder.finetune import (
    bundled_base,
    check_replaceable,
    configure_torch,
    finetune,
    update_card,
)
from mnemo_sidecar.crossencoder.runtime import CrossEncoderRuntime

LATENCY_SIZES = (20, 50)


def measure_latency(
    runtime: CrossEncoderRuntime, rows: list[RerankRow], sizes: tuple[int, ...], runs: int, seed: int
) -> dict[str, float]:
    """Median milliseconds of score(query, n candidates) over ``runs`` calls after a warm-up,
    plus the mean tokens per pair. Candidates are drawn from the validation passages; the same
    draws (same seed) are used for every precision."""
    rng = random.Random(seed)
    passages = sorted({t for r in rows for t in (r.positive, *r.negatives)})
    queries = sorted({r.query for r in rows})
    out: dict[str, float] = {}
    for n in sizes:
        draws = [(rng.choice(queries), rng.sample(passages, min(n, len(passages)))) for _ in range(runs + 2)]
        timings = []
        for i, (query, texts) in enumerate(draws):
            started = time.perf_counter()
            runtime.score(query, texts)
            if i >= 2:  # the first calls pay for allocator and thread-pool warm-up
                timings.append(1000 * (time.perf_counter() - started))
        out[str(n)] = round(statistics.median(timings), 1)
        lengths = [c for query, texts in draws for c in runtime.token_counts([(query, t) for t in texts])]
        out[f"{n}_mean_tokens"] = round(statistics.fmean(lengths), 1)
    return out


def _metrics_table(columns: dict[str, EvaluationReport]) -> Table:
    table = Table(title="Validation: rank of the positive among positive + negatives (@10)")
    table.add_column("source", no_wrap=True)
    table.add_column("queries", justify="right")
    for name in columns:
        table.add_column(f"{name}\nMRR", justify="right")
        table.add_column(f"{name}\nNDCG", justify="right")
    first = next(iter(columns.values()))
    for source in [*first.per_source, "macro", "overall"]:
        cells = []
        for report in columns.values():
            m = report.per_source.get(source) or (report.macro if source == "macro" else report.overall)
            cells += [f"{m.mrr_at_10:.3f}", f"{m.ndcg_at_10:.3f}"]
        count = (first.per_source.get(source) or first.overall).queries
        table.add_row(
            source, str(count), *cells, end_section=source == "macro" or source == list(first.per_source)[-1]
        )
    return table


def _cost_table(latency: dict[str, dict[str, float]], pairs_per_second: dict[str, float]) -> Table:
    table = Table(title="Rerank cost (onnxruntime, --serve-threads threads)")
    table.add_column("figure")
    table.add_column("fp32", justify="right")
    table.add_column("int8", justify="right")
    for n in LATENCY_SIZES:
        table.add_row(
            f"rerank {n} candidates, median ms", str(latency["fp32"][str(n)]), str(latency["int8"][str(n)])
        )
    table.add_row(
        "scoring pairs/s (50 candidates)", str(pairs_per_second["fp32"]), str(pairs_per_second["int8"])
    )
    return table


def _refuse_unusable(
    pairs_dir: Path, out_dir: Path, split: Split, pairs: Sequence[object], validation: Sequence[RerankRow]
) -> None:
    """Said before a model loads: each of these failed with a traceback, one after the run."""
    try:
        check_replaceable(out_dir)
    except FileExistsError as exc:
        raise click.ClickException(str(exc)) from None
    if not pairs:
        raise click.ClickException(
            f"{pairs_dir}: no training pairs are left once {len(split.validation)} rows are held out for "
            f"validation and {split.dropped_for_overlap} dropped for text they share with it; "
            "give more rows (or groups), or a smaller --validation-fraction"
        )
    if not validation:
        raise click.ClickException(
            f"{pairs_dir}: no rows are held out for validation; give rows of more groups"
        )
    if not any(r.negatives for r in validation):
        raise click.ClickException(
            f"{pairs_dir}: no validation row has a negative to rank its positive against; "
            "the rows need negatives to measure the model"
        )


@click.command("finetune-cross-encoder")
@click.option(
    "--pairs",
    "pairs_dir",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="Directory of rerank *.jsonl files (read in place, never copied).",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the Hugging Face-format model is written (replaced atomically).",
)
@click.option(
    "--base",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Sentence-transformers model or cross-encoder to start from [default: bundled MiniLM].",
)
@click.option(
    "--per-source-cap",
    type=click.IntRange(min=1),
    default=DEFAULT_PER_SOURCE_CAP,
    show_default=True,
    help="Training queries per source.",
)
@click.option(
    "--negatives", type=click.IntRange(min=0), default=2, show_default=True, help="Negatives per positive."
)
@click.option("--epochs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--lr", default=5e-5, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option(
    "--max-length",
    type=click.IntRange(min=8),
    default=160,
    show_default=True,
    help="Tokens per (query, passage) pair.",
)
@click.option("--pos-weight", default=1.0, show_default=True, help="BCE weight of positive pairs.")
@click.option(
    "--precision",
    type=click.Choice(["fp32", "int8"]),
    default="fp32",
    show_default=True,
    help="ONNX precision recorded in the card for serving (both are exported and measured).",
)
@click.option("--max-pairs", type=click.IntRange(min=1), default=None, help="Upper bound on training pairs.")
@click.option(
    "--max-minutes",
    type=click.FloatRange(min=0.0, min_open=True),
    default=None,
    help="Time budget of the training steps: the run is cut to the steps its pace fits.",
)
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--validation-fraction",
    type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
    default=DEFAULT_VALIDATION_FRACTION,
    show_default=True,
    help="Share of groups held out.",
)
@click.option(
    "--validation-cap",
    type=click.IntRange(min=1),
    default=150,
    show_default=True,
    help="Validation queries per source.",
)
@click.option(
    "--threads", type=click.IntRange(min=1), default=2, show_default=True, help="torch threads for training."
)
@click.option(
    "--serve-threads",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="onnxruntime threads for the latency figures (what the sidecar would use).",
)
@click.option(
    "--onnx-cache",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="ONNX export cache [default: OUT/onnx].",
)
@click.option(
    "--latency-runs",
    type=click.IntRange(min=1),
    default=9,
    show_default=True,
    help="Timed calls per latency figure.",
)
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def finetune_cross_encoder(
    pairs_dir: Path,
    out_dir: Path,
    base: Path | None,
    per_source_cap: int,
    negatives: int,
    epochs: int,
    lr: float,
    batch_size: int,
    max_length: int,
    pos_weight: float,
    precision: str,
    max_pairs: int | None,
    max_minutes: float | None,
    seed: int,
    validation_fraction: float,
    validation_cap: int,
    threads: int,
    serve_threads: int,
    onnx_cache: Path | None,
    latency_runs: int,
    json_out: Path | None,
) -> None:
    """Fine-tune a cross-encoder on public rerank pairs and report its quality and cost."""
    console = Console()
    if not console.is_terminal:  # a log file: do not squeeze the tables into 80 columns
        console = Console(width=150)
    try:  # read before torch and the model are loaded: a bad file is said at once
        rows = load_rows(pairs_dir)
    except PairsError as exc:
        raise click.ClickException(str(exc)) from None
    if not rows:
        raise click.ClickException(f"{pairs_dir}: no rows with a query and a positive to train on")
    split = split_by_group(rows, validation_fraction=validation_fraction)
    train_rows = cap_per_source(split.train, max_queries=per_source_cap, seed=seed)
    validation = cap_per_source(split.validation, max_queries=validation_cap, rows_per_query=None, seed=seed)
    pairs = to_pairs(train_rows, negatives=negatives, seed=seed)
    if max_pairs is not None:
        pairs = limit_pairs(pairs, max_pairs, seed=seed)
    _refuse_unusable(pairs_dir, out_dir, split, pairs, validation)
    configure_torch(threads)
    base = base or bundled_base()
    console.print(
        f"{len(rows)} rows → {len(split.train)} train / {len(split.validation)} validation rows "
        f"({split.dropped_for_overlap} train rows dropped for text shared with validation); "
        f"training on {len(pairs)} pairs from {len({(p.source, p.query) for p in pairs})} queries, "
        f"validating on {len(validation)} rows"
    )

    with console.status("bi-encoder baseline (cosine) on the validation rows…"):
        baseline = evaluate(validation, bi_encoder_scorer(bundled_base()))

    with Progress(
        TextColumn("[bold]fine-tune[/] {task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("loading", total=1.0)
        report = finetune(
            base,
            pairs,
            out_dir,
            epochs=epochs,
            lr=lr,
            batch_size=batch_size,
            max_length=max_length,
            pos_weight=pos_weight,
            seed=seed,
            max_seconds=max_minutes * 60.0 if max_minutes is not None else None,
            validation=validation,
            threads=threads,
            progress=lambda done, message: bar.update(task, completed=done, description=message),
        )
    assert report.validation is not None  # validation rows were given

    cache = onnx_cache or out_dir / "onnx"
    latency: dict[str, dict[str, float]] = {}
    results: dict[str, EvaluationReport] = {"bi-encoder": baseline, "CE fp32": report.validation}
    load_average = os.getloadavg()[0]  # other work on the machine inflates the timings
    with console.status("exporting ONNX, measuring int8 quality and rerank latency…"):
        for prec in ("fp32", "int8"):
            runtime = CrossEncoderRuntime(out_dir, cache, precision=prec, intra_op_threads=serve_threads)
            latency[prec] = measure_latency(runtime, validation, LATENCY_SIZES, latency_runs, seed)
            if prec == "int8":
                results["CE int8"] = evaluate(validation, runtime.score_pairs)

    summary: dict[str, Any] = {
        "command": {
            "pairs": str(pairs_dir),
            "out": str(out_dir),
            "base": str(base),
            "per_source_cap": per_source_cap,
            "negatives": negatives,
            "epochs": epochs,
            "lr": lr,
            "batch_size": batch_size,
            "max_length": max_length,
            "pos_weight": pos_weight,
            "precision": precision,
            "max_pairs": max_pairs,
            "max_minutes": max_minutes,
            "seed": seed,
            "validation_fraction": validation_fraction,
            "validation_cap": validation_cap,
            "threads": threads,
            "serve_threads": serve_threads,
        },
        "data": {
            "rows": len(rows),
            "train_rows": len(split.train),
            "validation_rows_total": len(split.validation),
            "dropped_for_overlap": split.dropped_for_overlap,
            "validation_rows_used": len(validation),
            "training_pairs": summarise_pairs(pairs),
        },
        "validation": {name: r.to_dict() for name, r in results.items()},
        "delta_vs_bi_encoder": compare(baseline, report.validation),
        "training": {
            "seconds": round(report.seconds, 1),
            "steps": report.steps,
            "planned_steps": report.planned_steps,
            "pairs_per_second": round(report.pairs_per_second, 2),
            "final_loss": round(report.final_loss, 4),
        },
        "rerank_latency_ms": latency,
        "load_average_during_latency": load_average,
        "scoring_pairs_per_second": {p: round(50 / (ms["50"] / 1000), 1) for p, ms in latency.items()},
        "onnx_export": str(runtime.export_dir),
        "model_version": runtime.version,
    }
    update_card(
        out_dir,
        serving={"precision": precision},
        evaluation={k: summary[k] for k in ("validation", "rerank_latency_ms", "scoring_pairs_per_second")},
    )

    console.print(_metrics_table(results))
    console.print(_cost_table(latency, summary["scoring_pairs_per_second"]))
    console.print(
        f"candidates average {latency['fp32']['50_mean_tokens']} tokens per pair; "
        f"1-min load average when timing began: {load_average:.2f}"
    )
    console.print(
        f"training: {report.pairs} pairs × {epochs} epoch(s), {report.steps} of {report.planned_steps} steps "
        f"in {report.seconds / 60:.1f} min "
        f"({report.pairs_per_second:.1f} pairs/s, final loss {report.final_loss:.4f}) → {out_dir}"
    )
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        console.print(f"figures written to {json_out}")
