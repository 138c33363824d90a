"""Agent-tool helpers in InitRunner's shape: remember, recall, list_memories,
learn_procedure and record_episode. Each returns text formatted for a prompt, and never
raises: a failure comes back as a short error line the model can read."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from mnemo.v1 import common_pb2, memory_pb2
from mnemo_client.client import MEMORY_TYPES, TYPE_NAMES, MnemoClient, MnemoError


def _when(m: memory_pb2.Memory) -> str:
    return datetime.fromtimestamp(m.create_time.seconds, tz=UTC).isoformat()


class MemoryTools:
    """Bind to a client (and optionally a scope); hand `tool_functions()` to a model."""

    def __init__(self, client: MnemoClient, scope: common_pb2.Scope | None = None):
        self.client = client
        self.scope = scope

    def _store(self, content: str, category: str, mtype: str) -> str:
        try:
            r = self.client.create_memory(
                self.client.new_memory(content, type=mtype, category=category, scope=self.scope)
            )
        except MnemoError as err:
            return f"Error: could not store the {mtype} memory ({err.message})"
        m = r.memory
        verb = "Already remembered" if r.deduplicated else "Remembered"
        return f"{verb} ({mtype}, id {m.id}, category {m.category})."

    def remember(self, content: str, category: str = "general") -> str:
        """Store a fact or preference (semantic memory)."""
        return self._store(content, category, "semantic")

    def learn_procedure(self, content: str, category: str = "general") -> str:
        """Store a standing instruction, policy or pattern (procedural memory)."""
        return self._store(content, category, "procedural")

    def record_episode(self, content: str, category: str = "general") -> str:
        """Record what happened during a task: outcome, decision, error (episodic memory)."""
        return self._store(content, category, "episodic")

    def recall(self, query: str, top_k: int = 5, memory_types: list[str] | None = None) -> str:
        """Search memories; results as blocks separated by ---."""
        unknown = [t for t in memory_types or [] if t not in MEMORY_TYPES]
        if unknown:
            return f"Error: unknown memory types {unknown}; use {sorted(MEMORY_TYPES)}"
        try:
            hits = self.client.recall(
                query, top_k=top_k, types=memory_types or (), scopes=[self.scope] if self.scope else ()
            )
        except MnemoError as err:
            return f"Error: recall failed ({err.message})"
        if not hits:
            return "No relevant memories found."
        blocks = [
            f"[Type: {TYPE_NAMES[h.memory.type]} | Category: {h.memory.category} | Score: {h.score:.3f} | "
            f"{_when(h.memory)}]\n{h.memory.content}"
            for h in hits
        ]
        return "\n\n---\n\n".join(blocks)

    def list_memories(
        self, category: str | None = None, limit: int = 20, memory_type: str | None = None
    ) -> str:
        """Most recent memories, one line each."""
        if memory_type is not None and memory_type not in MEMORY_TYPES:
            return f"Error: unknown memory type {memory_type!r}; use {sorted(MEMORY_TYPES)}"
        f = memory_pb2.MemoryFilter()
        if category:
            f.categories.append(category)
        if memory_type:
            f.types.append(MEMORY_TYPES[memory_type])
        if self.scope is not None:
            f.scopes.append(self.scope)
        try:
            rows = list(self.client.list_memories(f, page_size=min(max(limit, 1), 1000), limit=limit))
        except MnemoError as err:
            return f"Error: listing failed ({err.message})"
        if not rows:
            return "No memories stored."
        return "\n".join(f"[{TYPE_NAMES[m.type]}:{m.category}] ({_when(m)}) {m.content}" for m in rows)

    def tool_functions(self) -> dict[str, Callable[..., str]]:
        return {
            "remember": self.remember,
            "recall": self.recall,
            "list_memories": self.list_memories,
            "learn_procedure": self.learn_procedure,
            "record_episode": self.record_episode,
        }

    @staticmethod
    def tool_schemas() -> list[dict[str, Any]]:
        """JSON-schema tool definitions (OpenAI-style function calling)."""
        text = {"type": "string"}
        cat = {"type": "string", "default": "general"}
        types = {"type": "array", "items": {"type": "string", "enum": sorted(MEMORY_TYPES)}}

        def fn(name: str, doc: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
            return {
                "type": "function",
                "function": {
                    "name": name,
                    "description": doc,
                    "parameters": {"type": "object", "properties": props, "required": required},
                },
            }

        return [
            fn(
                "remember",
                "Store a fact or preference for later.",
                {"content": text, "category": cat},
                ["content"],
            ),
            fn(
                "recall",
                "Search long-term memory.",
                {"query": text, "top_k": {"type": "integer", "default": 5}, "memory_types": types},
                ["query"],
            ),
            fn(
                "list_memories",
                "List recent memories.",
                {
                    "category": text,
                    "limit": {"type": "integer", "default": 20},
                    "memory_type": {"type": "string", "enum": sorted(MEMORY_TYPES)},
                },
                [],
            ),
            fn(
                "learn_procedure",
                "Store a standing instruction or policy.",
                {"content": text, "category": cat},
                ["content"],
            ),
            fn(
                "record_episode",
                "Record what happened during a task.",
                {"content": text, "category": cat},
                ["content"],
            ),
        ]
