"""Values written into SQL text, for writes a transaction sends together with the statement
after them (`TransactionCursor.defer`).

DuckDB binds parameters to the last statement of a text only, so the statements that go
ahead of another in one call must carry their values in the text. Each value is rendered so
that DuckDB stores what it would store from the same value as a parameter: a string between
single quotes with its quotes doubled (DuckDB's strings have no other escape; a NUL is kept),
a float through a string cast (DuckDB's own correctly rounded parse, not a DECIMAL literal
rounded twice on its way into a FLOAT column), an int, a bool, NULL. Anything else is not
rendered: such a write runs on its own, with parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def literal(value: Any) -> str | None:
    """`value` as an SQL literal, or None when it has no rendering here."""
    if value is None:
        return "NULL"
    if value is True:
        return "TRUE"
    if value is False:
        return "FALSE"
    kind = type(value)  # exactly: a subclass (an enum) may render otherwise than its base
    if kind is int:
        return str(value)
    if kind is float:
        return f"'{value!r}'::DOUBLE"
    if kind is str:
        text: str = value
        return "'" + text.replace("'", "''") + "'"
    return None


def insert_text(table: str, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str | None:
    """One INSERT of `rows` (dicts with `columns`) with their values in the text, or None when
    one of them has no literal."""
    tuples = []
    for row in rows:
        values = [literal(row[c]) for c in columns]
        if None in values:
            return None
        tuples.append("(" + ", ".join(values) + ")")  # type: ignore[arg-type]  # no None here
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join(tuples)}"
