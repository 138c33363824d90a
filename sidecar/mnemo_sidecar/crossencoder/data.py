"""Training and validation data for the cross-encoder.

Public rerank rows are JSONL objects ``{"source", "query", "positive", "negatives", "group"}``
(see SOURCES.md next to the files). They are read from wherever they live — never copied
into the repository. The pipeline is: load → split by group (hash-based, leak-free) → cap
each source's share of the training side → turn rows into labelled (query, passage, label)
pairs. In-domain feedback arrives as plain (query, passage, label) triples and goes
through ``labelled_pairs`` into the same trainer."""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnemo_server.jsonl import json_lines

DEFAULT_PER_SOURCE_CAP = 400
DEFAULT_VALIDATION_FRACTION = 0.1

# Attribution for the public pair sources, as recorded in /work/shared/rerank/SOURCES.md.
# Kept in code because a trained model must carry it even when SOURCES.md is not at hand.
SOURCE_ATTRIBUTION: dict[str, dict[str, str]] = {
    "xquad_en_para": {
        "repo": "google-deepmind/xquad@7d30520c717524000f0d9d2f9c10a069acd9d285",
        "licence": "CC BY-SA 4.0 (SQuAD v1.1 dev paragraphs)",
    },
    "qnli_dev_sent": {
        "repo": "jonny-vr/LLMCBench@720be179c2492271f61d7a09291ffd003f36f47d (GLUE QNLI dev)",
        "licence": "MIT (repo code); QNLI derives from SQuAD v1.1, CC BY-SA 4.0",
    },
    "selqa_sent": {
        "repo": "emorynlp/selqa@fef3d6ac6944e2d4237165d90e5f859c71676bdd",
        "licence": "Apache-2.0",
    },
    "pubmedqa_abstract": {
        "repo": "pubmedqa/pubmedqa@1cbae8e92f72f20c8d3747cbb3bf5bc53554d997",
        "licence": "MIT",
    },
    "covidqa_chunk": {
        "repo": "deepset-ai/COVID-QA@fb2eb5e249618457e5359806601086c635c8eb8f",
        "licence": "Apache-2.0 (CORD-19 papers under their own licences)",
    },
    "covidfaq_en": {
        "repo": "deepset-ai/COVID-QA@fb2eb5e249618457e5359806601086c635c8eb8f",
        "licence": "Apache-2.0 (answers from CDC, WHO and other public-health sites)",
    },
    "dstc11_val_dialog": {
        "repo": "alexa/dstc11-track5@1419e96d613870703399309c46c7e33cba558199",
        "licence": "CDLA-Sharing-1.0",
    },
    "dstc10_val_spoken": {
        "repo": "alexa/alexa-with-dstc10-track2-dataset@4882acc6226d8d0826508a240a4a6bd66e651c12",
        "licence": "Apache-2.0",
    },
    "dstc9_faq": {
        "repo": "alexa/alexa-with-dstc9-track1-dataset@7ebb4c767b64826c1ac0f8bae409c0fab9cc0ae4",
        "licence": "Apache-2.0",
    },
}


@dataclass(frozen=True)
class RerankRow:
    """One query with one relevant passage and its (hard) negatives."""

    source: str
    query: str
    positive: str
    negatives: tuple[str, ...]
    group: str


@dataclass(frozen=True)
class LabelledPair:
    query: str
    passage: str
    label: float  # 1.0 relevant, 0.0 not (values in between are allowed as soft labels)
    source: str = ""


@dataclass(frozen=True)
class Split:
    train: list[RerankRow]
    validation: list[RerankRow]
    dropped_for_overlap: int  # training rows whose query or positive also occurs in validation


def _jsonl_files(paths: Path | Sequence[Path]) -> list[Path]:
    if isinstance(paths, Path):
        if paths.is_dir():
            return sorted(paths.glob("*.jsonl"))
        return [paths]
    return [Path(p) for p in paths]


class PairsError(ValueError):
    """Pairs files that cannot be read as such, said in one line naming the file and line."""


def load_rows(paths: Path | Sequence[Path]) -> list[RerankRow]:
    """Rows from a directory of ``*.jsonl`` files (sorted by name) or an explicit file list.
    Rows without a query or positive are skipped; negatives equal to the positive are dropped.
    PairsError if there is no file, or a line is not a JSON object."""
    files = _jsonl_files(paths)
    if not files:
        raise PairsError(f"no .jsonl files in {paths}")
    return [row for file in files for row in _rows_of(file)]


def _rows_of(file: Path) -> Iterator[RerankRow]:
    for lineno, obj in json_lines(file, PairsError):
        if not isinstance(obj, dict) or not isinstance(obj.get("negatives") or [], list):
            raise PairsError(f"{file}:{lineno}: expected an object with a list of negatives")
        query = str(obj.get("query") or "").strip()
        positive = str(obj.get("positive") or "").strip()
        if not query or not positive:
            continue
        negatives = tuple(
            n for n in (str(x).strip() for x in obj.get("negatives") or []) if n and n != positive
        )
        source = str(obj.get("source") or file.stem)
        yield RerankRow(source, query, positive, negatives, str(obj.get("group") or query))


def _unit_hash(text: str) -> float:
    """A stable number in [0, 1) for a string (independent of PYTHONHASHSEED)."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


def split_by_group(
    rows: Sequence[RerankRow],
    *,
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION,
    salt: str = "mnemo-rerank-split-v1",
    min_groups_for_guarantee: int = 4,
) -> Split:
    """Hold out whole groups (article, entity, document), chosen by a hash of (source, group),
    so no passage set is on both sides. The split does not depend on the training seed, so
    models trained with different seeds are compared on the same rows.

    A source with few groups (covidfaq has 5 publishers) may draw none by hash alone; if it
    has at least ``min_groups_for_guarantee`` groups its lowest-hash group is held out, so
    every source gets a validation figure.

    Some sources share text (QNLI and XQuAD both come from SQuAD dev): training rows whose
    query or positive appears anywhere in validation are dropped."""
    groups_by_source: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        groups_by_source[row.source].add(row.group)
    held_out: set[tuple[str, str]] = set()
    for source, groups in groups_by_source.items():
        hashes = {g: _unit_hash(f"{salt}\0{source}\0{g}") for g in groups}
        chosen = {g for g, h in hashes.items() if h < validation_fraction}
        if not chosen and len(groups) >= min_groups_for_guarantee:
            chosen = {min(hashes, key=lambda g: (hashes[g], g))}
        held_out.update((source, g) for g in chosen)

    validation = [r for r in rows if (r.source, r.group) in held_out]
    seen = {_normalise(r.query) for r in validation} | {_normalise(r.positive) for r in validation}
    train: list[RerankRow] = []
    dropped = 0
    for r in rows:
        if (r.source, r.group) in held_out:
            continue
        if _normalise(r.query) in seen or _normalise(r.positive) in seen:
            dropped += 1
            continue
        train.append(r)
    return Split(train=train, validation=validation, dropped_for_overlap=dropped)


def cap_per_source(
    rows: Sequence[RerankRow],
    *,
    max_queries: int = DEFAULT_PER_SOURCE_CAP,
    rows_per_query: int | None = 1,
    seed: int = 0,
) -> list[RerankRow]:
    """At most ``max_queries`` distinct queries per source, sampled deterministically by seed
    (templated FAQs are ~half of all rows and would otherwise dominate). A query with several
    gold passages (dialogue turns) keeps ``rows_per_query`` of them (None keeps all), so the
    cap bounds a source's share of the pairs, not just of the queries. Output order is
    deterministic: sources by name, then sampled order."""
    by_source: dict[str, dict[str, list[RerankRow]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        by_source[row.source][row.query].append(row)
    out: list[RerankRow] = []
    for source in sorted(by_source):
        queries = by_source[source]
        rng = random.Random(f"{seed}\0{source}")
        keys = sorted(queries)
        rng.shuffle(keys)
        for key in keys[:max_queries]:
            candidates = sorted(queries[key], key=lambda r: (r.positive, r.group))
            if rows_per_query is not None and len(candidates) > rows_per_query:
                candidates = rng.sample(candidates, rows_per_query)
            out.extend(candidates)
    return out


def to_pairs(rows: Sequence[RerankRow], *, negatives: int = 2, seed: int = 0) -> list[LabelledPair]:
    """Each row → its positive (label 1) and up to ``negatives`` of its negatives (label 0),
    drawn by seed so hard and random negatives mix as in the source files."""
    rng = random.Random(seed)
    pairs: list[LabelledPair] = []
    for row in rows:
        pairs.append(LabelledPair(row.query, row.positive, 1.0, row.source))
        picked = (
            list(row.negatives) if len(row.negatives) <= negatives else rng.sample(row.negatives, negatives)
        )
        pairs.extend(LabelledPair(row.query, n, 0.0, row.source) for n in picked)
    return pairs


def limit_pairs(pairs: Sequence[LabelledPair], max_pairs: int, *, seed: int = 0) -> list[LabelledPair]:
    """At most ``max_pairs`` pairs, keeping each query's pairs together (a positive without its
    negatives teaches little) and every source's share roughly as it was."""
    if len(pairs) <= max_pairs:
        return list(pairs)
    by_query: dict[tuple[str, str], list[LabelledPair]] = defaultdict(list)
    for p in pairs:
        by_query[(p.source, p.query)].append(p)
    keys = sorted(by_query)
    random.Random(seed).shuffle(keys)
    out: list[LabelledPair] = []
    for key in keys:
        block = by_query[key]
        if len(out) + len(block) > max_pairs:
            continue
        out.extend(block)
    return out


def labelled_pairs(
    items: Iterable[tuple[str, str, float]], *, source: str = "feedback"
) -> list[LabelledPair]:
    """In-domain pairs given as (query, passage, label) triples, e.g. from session feedback.
    Labels must lie in [0, 1]; pairs with an empty side are skipped."""
    out: list[LabelledPair] = []
    for query, passage, label in items:
        value = float(label)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"label must be within [0, 1], got {label!r}")
        q, p = query.strip(), passage.strip()
        if q and p:
            out.append(LabelledPair(q, p, value, source))
    return out


def load_labelled_pairs(path: Path, *, source: str = "feedback") -> list[LabelledPair]:
    """In-domain pairs from a JSONL file of ``{"query", "passage", "label"}`` objects."""
    triples: list[tuple[str, str, float]] = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                obj = json.loads(line)
                triples.append((str(obj["query"]), str(obj["passage"]), float(obj["label"])))
    return labelled_pairs(triples, source=source)


def summarise_pairs(pairs: Sequence[LabelledPair]) -> dict[str, Any]:
    """Counts for the model card: pairs, positives, queries, and per-source pair counts."""
    return {
        "pairs": len(pairs),
        "positives": sum(1 for p in pairs if p.label >= 0.5),
        "queries": len({(p.source, p.query) for p in pairs}),
        "per_source": dict(sorted(Counter(p.source for p in pairs).items())),
    }


def attribution_for(sources: Iterable[str]) -> list[dict[str, str]]:
    """SOURCES.md attribution entries for the public sources among ``sources``."""
    return [{"source": s, **SOURCE_ATTRIBUTION[s]} for s in sorted(set(sources)) if s in SOURCE_ATTRIBUTION]
