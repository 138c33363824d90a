"""The snapshot token of a dry-run purge: what the count could see, for the forced purge
that follows it to delete no more than that.

A confirmed `memory clear` bounded its purge by create_time, the only bound a filter has.
A memory stored while the prompt waited but dated before the bound (an import, a server
whose clock is behind the client's) was deleted though never counted nor confirmed. The
token holds the tenant's largest insertion sequence number at the count instead. Numbers
are handed out under the memories write lock, in commit order (store/database.py,
StoredSequence), so every memory stored after the count has a larger one, whatever its
times say.

The text is opaque to callers; its version prefix lets the form change later.
"""

from __future__ import annotations

import re

from mnemo_server.errors import InvalidArgument

_PREFIX = "s1."
_FORM = re.compile(r"s1\.(0|[1-9][0-9]{0,18})")


def snapshot_token(through_seq: int) -> str:
    """The token of a count that saw the memories numbered up to through_seq."""
    return f"{_PREFIX}{through_seq}"


def through_seq(token: str) -> int | None:
    """The largest sequence number a forced purge may delete; None for no token (every
    match). A token that is not one of ours is refused rather than guessed at."""
    if not token:
        return None
    found = _FORM.fullmatch(token)
    if found is None or int(found.group(1)) >= 1 << 63:
        raise InvalidArgument("snapshot_token", "is not a token from a dry-run PurgeMemories")
    return int(found.group(1))
