"""Domain objects as JSON and back, for idempotency records that keep a write's answer.

A retried write returns its first result (README): the state change's answer as it left the
object, not the object as it is at the retry. Records that kept only ids answered a retried
RevokeSkill with the skill ACTIVE again after a rollback, a retried AdvanceSkill with a
later stage (probe). The domain types are frozen dataclasses of strings, numbers, StrEnums,
tuples and nested dataclasses, which this round-trips by their type hints."""

from __future__ import annotations

import dataclasses
import types
import typing
from enum import Enum
from typing import Any, TypeVar

T = TypeVar("T")


def dump(obj: Any) -> dict[str, Any]:
    """A frozen dataclass as a JSON-ready dict (enums as their values, tuples as lists)."""
    out: dict[str, Any] = dataclasses.asdict(obj)
    return out


def load(cls: type[T], data: dict[str, Any]) -> T:
    """The dataclass `cls` from what dump gave; fields missing from `data` keep defaults."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    values = {f.name: _value(hints[f.name], data[f.name]) for f in fields if f.name in data}
    return cls(**values)


def _value(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):  # X | None
        [inner] = [a for a in typing.get_args(hint) if a is not type(None)]
        return _value(inner, value)
    if origin is tuple:
        return tuple(_value(typing.get_args(hint)[0], v) for v in value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return load(hint, value)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint(value)
    return value
