"""Agent-tool helpers in InitRunner's shape: remember, recall, list_memories,
learn_procedure and record_episode. Each returns text formatted for a prompt, and never
raises: a failure comes back as a short error line the model can read."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from mnemo.v1 import common_pb2, memory_pb2
from mnemo_client.client import MEMORY_TYPES, TYPE_NAMES, MnemoClient, MnemoError


def _when(m: memory_pb2.Memory) -> str:
    return datetime.fromtimestamp(m.create_time.seconds, tz=UTC).isoformat()


class _BadArgument(Exception):
    """An argument a model got wrong; its message is the error line's reason."""


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise _BadArgument(f"{name} must be a string, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:  # e.g. "\ud83d" from a model's JSON: half an emoji
        raise _BadArgument(f"{name} is not valid Unicode text (a lone surrogate at {err.start})") from None
    return value


def _count(value: object, name: str) -> int:
    """A positive count; a string of digits (models send them) is taken as its number."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise _BadArgument(f"{name} must be an integer, not {type(value).__name__}")
    if value < 1:
        raise _BadArgument(f"{name} must be at least 1")
    return value


Tool = TypeVar("Tool", bound=Callable[..., str])


def _never_raises(what: str) -> Callable[[Tool], Tool]:
    """A tool's answer, or an error line the model can read for whatever went wrong:
    the server's error, an argument of the wrong kind, a closed client."""

    def wrap(tool: Tool) -> Tool:
        @functools.wraps(tool)
        def call(*args: Any, **kwargs: Any) -> str:
            try:
                return tool(*args, **kwargs)
            except MnemoError as err:
                return f"Error: {what} failed ({err.message})"
            except _BadArgument as err:
                return f"Error: {what} failed ({err})"
            except Exception as err:  # the promise to the model: an error line, never a raise
                return f"Error: {what} failed ({type(err).__name__}: {err})"

        return call  # type: ignore[return-value]

    return wrap


class MemoryTools:
    """Bind to a client (and optionally a scope); hand `tool_functions()` to a model."""

    def __init__(self, client: MnemoClient, scope: common_pb2.Scope | None = None):
        self.client = client
        self.scope = scope

    def _store(self, content: str, category: str, mtype: str) -> str:
        try:
            r = self.client.create_memory(
                self.client.new_memory(
                    _text(content, "content"),
                    type=mtype,
                    category=_text(category, "category"),
                    scope=self.scope,
                )
            )
        except (MnemoError, _BadArgument) as err:
            reason = err.message if isinstance(err, MnemoError) else str(err)
            return f"Error: could not store the {mtype} memory ({reason})"
        m = r.memory
        verb = "Already remembered" if r.deduplicated else "Remembered"
        return f"{verb} ({mtype}, id {m.id}, category {m.category})."

    @_never_raises("remember")
    def remember(self, content: str, category: str = "general") -> str:
        """Store a fact or preference (semantic memory)."""
        return self._store(content, category, "semantic")

    @_never_raises("learn_procedure")
    def learn_procedure(self, content: str, category: str = "general") -> str:
        """Store a standing instruction, policy or pattern (procedural memory)."""
        return self._store(content, category, "procedural")

    @_never_raises("record_episode")
    def record_episode(self, content: str, category: str = "general") -> str:
        """Record what happened during a task: outcome, decision, error (episodic memory)."""
        return self._store(content, category, "episodic")

    @_never_raises("recall")
    def recall(self, query: str, top_k: int = 5, memory_types: list[str] | str | None = None) -> str:
        """Search memories; results as blocks separated by ---."""
        if isinstance(memory_types, str):  # one type, as models sometimes send it
            memory_types = [memory_types]
        if memory_types is not None and not isinstance(memory_types, list):
            raise _BadArgument(f"memory_types must be a list of strings, not {type(memory_types).__name__}")
        unknown = [t for t in memory_types or [] if not isinstance(t, str) or t not in MEMORY_TYPES]
        if unknown:
            return f"Error: unknown memory types {unknown}; use {sorted(MEMORY_TYPES)}"
        hits = self.client.recall(
            _text(query, "query"),
            top_k=_count(top_k, "top_k"),
            types=memory_types or (),
            scopes=[self.scope] if self.scope else (),
        )
        if not hits:
            return "No relevant memories found."
        blocks = [
            f"[Type: {TYPE_NAMES[h.memory.type]} | Category: {h.memory.category} | Score: {h.score:.3f} | "
            f"{_when(h.memory)}]\n{h.memory.content}"
            for h in hits
        ]
        return "\n\n---\n\n".join(blocks)

    @_never_raises("listing")
    def list_memories(
        self, category: str | None = None, limit: int = 20, memory_type: str | None = None
    ) -> str:
        """Most recent memories, one line each."""
        if memory_type is not None and (not isinstance(memory_type, str) or memory_type not in MEMORY_TYPES):
            return f"Error: unknown memory type {memory_type!r}; use {sorted(MEMORY_TYPES)}"
        limit = _count(limit, "limit")
        f = memory_pb2.MemoryFilter()
        if category:
            f.categories.append(_text(category, "category"))
        if memory_type:
            f.types.append(MEMORY_TYPES[memory_type])
        if self.scope is not None:
            f.scopes.append(self.scope)
        rows = list(self.client.list_memories(f, page_size=min(limit, 1000), limit=limit))
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
