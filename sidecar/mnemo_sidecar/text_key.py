"""What the sidecar's caches of per-text work (the embedding blend's vectors, the ranker's
text features) are keyed by: a 16-byte digest, whatever the text's length. Keyed by the text
itself, each cache held every text whole: ~80 KB for one of 20,000 four-byte characters,
~1.6 GB and ~0.8 GB at their bounds (sidecar probe)."""

from __future__ import annotations

import hashlib


def text_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
