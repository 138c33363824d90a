"""Packing the session-start bundle into the caller's token budget: best first; an item
that does not fit is dropped (a smaller, less valuable one may still fit after it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mnemo_server.memory.model import Memory

CHARS_PER_TOKEN = 4
# "- [type:category] " and the newline, roughly.
LINE_OVERHEAD_TOKENS = 6


def estimate_tokens(m: Memory) -> int:
    return -(-len(m.content) // CHARS_PER_TOKEN) + LINE_OVERHEAD_TOKENS


@dataclass(frozen=True)
class Packed:
    chosen: list[int]  # indexes into the ordered input, in order
    tokens: list[int]
    tokens_used: int
    dropped: int


def pack(ordered: Sequence[Memory], budget: int, max_items: int) -> Packed:
    chosen: list[int] = []
    tokens: list[int] = []
    used = 0
    for i, m in enumerate(ordered):
        if len(chosen) >= max_items:
            break
        t = estimate_tokens(m)
        if used + t <= budget:
            chosen.append(i)
            tokens.append(t)
            used += t
    return Packed(chosen, tokens, used, len(ordered) - len(chosen))


def render(memories: Sequence[Memory]) -> str:
    if not memories:
        return ""
    lines = ["## Relevant memories"]
    lines.extend(f"- [{m.type.value}:{m.category}] {m.content}" for m in memories)
    return "\n".join(lines)
