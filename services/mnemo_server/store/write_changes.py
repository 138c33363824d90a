"""What the open write transaction changes, collected for the in-memory views of the rows.

The row cache (`row_cache`) and each scope's newest ids (`recent_ids`) must never outlive
a change DuckDB has committed. The repositories therefore record every change they make,
inside the transaction, as a plain value of the view's own kind (`row_cache.RowChange`,
`recent_ids.RowsAdded`, ...); `Database.transaction` starts the collection after BEGIN,
ends it once the transaction is over and hands the list to each view, which picks out its
own kinds and applies them before the writer returns.

One transaction at a time per thread, so the collection is thread-local. A change recorded
outside a transaction would never reach the views: that is a bug, and it raises.
"""

from __future__ import annotations

import threading

_pending = threading.local()


def begin() -> None:
    """Start collecting this thread's changes (its transaction began)."""
    _pending.changes = []


def end() -> list[object]:
    """The changes recorded since `begin`, in order; collection stops."""
    changes: list[object] = getattr(_pending, "changes", None) or []
    _pending.changes = None
    return changes


def collected() -> list[object]:
    """The changes recorded so far in the open transaction (collection goes on)."""
    return list(getattr(_pending, "changes", None) or [])


def record(change: object) -> None:
    """Record a change the open transaction on this thread makes."""
    changes: list[object] | None = getattr(_pending, "changes", None)
    if changes is None:
        raise RuntimeError("memory rows changed outside Database.transaction(): cached views would go stale")
    changes.append(change)
