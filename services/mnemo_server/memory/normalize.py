"""Content normalisation and hashing (Signet's rules) and category sanitising (InitRunner's)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_WS = re.compile(r"\s+")
_TRAILING_PUNCT = re.compile(r"[.,!?;:]+$")
_CATEGORY_BAD = re.compile(r"[^a-z0-9_]")


@dataclass(frozen=True)
class NormalizedContent:
    storage: str  # trimmed, whitespace collapsed, casing kept: what is stored
    normalized: str  # lower-cased, trailing punctuation stripped: the hash basis
    hash: str  # SHA-256 hex of the basis: the deduplication key


def normalize_content(raw: str) -> NormalizedContent:
    storage = _WS.sub(" ", raw).strip()
    normalized = _TRAILING_PUNCT.sub("", storage.lower())
    basis = normalized if normalized else storage.lower()
    return NormalizedContent(storage, normalized, hashlib.sha256(basis.encode("utf-8")).hexdigest())


def sanitize_category(raw: str) -> str:
    """Lower-case; anything outside [a-z0-9_] becomes "_". Empty means "general"."""
    cat = _CATEGORY_BAD.sub("_", raw.strip().lower())
    return cat or "general"
