"""The part of a text a transformer can read, cut before tokenising.

The embedding blend's MiniLM and the cross-encoders read at most their max_length tokens of
a text and drop the rest, but their tokenizers go through the whole text first: for texts
near inference.max_text_chars (20,000) that was most of the work of a Rerank of long texts
(16 such texts: 130 ms of tokenising for 256 tokens each, against 22 ms for their first
2,560 characters), none of it interruptible by the deadline.

The cut cannot change what a model reads. It falls on a space, tab or line break (which every
tokenizer served here splits words at: BERT's WordPiece, SentencePiece's Metaspace, byte-level
BPE), so the cut text's tokens are the first tokens of the whole text; and it keeps `words`
words that hold an ASCII letter or digit, each at least one token whatever the tokenizer makes
of it (normalisers drop control characters and accents, never letters or digits). Given at
least as many words as the model reads tokens, the tokens it reads are those of the whole
text. A text without that many such words (runs of spaces, symbols, one 20,000-character
"word") is left whole rather than guessed at.
"""

from __future__ import annotations

import itertools
import re

# A word holding an ASCII letter or digit: from the first such character to the next space,
# tab or line break (one match per word, found in one pass without backtracking).
_WORD = re.compile(r"[A-Za-z0-9][^ \t\n\r]*")


def readable_prefix(text: str, words: int) -> str:
    """`text` up to the end of its `words`-th word holding an ASCII letter or digit (whole if it
    holds fewer): all a model reading at most `words` tokens of it can see."""
    for last in itertools.islice(_WORD.finditer(text), words - 1, words):
        return text[: last.end()]
    return text
