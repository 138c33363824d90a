"""A fingerprint of an embedding model's files: the store records it beside the model's name,
so that another model under the same name (embedding.model_path pointed elsewhere, the
weights replaced) is refused until re-embedded. The name alone let a different model's
queries be served against the old model's vectors.

It covers what makes the vectors: the weights (*.safetensors, *.bin) and the tokenizer.
SHA-256 of the bundled MiniLM's 87 MiB of weights takes ~70 ms here with the file in the page
cache, ~0.15 s more when read from disk; every start paying that is avoided by keeping each
file's digest in the model cache beside its size, mtime, ctime and inode. A change of the
file's content changes them (ctime cannot be set back by a user), so a start pays a stat
per file, and the digest is taken again whenever one of them differs.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

# The files of a sentence-transformers directory whose content decides the vectors.
_CONTENT_FILES = ("*.safetensors", "*.bin", "tokenizer.json")


def model_fingerprint(model_dir: Path, memo_dir: Path) -> str:
    """A digest of the model directory's weight and tokenizer files, names and contents.
    memo_dir: where each file's digest is kept between starts."""
    files = sorted({f for pattern in _CONTENT_FILES for f in model_dir.glob(pattern) if f.is_file()})
    combined = hashlib.sha256()
    for f in files:
        combined.update(f"{f.name}\0{_file_digest(f, memo_dir)}\n".encode())
    return combined.hexdigest()[:32]


def _file_digest(path: Path, memo_dir: Path) -> str:
    """The SHA-256 of a file's bytes, from the memo while the file's stat says it is the
    same file with the same content."""
    st = path.stat()  # before the read: a write during it changes the stat the memo keeps
    seen = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
    memo = memo_dir / f"digest-{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]}.json"
    kept = _kept_digest(memo, seen)
    if kept is not None:
        return kept
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    _keep(memo, {"stat": seen, "sha256": digest})
    return digest


def _kept_digest(memo: Path, seen: list[int]) -> str | None:
    """The digest the memo keeps for a file of this stat; None when there is no memo, it
    does not read, or the file changed since (its digest is then taken again)."""
    try:
        kept = json.loads(memo.read_text(encoding="utf-8"))
        return str(kept["sha256"]) if kept["stat"] == seen else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _keep(memo: Path, entry: dict[str, object]) -> None:
    """Written whole and renamed into place (servers sharing a model cache may write the same
    memo at once); one that cannot be written costs the next start the read again."""
    staged = memo.with_name(f".{memo.name}.{uuid.uuid4().hex}.tmp")
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        staged.write_text(json.dumps(entry), encoding="utf-8")
        staged.replace(memo)
    except OSError:
        staged.unlink(missing_ok=True)
