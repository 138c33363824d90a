"""Refuses learning content that looks like secret material.

Learnings are long-lived and shown to agents, so a key pasted into a fact would leak into
every later run. The check is deliberately blunt: a false positive costs the caller a
rephrase ("the deploy key lives in vault at ..."), a false negative costs a leaked secret.
"""

from __future__ import annotations

import re

from mnemo_server.errors import InvalidArgument

# (what it looks like, pattern). Labels go into error messages; the matched text never does.
# Secrets themselves: never legitimate in any learning.
_LITERALS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a provider API key", re.compile(r"\bsk-[A-Za-z0-9_-]{20,}")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})")),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a private key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
)
# Text that usually carries a secret; a procedure may say how one is wired without it.
_MENTIONS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # A credential-named key followed by ':' or '=' (env files, YAML, JSON, HTTP headers).
    # No word boundary in front, so OPENAI_API_KEY= and x-api-key: match too.
    (
        "a credential assignment",
        re.compile(
            r"(?:api[_-]?key|client[_-]?secret|secret[_-]?token|access[_-]?token|auth[_-]?token"
            r"|private[_-]?key|password|passwd)[\"']?\s*[:=]",
            re.IGNORECASE,
        ),
    ),
    ("a personal access token", re.compile(r"\bpersonal[\s_-]+access[\s_-]+tokens?\b", re.IGNORECASE)),
)


def find_secret_material(text: str, *, mentions: bool = True) -> str | None:
    """A description of the first kind of secret the text appears to hold, or None. With
    `mentions` off only secrets themselves count, not the assignments that usually hold one."""
    for label, pattern in _LITERALS + _MENTIONS if mentions else _LITERALS:
        if pattern.search(text):
            return label
    return None


def refuse_secret_material(field: str, text: str, *, mentions: bool = False) -> None:
    """INVALID_ARGUMENT (SECRET_MATERIAL) naming `field` when `text` appears to hold a secret
    (with `mentions`, also an assignment that usually holds one)."""
    label = find_secret_material(text, mentions=mentions)
    if label is not None:
        raise InvalidArgument(
            field,
            f"looks like it holds secret material ({label}); "
            "record where the secret is kept, never the secret itself",
            reason="SECRET_MATERIAL",
        )
