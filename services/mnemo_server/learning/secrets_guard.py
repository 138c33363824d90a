"""Refuses learning content that looks like secret material.

Learnings are long-lived and shown to agents, so a key pasted into a fact would leak into
every later run. The check is deliberately blunt: a false positive costs the caller a
rephrase ("the deploy key lives in vault at ..."), a false negative costs a leaked secret.
"""

from __future__ import annotations

import re
import unicodedata

from mnemo_server.errors import InvalidArgument

# (what it looks like, pattern). Labels go into error messages; the matched text never does.
# Secrets themselves: never legitimate in any learning.
_LITERALS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a provider API key", re.compile(r"\bsk-[A-Za-z0-9_-]{20,}")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})")),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a Stripe key", re.compile(r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}")),
    ("a Slack token", re.compile(r"\bxox[abeoprs]-[A-Za-z0-9-]{10,}")),
    ("a JSON web token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    # PGP's armour ends in "PRIVATE KEY BLOCK-----" (probe: one was promoted to a skill).
    ("a private key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
    # The credential itself, not a placeholder: "Bearer $TOKEN" or "Bearer <token>" pass.
    (
        "an authorization header",
        re.compile(r"\bauthorization\s*:\s*(?:bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE),
    ),
)
# Text that usually carries a secret; a procedure may say how one is wired without it.
_MENTIONS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # A credential-named key followed by ':' or '=' (env files, YAML, JSON, HTTP headers).
    # No word boundary in front, so OPENAI_API_KEY=, GITHUB_TOKEN= and x-api-key: match too;
    # "secret" covers SECRET_KEY= and aws_secret_access_key: (probe: both were stored).
    (
        "a credential assignment",
        re.compile(
            r"(?:api[_-]?key|client[_-]?secret|secret(?:[_-]?(?:access[_-]?)?key)?|token"
            r"|private[_-]?key|password|passwd|passphrase|pwd)[\"']?\s*[:=]",
            re.IGNORECASE,
        ),
    ),
    ("a personal access token", re.compile(r"\bpersonal[\s_-]+access[\s_-]+tokens?\b", re.IGNORECASE)),
)


def _as_scanned(text: str) -> str:
    """Fullwidth and other compatibility forms folded (NFKC) and invisible format characters
    dropped: "pass\u200bword:" or a fullwidth colon got past the patterns (probe)."""
    folded = unicodedata.normalize("NFKC", text)
    return "".join(ch for ch in folded if unicodedata.category(ch) != "Cf")


def find_secret_material(text: str, *, mentions: bool = True) -> str | None:
    """A description of the first kind of secret the text appears to hold, or None. With
    `mentions` off only secrets themselves count, not the assignments that usually hold one."""
    scanned = _as_scanned(text)
    for label, pattern in _LITERALS + _MENTIONS if mentions else _LITERALS:
        if pattern.search(scanned):
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
